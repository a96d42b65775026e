//! The malformed-input corpus: broken and hostile files for every input the converter
//! reads (GGUF, safetensors, config.json, tokenizer.json, an artifact to verify or load).
//!
//! Every case runs the real binary with its address space capped at 1 GiB (the inputs are
//! a few KB, so a parser that believes a header claiming terabytes is stopped) and must
//! fail with one `error:` line naming the problem, a non-zero exit, no panic, and nothing
//! left in the output directory. Prompt and option cases for the runtime are in
//! `runtime/tests/cli.rs`; crashes the fuzzers find (`fuzz/`) are added here.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use runtime::FlexBackend;
use runtime::text::chat::cap_address_space;
use runtime::weights::artifact::load_model;
use safetensors::Dtype;
use serde_json::json;

/// Address-space cap for the converter under test.
const MEMORY_CAP: u64 = 1 << 30;

/// One malformed input: `setup` writes it under the temp dir and returns the converter's
/// arguments; the error line must contain `expected`.
struct Case {
    name: &'static str,
    expected: &'static str,
    setup: fn(&Path) -> Vec<PathOrStr>,
}

enum PathOrStr {
    Path(PathBuf),
    Str(&'static str),
}

use PathOrStr::{Path as P, Str as S};

fn run_capped(args: &[PathOrStr]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_converter"));
    for arg in args {
        match arg {
            P(p) => command.arg(p),
            S(s) => command.arg(s),
        };
    }
    cap_address_space(&mut command, MEMORY_CAP);
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---- GGUF (`import-gguf`) ----

fn gguf_case(dir: &Path, bytes: Vec<u8>) -> Vec<PathOrStr> {
    let path = dir.join("m.gguf");
    std::fs::write(&path, bytes).unwrap();
    vec![S("import-gguf"), P(path), P(dir.join("out"))]
}

/// A GGUF header with no tensors and no metadata, followed by `rest`.
fn gguf_header(version: u32, n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(n_tensors.to_le_bytes());
    out.extend(n_kv.to_le_bytes());
    out.extend(rest);
    out.resize(out.len().max(256), 0);
    out
}

/// The tiny GGUF plus one tensor info with the given dims, type and offset (no data).
fn gguf_with_tensor(dims: &[u64], type_id: u32, offset: u64) -> Vec<u8> {
    tiny_gguf()
        .tensor_info("blk.0.attn_k.weight", dims, type_id, offset)
        .build()
}

const CASES: &[Case] = &[
    Case {
        name: "gguf: empty file",
        expected: "shorter than the GGUF magic",
        setup: |d| gguf_case(d, vec![]),
    },
    Case {
        name: "gguf: bad magic",
        expected: "bad magic",
        setup: |d| {
            let mut bytes = tiny_gguf().build();
            bytes[..4].copy_from_slice(b"GGML");
            gguf_case(d, bytes)
        },
    },
    Case {
        name: "gguf: unsupported version",
        expected: "unsupported GGUF version 7",
        setup: |d| gguf_case(d, gguf_header(7, 0, 0, &[])),
    },
    Case {
        name: "gguf: header cut inside the counts",
        expected: "not a valid GGUF file",
        setup: |d| gguf_case(d, tiny_gguf().build()[..14].to_vec()),
    },
    Case {
        name: "gguf: header cut inside the metadata",
        expected: "truncated",
        setup: |d| gguf_case(d, tiny_gguf().build()[..300].to_vec()),
    },
    Case {
        name: "gguf: tensor count claims 2^60",
        expected: "more than the file can hold",
        setup: |d| gguf_case(d, gguf_header(3, 1 << 60, 0, &[])),
    },
    Case {
        name: "gguf: metadata count claims 2^60",
        expected: "more than the file can hold",
        setup: |d| gguf_case(d, gguf_header(3, 0, 1 << 60, &[])),
    },
    Case {
        name: "gguf: key length claims a terabyte",
        expected: "metadata key",
        setup: |d| gguf_case(d, gguf_header(3, 0, 1, &(1u64 << 40).to_le_bytes())),
    },
    Case {
        name: "gguf: string value length claims a terabyte",
        expected: "general.name",
        setup: |d| {
            let bytes = tiny_gguf()
                .raw("general.name", 8, &(1u64 << 40).to_le_bytes())
                .build();
            gguf_case(d, bytes)
        },
    },
    Case {
        name: "gguf: array length claims 2^50 elements",
        expected: "general.tags",
        setup: |d| {
            let mut value = 4u32.to_le_bytes().to_vec(); // array of u32
            value.extend((1u64 << 50).to_le_bytes());
            gguf_case(d, tiny_gguf().raw("general.tags", 9, &value).build())
        },
    },
    Case {
        name: "gguf: unknown metadata value type",
        expected: "unknown metadata value type 77",
        setup: |d| gguf_case(d, tiny_gguf().raw("general.x", 77, &[0; 8]).build()),
    },
    Case {
        name: "gguf: tensor data past the end of the file",
        expected: "lies past the end of the file",
        setup: |d| gguf_case(d, gguf_with_tensor(&[32, 1], 0, 1 << 40)),
    },
    Case {
        name: "gguf: tensor offset overflows",
        expected: "overflows",
        setup: |d| gguf_case(d, gguf_with_tensor(&[32, 1], 0, u64::MAX - 8)),
    },
    Case {
        name: "gguf: tensor shape overflows",
        expected: "invalid shape",
        setup: |d| gguf_case(d, gguf_with_tensor(&[1 << 40, 1 << 40], 0, 0)),
    },
    Case {
        name: "gguf: zero-sized dimension",
        expected: "invalid shape",
        setup: |d| gguf_case(d, gguf_with_tensor(&[32, 0], 0, 0)),
    },
    Case {
        name: "gguf: unknown tensor type id",
        expected: "99",
        setup: |d| gguf_case(d, gguf_with_tensor(&[32, 1], 99, 0)),
    },
    Case {
        // An unsupported type has no byte length to check against the file, and its
        // element count used to go straight into an allocation (an abort, not an error).
        name: "gguf: unsupported quant type with a terabyte shape",
        expected: "unsupported GGUF tensor type IQ2_XXS",
        setup: |d| gguf_case(d, gguf_with_tensor(&[1 << 20, 1 << 20], 16, 0)),
    },
    Case {
        name: "gguf: a K-quant tensor claiming a terabyte",
        expected: "lies past the end of the file",
        setup: |d| gguf_case(d, gguf_with_tensor(&[1 << 20, 1 << 20], 12, 0)),
    },
    // GGUFs of models or tokenizers the importer does not take: each refused by name.
    Case {
        name: "gguf: a SentencePiece vocabulary",
        expected: "unsupported GGUF tokenizer model \"llama\" (a SentencePiece vocabulary)",
        setup: |d| gguf_case(d, tiny_gguf_with("llama", "llama", "default").build()),
    },
    Case {
        name: "gguf: an unknown pre-tokenizer",
        expected: "unsupported GGUF pre-tokenizer \"falcon\"",
        setup: |d| gguf_case(d, tiny_gguf_with("llama", "gpt2", "falcon").build()),
    },
    Case {
        name: "gguf: another architecture",
        expected: "unsupported GGUF architecture \"gemma2\"",
        setup: |d| gguf_case(d, tiny_gguf_with("gemma2", "gpt2", "smollm").build()),
    },
    Case {
        // Two factors, 1 and 8, none between: which Llama 3 scaling they are is not fixed.
        name: "gguf: RoPE frequency factors that fix no Llama 3 scaling",
        expected: "unsupported GGUF tensor rope_freqs.weight (RoPE scaling as frequency factors): convert the Hugging Face checkpoint instead: no factor lies between 1 and 8",
        setup: |d| {
            let factors: Vec<u8> = [1.0f32, 8.0].iter().flat_map(|f| f.to_le_bytes()).collect();
            let gguf = tiny_gguf().tensor("rope_freqs.weight", &[2], 0, &factors);
            gguf_case(d, gguf.build())
        },
    },
    Case {
        // `2 * heads` wrapped to 0 and the row split divided by it (a panic).
        name: "gguf: head count that overflows the q/k row split",
        expected: "cannot be split",
        setup: |d| {
            let bytes = tiny_gguf()
                .without("llama.attention.head_count")
                .raw("llama.attention.head_count", 10, &u64::MAX.to_le_bytes())
                .build();
            gguf_case(d, bytes)
        },
    },
    // ---- safetensors, config.json, tokenizer.json (`convert`) ----
    Case {
        name: "checkpoint: no config.json",
        expected: "config.json",
        setup: |d| {
            checkpoint_case(d, |src| {
                std::fs::remove_file(src.join("config.json")).unwrap()
            })
        },
    },
    Case {
        name: "checkpoint: no weights",
        expected: "no model.safetensors",
        setup: |d| {
            checkpoint_case(d, |src| {
                std::fs::remove_file(src.join("model.safetensors")).unwrap()
            })
        },
    },
    Case {
        name: "safetensors: header length past the end of the file",
        expected: "invalid safetensors file",
        setup: |d| safetensors_case(d, (1u64 << 40).to_le_bytes().to_vec()),
    },
    Case {
        name: "safetensors: header is not JSON",
        expected: "invalid safetensors file",
        setup: |d| safetensors_case(d, raw_safetensors("this is not json", 0)),
    },
    Case {
        name: "safetensors: overlapping offsets",
        expected: "invalid safetensors file",
        setup: |d| {
            let header = json!({
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
            });
            safetensors_case(d, raw_safetensors(&header.to_string(), 24))
        },
    },
    Case {
        name: "safetensors: offsets past the data",
        expected: "invalid safetensors file",
        setup: |d| {
            let header = json!({"a": {"dtype": "F32", "shape": [250], "data_offsets": [0, 1000]}});
            safetensors_case(d, raw_safetensors(&header.to_string(), 16))
        },
    },
    Case {
        name: "safetensors: dtype and shape disagree with the byte length",
        expected: "invalid safetensors file",
        setup: |d| {
            let header = json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}});
            safetensors_case(d, raw_safetensors(&header.to_string(), 8))
        },
    },
    Case {
        name: "safetensors: file cut in half",
        expected: "invalid safetensors file",
        setup: |d| {
            checkpoint_case(d, |src| {
                let path = src.join("model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap()
            })
        },
    },
    Case {
        name: "safetensors: a tensor is missing",
        expected: "missing tensor model.layers.1.mlp.up_proj.weight",
        setup: |d| {
            tensors_case(d, |t, _| {
                t.retain(|(name, _, _)| name != "model.layers.1.mlp.up_proj.weight")
            })
        },
    },
    Case {
        name: "safetensors: a tensor has the wrong shape",
        expected: "tensor model.layers.0.self_attn.k_proj.weight has shape [8, 8]",
        setup: |d| {
            tensors_case(d, |t, _| {
                let k = t
                    .iter_mut()
                    .find(|(n, _, _)| n == "model.layers.0.self_attn.k_proj.weight")
                    .unwrap();
                k.1 = vec![HIDDEN, HIDDEN];
                k.2 = vec![0; HIDDEN * HIDDEN * 2];
            })
        },
    },
    Case {
        name: "safetensors: unsupported dtype",
        expected: "unsupported dtype I16",
        setup: |d| tensors_case(d, |_, dtype| *dtype = Dtype::I16),
    },
    Case {
        name: "safetensors: a tensor the model has no place for",
        expected: "unmapped tensor model.layers.0.self_attn.q_proj.bias",
        setup: |d| {
            tensors_case(d, |t, _| {
                let bias = "model.layers.0.self_attn.q_proj.bias".to_string();
                t.push((bias, vec![HIDDEN], vec![0; HIDDEN * 2]))
            })
        },
    },
    Case {
        name: "config: not JSON",
        expected: "config.json",
        setup: |d| {
            checkpoint_case(d, |src| {
                std::fs::write(src.join("config.json"), "{oops").unwrap()
            })
        },
    },
    Case {
        name: "config: missing num_attention_heads",
        expected: "num_attention_heads",
        setup: |d| {
            config_case(d, |c| {
                _ = c.as_object_mut().unwrap().remove("num_attention_heads")
            })
        },
    },
    Case {
        name: "config: zero heads",
        expected: "num_attention_heads = 0",
        setup: |d| config_case(d, |c| c["num_attention_heads"] = json!(0)),
    },
    Case {
        name: "config: hidden size not divisible by the heads",
        expected: "not divisible",
        setup: |d| config_case(d, |c| c["num_attention_heads"] = json!(3)),
    },
    Case {
        name: "config: vocabulary of 2^40",
        expected: "vocab_size = 1099511627776",
        setup: |d| config_case(d, |c| c["vocab_size"] = json!(1u64 << 40)),
    },
    Case {
        name: "config: negative size",
        expected: "invalid value: integer `-8`, expected usize at line",
        setup: |d| config_case(d, |c| c["hidden_size"] = json!(-8)),
    },
    Case {
        name: "config: another architecture",
        expected: "unsupported architecture BertModel",
        setup: |d| config_case(d, |c| c["architectures"] = json!(["BertModel"])),
    },
    // Llama-family relatives this runtime does not run: each refused by name.
    Case {
        name: "config: Gemma 2",
        expected: "unsupported architecture Gemma2ForCausalLM",
        setup: |d| config_case(d, |c| c["architectures"] = json!(["Gemma2ForCausalLM"])),
    },
    Case {
        name: "config: Phi-3 with LongRoPE (the 128k models)",
        expected: "rope_type \"longrope\" is not supported",
        setup: |d| {
            config_case(d, |c| {
                c["architectures"] = json!(["Phi3ForCausalLM"]);
                c["rope_scaling"] =
                    json!({"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]});
            })
        },
    },
    Case {
        name: "config: Mixtral (mixture of experts)",
        expected: "unsupported architecture MixtralForCausalLM",
        setup: |d| config_case(d, |c| c["architectures"] = json!(["MixtralForCausalLM"])),
    },
    Case {
        name: "config: dynamic RoPE scaling",
        expected: "rope_type \"dynamic\" is not supported",
        setup: |d| {
            config_case(d, |c| {
                c["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0})
            })
        },
    },
    Case {
        name: "config: Qwen2 with its sliding window on",
        expected: "use_sliding_window: true is not supported",
        setup: |d| {
            config_case(d, |c| {
                c["architectures"] = json!(["Qwen2ForCausalLM"]);
                c["use_sliding_window"] = json!(true);
            })
        },
    },
    Case {
        name: "config: llama3 scaling without its frequencies",
        expected: "needs a positive low_freq_factor",
        setup: |d| {
            config_case(d, |c| {
                c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0})
            })
        },
    },
    Case {
        name: "tokenizer: not a tokenizer.json",
        expected: "tokenizer.json",
        setup: |d| {
            checkpoint_case(d, |src| {
                std::fs::write(src.join("tokenizer.json"), r#"{"model": {"type": "Nope"}}"#)
                    .unwrap()
            })
        },
    },
];

/// A valid tied bf16 checkpoint with `break_it` applied; converting it must fail.
fn checkpoint_case(dir: &Path, break_it: impl FnOnce(&Path)) -> Vec<PathOrStr> {
    let src = dir.join("hf");
    write_checkpoint(&src, TIED_BF16);
    break_it(&src);
    vec![S("convert"), P(src), P(dir.join("out"))]
}

fn config_case(dir: &Path, edit: fn(&mut serde_json::Value)) -> Vec<PathOrStr> {
    checkpoint_case(dir, |src| {
        let mut config = config_json(true);
        edit(&mut config);
        write_json(&src.join("config.json"), &config);
    })
}

fn safetensors_case(dir: &Path, bytes: Vec<u8>) -> Vec<PathOrStr> {
    checkpoint_case(dir, |src| {
        std::fs::write(src.join("model.safetensors"), bytes).unwrap()
    })
}

/// A safetensors file with the given header text and `data_len` zero bytes of data.
fn raw_safetensors(header: &str, data_len: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(vec![0; data_len]);
    bytes
}

fn tensors_case(dir: &Path, edit: fn(&mut Vec<RawTensor>, &mut Dtype)) -> Vec<PathOrStr> {
    checkpoint_case(dir, |src| {
        let mut tensors: Vec<_> = tensor_shapes(true)
            .into_iter()
            .map(|(name, shape)| {
                let bytes = vec![0u8; shape.iter().product::<usize>() * 2];
                (name, shape, bytes)
            })
            .collect();
        let mut dtype = Dtype::BF16;
        edit(&mut tensors, &mut dtype);
        write_safetensors(&src.join("model.safetensors"), &tensors, dtype);
    })
}

#[test]
fn every_malformed_input_fails_cleanly() {
    assert!(CASES.len() >= 25);
    let mut failures = Vec::new();
    for case in CASES {
        let tmp = tempfile::tempdir().unwrap();
        let args = (case.setup)(tmp.path());
        let (success, stderr) = run_capped(&args);
        let lines: Vec<&str> = stderr.lines().collect();
        let mut problems = Vec::new();
        if success {
            problems.push("succeeded".to_string());
        }
        if lines.len() != 1 || !lines[0].starts_with("error: ") {
            problems.push(format!("expected one `error:` line, got {stderr:?}"));
        } else if !lines[0].contains(case.expected) {
            problems.push(format!("{:?} lacks {:?}", lines[0], case.expected));
        }
        let out = tmp.path().join("out");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with('.') || name == "out")
            .collect();
        if out.exists() || !left.is_empty() {
            problems.push(format!("left behind: {left:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!("{}: {}", case.name, problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

// ---- A broken artifact: `verify` names it, the runtime refuses it ----

/// Converts the tiny checkpoint, applies `break_it` to the artifact, and checks that
/// `converter verify` fails naming `expected` and loading returns an error (no panic).
fn broken_artifact(expected: &str, break_it: impl FnOnce(&Path)) {
    let (_tmp, _src, out) = converted_tiny();
    break_it(&out);
    let (success, stderr) = run_capped(&[S("verify"), P(out.clone())]);
    assert!(!success, "verify accepted it");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(expected), "{stderr:?} lacks {expected:?}");
    assert!(
        stderr.lines().last().unwrap().starts_with("error: "),
        "{stderr}"
    );
    let loaded = load_model::<FlexBackend>(&out, &Default::default());
    assert!(loaded.is_err(), "the runtime loaded it");
}

#[test]
fn truncated_record() {
    broken_artifact("model.mpk", |out| {
        let path = out.join("model.mpk");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    });
}

#[test]
fn corrupt_record_of_the_right_size() {
    // Overwrite the middle of the file (parameter ids, tensor headers and data) with 0xff,
    // in an artifact without a weights file, whose record is what loads.
    broken_artifact("model.mpk", |out| {
        drop_weights_file(out);
        let path = out.join("model.mpk");
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid - 200..mid + 200].fill(0xff);
        std::fs::write(&path, bytes).unwrap();
    });
}

#[test]
fn corrupt_weights_index_of_the_right_size() {
    broken_artifact("weights.bin", |out| {
        let path = out.join("weights.bin");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[24..64].fill(0xff);
        std::fs::write(&path, bytes).unwrap();
    });
}

#[test]
fn manifest_that_does_not_match() {
    broken_artifact("model.mpk", |out| {
        let path = out.join("manifest.json");
        let mut manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for file in manifest["files"].as_array_mut().unwrap() {
            if file["name"] == "model.mpk" {
                file["bytes"] = json!(file["bytes"].as_u64().unwrap() + 1);
            }
        }
        write_json(&path, &manifest);
    });
}

#[test]
fn manifest_that_is_not_json() {
    broken_artifact("manifest.json", |out| {
        std::fs::write(out.join("manifest.json"), "{\"format_version\": 1,").unwrap();
    });
}

#[test]
fn corrupt_record_of_the_right_size_is_a_load_error_not_a_panic() {
    // Parameter ids are the first thing Burn decodes after the metadata; garble every one
    // (in an artifact without a weights file, whose record is what loads).
    let (_tmp, _src, out) = converted_tiny();
    drop_weights_file(&out);
    let path = out.join("model.mpk");
    let mut bytes = std::fs::read(&path).unwrap();
    let key = b"\xa2id\xad"; // msgpack: key "id", then a 13-byte string
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(key.len()).position(|w| w == key) {
        let start = at + i + key.len();
        bytes[start..start + 13].copy_from_slice(b"!!notbase32!!");
        at = start + 13;
    }
    assert!(at > 0, "no parameter id found to corrupt");
    std::fs::write(&path, bytes).unwrap();
    let err = load_model::<FlexBackend>(&out, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
}
