//! Constrained decoding under adversarial logits: the tiny random checkpoints (Llama 3 and
//! Qwen2 layouts, byte-level vocabularies of 360 tokens), sampled hot, answer the 32 schemas
//! of runtime/tests/data/schemas.json. Every answer that ends validates against its schema
//! (the `jsonschema` crate, formats checked); every answer cut at its length is a prefix a
//! fresh matcher accepts; a batch of constrained sequences decoded together gives each the
//! tokens it gets alone.

mod common;

use std::path::Path;

use runtime::FlexBackend;
use runtime::generate::{GenerateOptions, Generator, StopReason};
use runtime::grammar::{Grammar, Grammars};
use runtime::sampling::SamplingParams;
use runtime::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Schemas {
    schemas: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    schema: Value,
}

fn convert(fixture: &str) -> (tempfile::TempDir, Generator<FlexBackend>, Tokenizer) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(fixture);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let run = common::converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);
    let generator = Generator::load(&out, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&out).unwrap();
    (tmp, generator, tokenizer)
}

fn options(schema: &Value, seed: u64) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: 160,
        sampling: SamplingParams {
            temperature: 1.5,
            seed,
            ..Default::default()
        },
        stop: Vec::new(),
        grammar: Some(Grammar::JsonSchema(schema.clone())),
    }
}

#[test]
fn random_models_answer_every_schema_validly() {
    let cases: Schemas =
        serde_json::from_str(include_str!("../../runtime/tests/data/schemas.json")).unwrap();
    for fixture in ["tiny-llama3", "tiny-qwen2"] {
        let (_tmp, generator, tokenizer) = convert(fixture);
        let grammars =
            Grammars::new(&tokenizer, generator.config.vocab_size, generator.eos_ids()).unwrap();
        let prompt = tokenizer.encode("a b c").unwrap();
        let (mut ended, mut cut) = (0, 0);
        for case in &cases.schemas {
            let validator = jsonschema::options()
                .should_validate_formats(true)
                .build(&case.schema)
                .unwrap();
            for seed in 0..2 {
                let generation = generator
                    .generate(&tokenizer, &prompt, &options(&case.schema, seed), |_| ())
                    .unwrap_or_else(|e| panic!("{fixture} {}: {e}", case.name));
                let context = format!("{fixture} {} seed {seed}: {:?}", case.name, generation.text);
                if generation.stop_reason == StopReason::Eos {
                    let value: Value = serde_json::from_str(&generation.text)
                        .unwrap_or_else(|e| panic!("{context}: not JSON: {e}"));
                    let errors: Vec<String> = validator
                        .iter_errors(&value)
                        .map(|e| e.to_string())
                        .collect();
                    assert!(errors.is_empty(), "{context}: {errors:?}");
                    ended += 1;
                } else {
                    let mut constraint = grammars
                        .constraint(&Grammar::JsonSchema(case.schema.clone()))
                        .unwrap();
                    for &token in &generation.tokens {
                        constraint
                            .consume(token)
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                    }
                    cut += 1;
                }
            }
        }
        eprintln!("{fixture}: {ended} answers ended and validated, {cut} cut at their length");
        assert!(ended > 0, "{fixture}: no answer ended");
    }
}

/// Eight constrained sequences stepped together (`step_each`, one pass over the weights per
/// step) each get the tokens they get alone.
#[test]
fn a_batch_of_constrained_sequences_decodes_as_each_alone() {
    let cases: Schemas =
        serde_json::from_str(include_str!("../../runtime/tests/data/schemas.json")).unwrap();
    let (_tmp, generator, tokenizer) = convert("tiny-llama3");
    let prompt = tokenizer.encode("a b c").unwrap();
    let picked: Vec<&Case> = cases.schemas.iter().take(8).collect();
    let alone: Vec<Vec<u32>> = (picked.iter().enumerate())
        .map(|(i, case)| {
            let options = options(&case.schema, i as u64);
            generator
                .generate(&tokenizer, &prompt, &options, |_| ())
                .unwrap()
                .tokens
        })
        .collect();
    let mut sequences: Vec<_> = (picked.iter().enumerate())
        .map(|(i, case)| {
            generator
                .start(&tokenizer, &prompt, options(&case.schema, i as u64))
                .unwrap()
        })
        .collect();
    loop {
        let mut refs: Vec<_> = sequences.iter_mut().collect();
        let results = generator.step_each(&mut refs, |_, _| ());
        if results.iter().all(|r| matches!(r, Ok(Some(_)))) {
            break;
        }
    }
    for (i, sequence) in sequences.into_iter().enumerate() {
        assert_eq!(sequence.tokens(), &alone[i][..], "{}", picked[i].name);
    }
}
