//! The `runtime` binary: options, output formats and one-line errors.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Relative perplexity difference allowed against transformers: measured agreement is
/// ~1e-7 (f32 rounding in a different order), this leaves 100x margin.
const PPL_TOLERANCE: f64 = 1e-5;

fn runtime(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(args)
        .output()
        .unwrap()
}

fn artifact_dir() -> Option<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/smollm2-135m-instruct");
    if dir.join("model.mpk").exists() {
        return Some(dir.to_string_lossy().into_owned());
    }
    assert!(
        std::env::var_os("REQUIRE_MODEL").is_none(),
        "no converted model in {}",
        dir.display()
    );
    None
}

/// A greedy run of `prompt` on the real artifact, with `extra` options.
fn greedy(dir: &str, prompt: &str, max_new_tokens: &str, extra: &[&str]) -> Output {
    let mut extra = extra.to_vec();
    extra.extend(["--temperature", "0"]);
    generate(dir, prompt, max_new_tokens, &extra)
}

/// A run of `prompt` on the real artifact with `extra` options (sampled unless they say
/// otherwise).
fn generate(dir: &str, prompt: &str, max_new_tokens: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--artifacts", dir, "--prompt", prompt];
    args.extend(["--max-new-tokens", max_new_tokens]);
    args.extend(extra);
    runtime(&args)
}

/// Exit code 1 or 2 (clap's usage errors), one `error:` line naming `expected`, no panic.
fn assert_one_line_error(out: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(expected),
        "{:?} does not name {expected:?}",
        errors[0]
    );
}

#[test]
fn missing_artifact_is_one_error_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_string_lossy().into_owned();
    let out = runtime(&["--prompt", "hi", "--artifacts", &dir]);
    assert_one_line_error(&out, "no manifest.json");
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn invalid_option_values_are_refused() {
    for (args, expected) in [
        (vec!["--prompt", "hi", "--top-p", "1.5"], "top-p 1.5"),
        (vec!["--prompt", "hi", "--temperature=-1"], "temperature -1"),
        (
            vec!["--prompt", "hi", "--max-new-tokens", "0"],
            "max-new-tokens",
        ),
        (vec!["--prompt", "hi", "--backend", "gpu"], "gpu"),
        (vec!["--prompt", "hi", "--weights", "f16"], "f16"),
        (
            vec![
                "--prompt",
                "hi",
                "--weights",
                "bf16",
                "--backend",
                "ndarray",
            ],
            "--weights bf16 needs the flex backend",
        ),
        (vec!["--max-new-tokens", "3"], "--prompt"),
    ] {
        assert_one_line_error(&runtime(&args), expected);
    }
}

/// A mistyped `RUNTIME_CPU` is one error naming it (not ignored, which would leave a
/// bench's figures labelled with a tier that did not run); a known tier runs.
#[test]
fn an_unknown_cpu_tier_is_refused() {
    let runtime_args = ["--prompt", "hi", "--artifacts", "/nonexistent"];
    let bench_args = ["--artifacts", "/nonexistent"];
    for (bin, args) in [
        (env!("CARGO_BIN_EXE_runtime"), &runtime_args[..]),
        (env!("CARGO_BIN_EXE_bench"), &bench_args[..]),
    ] {
        let out = Command::new(bin)
            .args(args)
            .env("RUNTIME_CPU", "avx3")
            .output()
            .unwrap();
        assert_one_line_error(&out, "RUNTIME_CPU: unknown CPU tier `avx3`");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(["--prompt", "hi", "--artifacts", "/nonexistent"])
        .env("RUNTIME_CPU", "avx2")
        .output()
        .unwrap();
    assert_one_line_error(&out, "no manifest.json");
}

#[test]
fn json_output_has_every_field() {
    let Some(dir) = artifact_dir() else { return };
    let out = greedy(&dir, "What is 2+2?", "8", &["--chat", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["prompt_tokens"], 37); // golden.json's chat prompt ids for this prompt
    assert_eq!(v["generated_tokens"], v["tokens"].as_array().unwrap().len());
    assert!(v["text"].is_string());
    assert!(["eos", "stop", "length"].contains(&v["stop_reason"].as_str().unwrap()));
    for key in ["load_s", "prefill_tokens_per_s", "decode_tokens_per_s"] {
        assert!(v["timings"][key].as_f64().unwrap() > 0.0, "{key}");
    }
}

#[test]
fn text_output_streams_and_reports_timings() {
    let Some(dir) = artifact_dir() else { return };
    let out = greedy(&dir, "The capital of France is", "3", &[]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), " Paris.\n\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prompt 5 tokens") && stderr.contains("generated 3 tokens"),
        "{stderr}"
    );
}

