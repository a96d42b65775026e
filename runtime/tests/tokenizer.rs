//! The runtime's tokenizer against two oracles on 293 varied strings (numbers, CJK, emoji,
//! code, whitespace runs, special tokens in text, other scripts): the `tokenizers` Python
//! library on the same tokenizer.json and llama.cpp on the original GGUF, whose vocabulary
//! the importer turned into that tokenizer.json. tests/data/tokenizer_oracle.json was made
//! by scripts/tokenizer_oracle.py (its `made_by` names the versions).
//!
//! Skipped when the artifact is missing; `REQUIRE_MODEL=1` (set by `just test`) makes that
//! a failure instead.

use std::path::PathBuf;

use runtime::text::tokenizer::Tokenizer;
use serde::Deserialize;

#[derive(Deserialize)]
struct Oracle {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    tokenizers: Vec<u32>,
    llama_cpp: Vec<u32>,
}

fn tokenizer() -> Option<Tokenizer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/smollm2-135m-instruct");
    if dir.join("tokenizer.json").exists() {
        return Some(Tokenizer::from_dir(&dir).unwrap());
    }
    assert!(
        std::env::var_os("REQUIRE_MODEL").is_none(),
        "{} has no tokenizer.json: run `just fetch convert`",
        dir.display()
    );
    eprintln!("skipped: no converted model in {}", dir.display());
    None
}

#[test]
fn encodes_as_tokenizers_and_llama_cpp_do() {
    let Some(tokenizer) = tokenizer() else { return };
    let oracle: Oracle = serde_json::from_str(include_str!("data/tokenizer_oracle.json")).unwrap();
    assert!(oracle.cases.len() >= 250);
    let mut wrong = Vec::new();
    for case in &oracle.cases {
        let ours = tokenizer.encode(&case.text).unwrap();
        if ours != case.tokenizers || ours != case.llama_cpp {
            wrong.push(format!(
                "{:?}: ours {ours:?}, tokenizers {:?}, llama.cpp {:?}",
                case.text, case.tokenizers, case.llama_cpp
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Byte-level BPE loses nothing: decoding gives the text back, for every case without
/// special tokens (decoding leaves those out).
#[test]
fn decodes_back_to_the_text() {
    let Some(tokenizer) = tokenizer() else { return };
    let oracle: Oracle = serde_json::from_str(include_str!("data/tokenizer_oracle.json")).unwrap();
    let mut checked = 0;
    for case in oracle.cases.iter().filter(|c| !c.text.contains("<|")) {
        let decoded = tokenizer.decode(&case.tokenizers).unwrap();
        assert_eq!(decoded, case.text);
        checked += 1;
    }
    assert!(checked >= 200, "{checked}");
}
