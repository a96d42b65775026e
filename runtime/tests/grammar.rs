//! Constrained decoding on the real model (SmolLM2-135M-Instruct): every answer to 32 JSON
//! Schemas of our own (tests/data/schemas.json), greedy and sampled, validates against its
//! schema with an independent validator (the `jsonschema` crate, formats checked); an
//! answer cut at its length is a prefix the grammar still accepts; a grammar that admits
//! every text changes no token; the vocabulary's bytes spell what the tokenizer encodes.
//!
//! Skipped when the artifact is missing (`REQUIRE_MODEL=1`, set by `just test`, makes that
//! a failure).

use std::path::PathBuf;

use runtime::FlexBackend;
use runtime::generate::sampling::SamplingParams;
use runtime::generate::{GenerateOptions, Generator, StopReason};
use runtime::text::grammar::{Grammar, Grammars};
use runtime::text::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Schemas {
    schemas: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt: String,
    schema: Value,
}

fn model() -> Option<(Generator<FlexBackend>, Tokenizer)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/smollm2-135m-instruct");
    if !dir.join("model.mpk").exists() {
        assert!(
            std::env::var_os("REQUIRE_MODEL").is_none(),
            "{} has no model.mpk: run `just fetch convert`",
            dir.display()
        );
        eprintln!("skipped: no converted model in {}", dir.display());
        return None;
    }
    let generator = Generator::load(&dir, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    Some((generator, tokenizer))
}

fn options(grammar: Option<Grammar>, temperature: f32, seed: u64, max: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: max,
        sampling: SamplingParams {
            temperature,
            seed,
            ..Default::default()
        },
        stop: Vec::new(),
        grammar,
    }
}

/// A chat prompt asking for JSON.
fn prompt(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let messages = vec![runtime::text::chat::Message::new(
        "user",
        format!("{text} Answer in JSON."),
    )];
    let render = |request: &runtime::text::chat::ChatRequest| request.render();
    tokenizer
        .encode_messages(messages, &render, Default::default())
        .unwrap()
}

#[test]
fn every_answer_validates_against_its_schema() {
    let Some((generator, tokenizer)) = model() else {
        return;
    };
    let cases: Schemas = serde_json::from_str(include_str!("data/schemas.json")).unwrap();
    assert!(cases.schemas.len() >= 30);
    let grammars =
        Grammars::new(&tokenizer, generator.config.vocab_size, generator.eos_ids()).unwrap();
    let (mut ended, mut cut) = (0, 0);
    for case in &cases.schemas {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&case.schema)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let ids = prompt(&tokenizer, &case.prompt);
        for (temperature, seed) in [(0.0, 0), (0.8, 1), (1.3, 2)] {
            let grammar = Grammar::JsonSchema(case.schema.clone());
            let options = options(Some(grammar.clone()), temperature, seed, 120);
            let generation = generator
                .generate(&tokenizer, &ids, &options, |_| ())
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            let context = format!("{} at T={temperature}: {:?}", case.name, generation.text);
            match generation.stop_reason {
                StopReason::Eos => {
                    let value: Value = serde_json::from_str(&generation.text)
                        .unwrap_or_else(|e| panic!("{context}: not JSON: {e}"));
                    let errors: Vec<String> = validator
                        .iter_errors(&value)
                        .map(|e| e.to_string())
                        .collect();
                    assert!(errors.is_empty(), "{context}: {errors:?}");
                    ended += 1;
                }
                StopReason::Length => {
                    // Cut short: still a prefix of an answer the grammar accepts.
                    let mut constraint = grammars.constraint(&grammar).unwrap();
                    for &token in &generation.tokens {
                        constraint
                            .consume(token)
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                    }
                    cut += 1;
                }
                StopReason::Stop => unreachable!("no stop strings"),
            }
        }
    }
    eprintln!("{ended} answers ended and validated, {cut} cut at their length");
    assert!(
        ended >= 3 * cases.schemas.len() * 3 / 4,
        "{ended} of {}",
        3 * cases.schemas.len()
    );
}

/// A grammar every text satisfies masks nothing a greedy answer would take: the same tokens.
#[test]
fn a_grammar_that_admits_everything_changes_nothing() {
    let Some((generator, tokenizer)) = model() else {
        return;
    };
    for text in ["Write a haiku about the sea.", "What is 12 times 12?"] {
        let ids = prompt(&tokenizer, text);
        let free = generator.generate(&tokenizer, &ids, &options(None, 0.0, 0, 40), |_| ());
        let everything = Grammar::Lark(r"start: /(.|\n)*/".into());
        let masked = generator.generate(
            &tokenizer,
            &ids,
            &options(Some(everything), 0.0, 0, 40),
            |_| (),
        );
        assert_eq!(masked.unwrap().tokens, free.unwrap().tokens, "{text}");
    }
}

/// The bytes llguidance sees for each token, concatenated over an encoding, are the text.
#[test]
fn vocabulary_bytes_spell_the_text() {
    let Some((_, tokenizer)) = model() else {
        return;
    };
    let words = tokenizer.vocabulary_bytes();
    for text in [
        "Hello, world!",
        " leading space and  two",
        "日本語のテキスト 🎉 émoji",
        "line one\nline two\ttab\r\n",
        "{\"key\": [1, 2.5, -3e4], \"nested\": {\"a\": null}}",
        "1234567890 digits 42",
    ] {
        let ids = tokenizer.encode(text).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| words[id as usize].clone())
            .collect();
        assert_eq!(String::from_utf8_lossy(&bytes), text);
    }
    let specials = (words.iter()).filter(|w| w.first() == Some(&0xFF)).count();
    assert!(specials > 0, "the special tokens are marked");
}