#[test]
fn bad_prompts_are_refused() {
    let Some(dir) = artifact_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let long = tmp.path().join("long.txt");
    std::fs::write(&long, "word ".repeat(9000)).unwrap();
    let invalid = tmp.path().join("invalid.txt");
    std::fs::write(&invalid, b"caf\xe9").unwrap();
    for (args, expected) in [
        (vec!["--prompt", ""], "the prompt is empty"),
        (
            vec!["--prompt-file", long.to_str().unwrap()],
            "context holds 8192",
        ),
        (
            vec!["--prompt-file", invalid.to_str().unwrap()],
            "not valid UTF-8",
        ),
    ] {
        let mut all = vec!["--artifacts", dir.as_str()];
        all.extend(args);
        assert_one_line_error(&runtime(&all), expected);
    }
}

/// `--stop "\n\n"` as typed in a shell (a backslash and an n) ends at the blank line.
#[test]
fn stop_escape_ends_generation_at_a_blank_line() {
    let Some(dir) = artifact_dir() else { return };
    // Greedy text is " Paris.\n\nThe answer is: ..." (golden.json).
    let out = greedy(&dir, "The capital of France is", "40", &["--stop", r"\n\n"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), " Paris.\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stop: stop"), "{stderr}");
}

/// Sampling with the command line's defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05):
/// the same seed gives the same tokens, another seed others.
#[test]
fn default_sampling_is_reproducible_by_seed() {
    let Some(dir) = artifact_dir() else { return };
    let sample = |seed: &str| {
        let out = runtime(&[
            "--artifacts",
            &dir,
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            "24",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].clone()
    };
    assert_eq!(sample("7"), sample("7"));
    assert_ne!(sample("7"), sample("8"));
}

/// `runtime perplexity` on the first 2048 tokens of ppl_text.txt, tokenized by the runtime
/// itself, against transformers fed the same ids (golden.json's `perplexity_tokenizers`).
#[test]
fn perplexity_command_matches_transformers() {
    let Some(dir) = artifact_dir() else { return };
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../runtime/tests/data/ppl_text.txt"
    );
    let out = runtime(&[
        "perplexity",
        "--artifacts",
        &dir,
        "--file",
        file,
        "--max-tokens",
        "2048",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../../runtime/tests/data/golden.json")).unwrap();
    let golden = &golden["perplexity_tokenizers"];
    assert_eq!(ours["tokens"], golden["tokens"]);
    let (ours, golden) = (
        ours["ppl"].as_f64().unwrap(),
        golden["ppl"].as_f64().unwrap(),
    );
    let relative = (ours / golden - 1.0).abs();
    eprintln!("perplexity {ours} vs transformers {golden}: relative {relative:.2e}");
    assert!(relative < PPL_TOLERANCE, "{ours} vs {golden}");
}

/// `--weights`: the default and f32 give the same ids (the library test holds the logits
/// to the bit); bf16 on the bf16-sourced artifact rounds nothing, so no note. `--mmap` (the
/// weights file mapped) and `--no-mmap` (read into memory) give the same ids too; both at
/// once are refused.
#[test]
fn weights_options_give_the_same_text() {
    let Some(dir) = artifact_dir() else { return };
    let ids = |options: &[&str]| {
        let out = greedy(
            &dir,
            "Once upon a time",
            "24",
            &[&["--json"], options].concat(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].clone()
    };
    let auto = ids(&["--weights", "auto"]);
    assert_eq!(auto, ids(&["--weights", "f32"]));
    assert_eq!(auto, ids(&["--weights", "bf16"]));
    assert_eq!(auto, ids(&["--no-mmap"]));
    assert_eq!(auto, ids(&["--mmap"]));
    let both = greedy(&dir, "Once upon a time", "4", &["--mmap", "--no-mmap"]);
    assert!(!both.status.success());
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// Every KV cache type generates (the same greedy text here, where no step is close), and
/// an unknown one is one error line naming the choices.
#[test]
fn kv_cache_option() {
    let Some(dir) = artifact_dir() else { return };
    let run = |kv: &str| {
        greedy(
            &dir,
            "Once upon a time",
            "24",
            &["--json", "--kv-cache", kv],
        )
    };
    let tokens = |kv: &str| {
        let out = run(kv);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].clone()
    };
    let f32 = tokens("f32");
    assert_eq!(f32, tokens("f16"));
    assert_eq!(f32, tokens("bf16"));
    assert_one_line_error(&run("f8"), "\"f8\" is not one of f32, f16, bf16");
}

/// `runtime chat`: turns answered in order with the history (the cache kept between them),
/// `/reset` starting over (the same question then gets the first answer again), `/exit`.
#[test]
fn chat_repl_keeps_the_conversation() {
    let Some(dir) = artifact_dir() else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args([
            "chat",
            "--artifacts",
            &dir,
            "--temperature",
            "0",
            "--max-new-tokens",
            "20",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let input = "What is the capital of France?\nAnd of Germany?\n/reset\nWhat is the capital of France?\n/exit\nnever read\n";
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<&str> = stdout
        .split("> ")
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    let single = greedy(
        &dir,
        "What is the capital of France?",
        "20",
        &["--chat", "--json"],
    );
    let single: serde_json::Value = serde_json::from_slice(&single.stdout).unwrap();
    let shown = format!("stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(answers.len(), 3, "{shown}");
    assert_eq!(
        answers[0],
        single["text"].as_str().unwrap().trim(),
        "{shown}"
    );
    assert!(answers[1].contains("Berlin"), "{shown}");
    assert_eq!(answers[2], answers[0], "{shown}");
}

/// The chat REPL keeps answering once the file it was started from is gone (a rebuild or an
/// upgrade during a conversation; here a link to the binary, removed as soon as it runs):
/// each turn renders the template in a child of the running program, not of whatever now
/// has its path. With the path, every turn was an error and the REPL went on ("> > ").
#[test]
fn chat_repl_survives_its_program_file_being_replaced() {
    let Some(dir) = artifact_dir() else { return };
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = tmp.path().join("runtime");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_runtime"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_runtime"), &exe).unwrap();
    }
    let mut child = Command::new(&exe)
        .args(["chat", "--artifacts", &dir, "--temperature", "0"])
        .args(["--max-new-tokens", "8"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `spawn` returns once the program is running.
    std::fs::remove_file(&exe).unwrap();
    let input = "What is the capital of France?\nAnd of Germany?\n/exit\n";
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let answers = stdout.split("> ").filter(|a| !a.trim().is_empty()).count();
    assert_eq!(answers, 2, "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stderr.contains("error:"), "{stderr}");
}

/// Runs `command` (stdout and stderr piped) for at most `limit`; `None` if it was still
/// running then (it is killed).
fn output_within(command: &mut Command, limit: std::time::Duration) -> Option<Output> {
    use std::process::Stdio;
    let mut child = (command.stdin(Stdio::null()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// One more thread than cores is refused by every command that takes `--threads` (one
/// check, at parsing), `serve` included, before it binds a port or reads the artifact;
/// the bench too.
#[test]
fn threads_beyond_the_cores_are_refused_by_every_command() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let (too_many, tmp) = ((cores + 1).to_string(), tempfile::tempdir().unwrap());
    let (dir, text) = (tmp.path().to_str().unwrap(), tmp.path().join("text.txt"));
    std::fs::write(&text, "some text").unwrap();
    let expected = format!("--threads {too_many} is more than the {cores} cores");
    let runtime_bin = env!("CARGO_BIN_EXE_runtime");
    for (bin, args) in [
        (runtime_bin, vec!["--prompt", "hi"]),
        (
            runtime_bin,
            vec!["perplexity", "--file", text.to_str().unwrap()],
        ),
        (runtime_bin, vec!["chat"]),
        (runtime_bin, vec!["serve", "--port", "0"]),
        (env!("CARGO_BIN_EXE_bench"), vec!["--threads", "1"]),
    ] {
        let mut command = Command::new(bin);
        command
            .args(&args)
            .args(["--artifacts", dir, "--threads", &too_many]);
        let limit = std::time::Duration::from_secs(60);
        let out = output_within(&mut command, limit).unwrap_or_else(|| {
            panic!("{args:?} --threads {too_many} still running after {limit:?}")
        });
        assert_one_line_error(&out, &expected);
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// A temperature far below any gap between logits (here a subnormal f32, 1e-40) samples
/// the most likely token every time: the greedy text, whatever the filters.
#[test]
fn a_tiny_temperature_gives_the_greedy_text() {
    let Some(dir) = artifact_dir() else { return };
    let tokens = |temperature: &str| {
        let out = runtime(&[
            "--artifacts",
            &dir,
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            "24",
            "--temperature",
            temperature,
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].clone()
    };
    let greedy = tokens("0");
    assert_eq!(tokens("1e-40"), greedy);
    assert_eq!(tokens("1e-45"), greedy);
}

/// A copy of the real artifact (files linked, config.json with each `(from, to)` of
/// `edits` replaced) in a new temporary directory. The manifest checks file sizes, so each
/// edit keeps the length.
fn artifact_with_config(dir: &str, edits: &[(&str, &str)]) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if name != "config.json" {
            std::os::unix::fs::symlink(&path, copy.path().join(name)).unwrap();
        }
    }
    let mut config = std::fs::read_to_string(PathBuf::from(dir).join("config.json")).unwrap();
    for (from, to) in edits {
        assert!(config.contains(from) && from.len() == to.len(), "{from:?}");
        config = config.replace(from, to);
    }
    std::fs::write(copy.path().join("config.json"), config).unwrap();
    copy
}

/// config.json and the weights (weights.bin, or model.mpk, whose size bounds the parameter
/// count) disagreeing on the parameters is one error line naming them,
/// before any token is generated: a layer fewer in config.json (the record's last layer
/// would otherwise go unread: the regression of issue 25), a layer more, and a layer fewer
/// with biases the record lacks (both sides named).
#[test]
fn a_config_that_disagrees_with_the_record_is_refused() {
    let Some(dir) = artifact_dir() else { return };
    let (layers, fewer, more) = (
        r#""num_hidden_layers": 30"#,
        r#""num_hidden_layers": 29"#,
        r#""num_hidden_layers": 31"#,
    );
    let biases = (r#""attention_bias": false"#, r#""attention_bias": true "#);
    for (edits, expected) in [
        (
            vec![(layers, fewer)],
            "weights.bin holds 9 parameters config.json does not declare (layers.29.",
        ),
        (vec![(layers, more)], "config.json and model.mpk disagree"),
        (
            vec![(layers, fewer), biases],
            "; config.json declares 116 parameters weights.bin lacks (layers.0.self_attn.q_proj.bias",
        ),
    ] {
        let copy = artifact_with_config(&dir, &edits);
        let out = greedy(
            copy.path().to_str().unwrap(),
            "The capital of France is",
            "1",
            &[],
        );
        assert_one_line_error(&out, expected);
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// The generated token ids of a `--json` run that must succeed.
fn tokens_of(out: &Output) -> Vec<u64> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["tokens"].as_array().unwrap().iter())
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// `--json-schema` and `--grammar` constrain what the CLI generates: a finished answer is
/// JSON valid against the schema (checked by the `jsonschema` crate), and a Lark grammar's
/// answer is one it accepts, greedy and sampled.
#[test]
fn json_schema_and_grammar_constrain_the_answer() {
    let Some(dir) = artifact_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
        "required": ["city", "population"], "additionalProperties": false});
    let schema_file = tmp.path().join("city.json");
    std::fs::write(&schema_file, schema.to_string()).unwrap();
    let schema_path = schema_file.to_str().unwrap();
    for sampling in [
        &["--temperature", "0"][..],
        &["--temperature", "0.8", "--seed", "7"],
    ] {
        let mut extra = vec!["--chat", "--json", "--json-schema", schema_path];
        extra.extend(sampling);
        let out = generate(&dir, "Describe Paris as JSON.", "80", &extra);
        tokens_of(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_ne!(v["stop_reason"], "length", "{v}");
        let answer: serde_json::Value = serde_json::from_str(v["text"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{sampling:?}: not JSON ({e}): {v}"));
        assert!(
            jsonschema::is_valid(&schema, &answer),
            "{sampling:?}: {answer}"
        );
    }
    let grammar_file = tmp.path().join("yes_no.lark");
    std::fs::write(&grammar_file, "start: \"yes\" | \"no\"\n").unwrap();
    for sampling in [
        &["--temperature", "0"][..],
        &["--temperature", "1.0", "--seed", "3"],
    ] {
        let mut extra = vec![
            "--chat",
            "--json",
            "--grammar",
            grammar_file.to_str().unwrap(),
        ];
        extra.extend(sampling);
        let out = generate(&dir, "Is Paris in France?", "10", &extra);
        tokens_of(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = v["text"].as_str().unwrap();
        assert!(["yes", "no"].contains(&text), "{sampling:?}: {text:?}");
    }
}

/// `--logit-bias ID=-100` bans the token greedy decoding chose first; `ID=100` forces one.
#[test]
fn logit_bias_bans_and_forces_tokens() {
    let Some(dir) = artifact_dir() else { return };
    let prompt = "The capital of France is";
    let plain = tokens_of(&greedy(&dir, prompt, "4", &["--json"]));
    let banned = format!("{}=-100", plain[0]);
    let without = tokens_of(&greedy(
        &dir,
        prompt,
        "4",
        &["--json", "--logit-bias", &banned],
    ));
    assert_ne!(without[0], plain[0], "{without:?}");
    assert!(!without.contains(&plain[0]), "{without:?}");
    // Token 1234, an ordinary one: at +100 every step picks it.
    let forced = tokens_of(&greedy(
        &dir,
        prompt,
        "4",
        &["--json", "--logit-bias", "1234=100"],
    ));
    assert_eq!(forced, [1234; 4]);
}

/// `--matmul`: on bf16 weights `auto` and `exact` give the same tokens, `int8` too with a
/// note that it changes nothing (no weight is kept as blocks), and `bf16` runs.
#[test]
fn matmul_modes_on_bf16_weights() {
    let Some(dir) = artifact_dir() else { return };
    let prompt = "Once upon a time";
    let auto = tokens_of(&greedy(&dir, prompt, "12", &["--json"]));
    let exact = tokens_of(&greedy(
        &dir,
        prompt,
        "12",
        &["--json", "--matmul", "exact"],
    ));
    assert_eq!(auto, exact);
    let int8 = greedy(&dir, prompt, "12", &["--json", "--matmul", "int8"]);
    assert_eq!(tokens_of(&int8), exact);
    let note = String::from_utf8_lossy(&int8.stderr);
    assert!(
        note.contains("--matmul int8 changes nothing here"),
        "{note}"
    );
    let bf16 = tokens_of(&greedy(&dir, prompt, "12", &["--json", "--matmul", "bf16"]));
    assert_eq!(bf16.len(), 12);
}
