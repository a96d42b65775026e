//! Constrained decoding under adversarial logits: the tiny random checkpoints (Llama 3 and
//! Qwen2 layouts, byte-level vocabularies of 360 tokens), sampled hot, answer the 32 schemas
//! of runtime/tests/data/schemas.json. Every answer that ends validates against its schema
//! (the `jsonschema` crate, formats checked); every answer cut at its length is a prefix a
//! fresh matcher accepts; a batch of constrained sequences decoded together gives each the
//! tokens it gets alone.

mod common;

use std::path::Path;

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

#[derive(Deserialize)]
struct Reference {
    cases: Vec<ReferenceCase>,
}

#[derive(Deserialize)]
struct ReferenceCase {
    checkpoint: String,
    end_ids: Vec<u32>,
    grammar: ReferenceGrammar,
    prompt_ids: Vec<u32>,
    greedy: Greedy,
    paths: Vec<Path_>,
}

#[derive(Deserialize)]
struct ReferenceGrammar {
    kind: String,
    source: Value,
}

#[derive(Deserialize)]
struct Greedy {
    ids: Vec<u32>,
    near_tie_steps: Vec<usize>,
}

#[derive(Deserialize)]
#[serde(rename = "Path")]
struct Path_ {
    ids: Vec<u32>,
    /// Each step's allowed tokens: u32 words as 8 hex digits each, token i in bit i % 32
    /// of word i / 32.
    masks: Vec<String>,
}

impl ReferenceGrammar {
    fn grammar(&self) -> Grammar {
        let text = || self.source.as_str().unwrap().to_string();
        match self.kind.as_str() {
            "json_schema" => Grammar::JsonSchema(self.source.clone()),
            "lark" => Grammar::Lark(text()),
            "regex" => Grammar::Regex(text()),
            kind => panic!("grammar kind {kind}"),
        }
    }
}

/// The tokens a mask in the reference's encoding allows.
fn allowed_ids(mask: &str) -> Vec<u32> {
    (0..mask.len() / 8)
        .flat_map(|word| {
            let bits = u32::from_str_radix(&mask[word * 8..word * 8 + 8], 16).unwrap();
            (0..32)
                .filter(move |bit| bits >> bit & 1 == 1)
                .map(move |bit| word as u32 * 32 + bit)
        })
        .collect()
}

/// Against Python llguidance with transformers (converter/tests/data/grammar-reference.json,
/// made by scripts/make_grammar_reference.py): over six grammars on each tiny checkpoint,
/// the mask at every step of the recorded paths (the greedy one and three drawn uniformly
/// from the allowed tokens) allows exactly the tokens llguidance's does, and greedy decoding
/// under the grammar picks the same tokens as transformers' logits masked by llguidance.
#[test]
fn masks_and_greedy_tokens_equal_python_llguidance() {
    let reference: Reference =
        serde_json::from_str(include_str!("data/grammar-reference.json")).unwrap();
    let mut steps = 0;
    for fixture in ["tiny-llama3", "tiny-qwen2"] {
        let (_tmp, generator, tokenizer) = convert(fixture);
        let vocab_size = generator.config.vocab_size;
        let cases = reference.cases.iter().filter(|c| c.checkpoint == fixture);
        for (n, case) in cases.enumerate() {
            assert_eq!(case.end_ids, generator.eos_ids(), "{fixture}");
            let grammars = Grammars::new(&tokenizer, vocab_size, &case.end_ids).unwrap();
            let grammar = case.grammar.grammar();
            for (p, path) in case.paths.iter().enumerate() {
                let mut constraint = grammars.constraint(&grammar).unwrap();
                assert_eq!(path.ids.len(), path.masks.len());
                for (step, (&token, mask)) in path.ids.iter().zip(&path.masks).enumerate() {
                    let mut logits = vec![0.0f32; vocab_size];
                    constraint.mask(&mut logits).unwrap();
                    let ours: Vec<u32> = (0..vocab_size as u32)
                        .filter(|&id| logits[id as usize].is_finite())
                        .collect();
                    let context = format!("{fixture} grammar {n} path {p} step {step}");
                    assert_eq!(ours, allowed_ids(mask), "{context}");
                    if !case.end_ids.contains(&token) {
                        constraint.consume(token).unwrap();
                    }
                    steps += 1;
                }
            }
            let options = GenerateOptions {
                max_new_tokens: 48,
                sampling: SamplingParams::default(),
                stop: Vec::new(),
                grammar: Some(grammar),
            };
            let generation =
                (generator.generate(&tokenizer, &case.prompt_ids, &options, |_| ())).unwrap();
            assert!(case.greedy.near_tie_steps.is_empty());
            assert_eq!(
                generation.tokens, case.greedy.ids,
                "{fixture} grammar {n} greedy"
            );
        }
    }
    assert!(steps > 1000, "{steps} masks compared");
}
