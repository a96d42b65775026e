//! GGUF SentencePiece vocabularies `import-gguf` cannot turn into a tokenizer.json that
//! tokenizes as llama.cpp does, or that are broken: each refused with one `error:` line
//! naming the problem, nothing written. (A vocabulary without scores: tests/malformed.rs.)

mod common;

use common::{GgufBuilder, tiny_gguf_with};

/// GGUF value types (gguf.h).
const BOOL: u32 = 7;
const ARRAY: u32 = 9;
const INT32: u32 = 5;
const F32: u32 = 6;

/// `tokenizer.ggml.scores` as an array of f32.
fn scores(gguf: GgufBuilder, values: &[f32]) -> GgufBuilder {
    let mut bytes = F32.to_le_bytes().to_vec();
    bytes.extend((values.len() as u64).to_le_bytes());
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    gguf.raw("tokenizer.ggml.scores", ARRAY, &bytes)
}

/// The tiny GGUF with a SentencePiece vocabulary of `tokens` (three, as its embedding has
/// rows).
fn sentencepiece(tokens: &[&str]) -> GgufBuilder {
    tiny_gguf_with("llama", "llama", "default")
        .without("tokenizer.ggml.tokens")
        .strings("tokenizer.ggml.tokens", tokens)
}

fn assert_refused(bytes: Vec<u8>, expected: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    std::fs::write(&path, bytes).unwrap();
    let out = tmp.path().join("out");
    let run = common::converter(&[&"import-gguf", &path, &out]);
    assert!(!run.success, "{expected}: imported");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("error: ") && lines[0].contains(expected),
        "expected one `error:` line holding {expected:?}, got {:?}",
        run.stderr
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "m.gguf")
        .collect();
    assert!(left.is_empty(), "{expected}: left behind {left:?}");
}

#[test]
fn broken_or_inexpressible_sentencepiece_vocabularies_are_refused() {
    let tokens = ["a", "b", "ab"];
    assert_refused(
        scores(sentencepiece(&tokens), &[-1.0, -2.0]).build(),
        "tokenizer.ggml.scores has 2 entries for 3 tokens",
    );
    assert_refused(
        scores(sentencepiece(&tokens), &[-1.0, f32::NAN, -3.0]).build(),
        "tokenizer.ggml.scores holds a value that is not a finite number",
    );
    // llama.cpp merges "a" and "é" (its symbols are characters); byte fallback would leave
    // "é" two byte tokens no merge joins.
    assert_refused(
        scores(sentencepiece(&["a", "<0xC3>", "aé"]), &[-1.0, 0.0, -2.0]).build(),
        "its token \"aé\" joins \"é\", a character it has no token for",
    );
    assert_refused(
        scores(sentencepiece(&tokens), &[-1.0, -2.0, -3.0])
            .u32("tokenizer.ggml.bos_token_id", 9)
            .build(),
        "the GGUF adds BOS token id 9, past its 3 tokens",
    );
    assert_refused(
        scores(sentencepiece(&tokens), &[-1.0, -2.0, -3.0])
            .u32("tokenizer.ggml.add_space_prefix", 1)
            .build(),
        "GGUF metadata tokenizer.ggml.add_space_prefix is not a boolean",
    );
    assert_refused(
        scores(sentencepiece(&["a", "b", "a"]), &[-1.0, -2.0, -3.0]).build(),
        "the GGUF vocabulary has duplicate tokens",
    );
}

/// A small SentencePiece vocabulary imports, and its tokenizer.json merges by score, a
/// space prepended; BOS first as llama.cpp's default (no `add_bos_token`), none with
/// `add_bos_token` false.
#[test]
fn a_sentencepiece_vocabulary_merges_by_score() {
    let tokens = [
        "<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "bc", "▁a", "▁abc",
    ];
    let values = [
        0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -5.0, -7.0, -8.0,
    ];
    // INT32 elements: unknown, control, control, then normal.
    let mut token_type = INT32.to_le_bytes().to_vec();
    token_type.extend((tokens.len() as u64).to_le_bytes());
    token_type.extend(
        [2i32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
            .iter()
            .flat_map(|t| t.to_le_bytes()),
    );
    // "▁abc": "bc" (-5) before "ab" (-6) and "▁a" (-7), then "▁a" + "bc" = "▁abc"; merging
    // "ab" first would leave "▁", "ab", "c".
    for (add_bos, expected) in [(None, vec![1, 10]), (Some(false), vec![10])] {
        let mut gguf = scores(sentencepiece(&tokens), &values).raw(
            "tokenizer.ggml.token_type",
            ARRAY,
            &token_type,
        );
        if let Some(add_bos) = add_bos {
            gguf = gguf.raw("tokenizer.ggml.add_bos_token", BOOL, &[add_bos as u8]);
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.gguf");
        std::fs::write(&path, gguf.build()).unwrap();
        let out = tmp.path().join("out");
        let run = common::converter(&[&"import-gguf", &path, &out]);
        assert!(run.success, "{}", run.stderr);
        let tokenizer = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
        let ids = tokenizer.encode("abc", true).unwrap().get_ids().to_vec();
        assert_eq!(ids, expected, "add_bos_token {add_bos:?}");
        let body = ids.strip_prefix(&[1]).unwrap_or(&ids);
        assert_eq!(tokenizer.decode(body, true).unwrap(), "abc");
    }
}
