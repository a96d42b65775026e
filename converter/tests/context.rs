//! The context limit, on the tiny transformers fixture (tests/data/tiny) converted with
//! `max_position_embeddings` cut to 16 and no end-of-sequence id, so generation can only end
//! at a length: a prompt one short of the context, a prompt as long as it, a cache too small
//! for its input, and perplexity over exactly the context.

mod common;

use std::path::Path;

use runtime::FlexBackend;
use runtime::generate::sampling::SamplingParams;
use runtime::generate::{GenerateError, GenerateOptions, Generator, StopReason};
use runtime::model::cache::CacheError;
use runtime::text::tokenizer::Tokenizer;
use serde::Deserialize;

const CONTEXT: usize = 16;

#[derive(Deserialize)]
struct Fixture {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// The fixture converted with a 16-position context; the temporary directory and the
/// fixture's ids and logits.
fn short_context_model() -> (
    tempfile::TempDir,
    Generator<FlexBackend>,
    Tokenizer,
    Fixture,
) {
    let fixture_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for name in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture_dir.join(name), src.join(name)).unwrap();
    }
    let config = std::fs::read_to_string(fixture_dir.join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["max_position_embeddings"] = CONTEXT.into();
    config["eos_token_id"] = serde_json::Value::Null;
    common::write_json(&src.join("config.json"), &config);
    let out = tmp.path().join("out");
    let run = common::converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);
    let generator = Generator::load(&out, &Default::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&out).unwrap();
    let fixture = std::fs::read_to_string(fixture_dir.join("logits.json")).unwrap();
    (
        tmp,
        generator,
        tokenizer,
        serde_json::from_str(&fixture).unwrap(),
    )
}

fn greedy(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        grammar: None,
    }
}

/// `logsumexp(row) - row[target]` in f64, averaged over the predictions of `ids`.
fn reference_nll(logits: &[Vec<f32>], ids: &[u32]) -> f64 {
    let total: f64 = ids[1..]
        .iter()
        .zip(logits)
        .map(|(&target, row)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
            max + sum.ln() - row[target as usize] as f64
        })
        .sum();
    total / (ids.len() - 1) as f64
}

#[test]
fn context_limit_is_kept_exactly() {
    let (_tmp, generator, tokenizer, fixture) = short_context_model();
    assert!(generator.eos_ids().is_empty());

    // One position short: the prompt fills 15, the first new token the 16th, and the token
    // predicted from the full cache ends the run (as llama.cpp's server does).
    let prompt = &fixture.ids[..CONTEXT - 1];
    let out = generator
        .generate(&tokenizer, prompt, &greedy(100), |_| {})
        .unwrap();
    assert_eq!(out.tokens.len(), 2);
    assert_eq!(out.stop_reason, StopReason::Length);

    // The tokens tokenized from text: "t11 t48 ..." is the fixture's sequence.
    let text: Vec<String> = prompt.iter().map(|id| format!("t{id}")).collect();
    assert_eq!(tokenizer.encode(&text.join(" ")).unwrap(), prompt);

    // A prompt as long as the context leaves no room for a new token.
    let err = generator
        .generate(&tokenizer, &fixture.ids[..CONTEXT], &greedy(1), |_| {})
        .unwrap_err();
    assert!(
        matches!(
            err,
            GenerateError::PromptTooLong {
                tokens: 16,
                context: 16
            }
        ),
        "{err}"
    );

    // A cache too small for the input is an error before any work, not a panic.
    let mut cache = generator.new_cache(8).unwrap();
    let err = generator
        .forward_logits(&fixture.ids[..9], &mut cache, false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GenerateError::Cache(CacheError::Full {
                needed: 9,
                capacity: 8
            })
        ),
        "{err}"
    );
    assert!(cache.is_empty());
    // ... and after filling it exactly, one more token is refused the same way.
    generator
        .forward_logits(&fixture.ids[..8], &mut cache, false)
        .unwrap();
    let err = generator
        .forward_logits(&fixture.ids[8..9], &mut cache, false)
        .unwrap_err();
    assert!(matches!(err, GenerateError::Cache(_)), "{err}");

    // Perplexity over exactly the context, against transformers' logits for those positions.
    let ids = &fixture.ids[..CONTEXT];
    let ours = generator.perplexity(ids).unwrap();
    let want = reference_nll(&fixture.logits, ids);
    assert!((ours.nll - want).abs() < 1e-5, "nll {} vs {want}", ours.nll);
    let err = generator
        .perplexity(&fixture.ids[..CONTEXT + 1])
        .unwrap_err();
    assert!(matches!(err, GenerateError::PromptTooLong { .. }), "{err}");
}
