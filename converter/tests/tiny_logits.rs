//! The forward pass against transformers: a tiny random Llama (grouped-query attention,
//! untied lm_head, rope_theta 500, random norm weights, transformers 5 `rope_parameters`
//! config) converted and run by the runtime must give the logits transformers computed for
//! its 100-token sequence.
//! Fixture: tests/data/tiny, made by scripts/make_tiny_fixture.py (its `made_by` field
//! names the versions).

mod common;

use runtime::backend::KernelBackend;
use runtime::generate::Generator;
use runtime::{FlexBackend, NdArrayBackend};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// Largest absolute difference; transformers and Burn sum in different orders, so f32
/// results agree to a few ulps of the logits' magnitude, not bit for bit.
fn max_diff(ours: &[f32], reference: &[Vec<f32>]) -> f32 {
    let flat: Vec<f32> = reference.iter().flatten().copied().collect();
    assert_eq!(ours.len(), flat.len());
    ours.iter()
        .zip(&flat)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// The fixture's logits three ways through `generator`: the whole sequence at once (the
/// prompt path, causal mask), token by token through the KV cache (the decode path), and a
/// prompt then single tokens (a chunk boundary in the middle).
fn assert_matches<B: KernelBackend>(generator: &Generator<B>, fixture: &Fixture, what: &str) {
    let n = fixture.ids.len();
    let mut cache = generator.new_cache(n).unwrap();
    let all = generator
        .forward_logits(&fixture.ids, &mut cache, true)
        .unwrap();
    let diff = max_diff(&all, &fixture.logits);
    assert!(diff < 1e-4, "{what}: prefill logits differ by {diff}");

    let mut cache = generator.new_cache(n).unwrap();
    let mut stepwise = Vec::new();
    for &id in &fixture.ids {
        stepwise.extend(generator.forward_logits(&[id], &mut cache, false).unwrap());
    }
    let diff = max_diff(&stepwise, &fixture.logits);
    assert!(diff < 1e-4, "{what}: decode logits differ by {diff}");

    let mut cache = generator.new_cache(n).unwrap();
    let mut mixed = generator
        .forward_logits(&fixture.ids[..10], &mut cache, true)
        .unwrap();
    for &id in &fixture.ids[10..] {
        mixed.extend(generator.forward_logits(&[id], &mut cache, false).unwrap());
    }
    let diff = max_diff(&mixed, &fixture.logits);
    assert!(diff < 1e-4, "{what}: mixed logits differ by {diff}");
}

/// burn-flex at 1, 2, 3 and 5 threads (a decoded token's attention splits its up to 100
/// keys into one span per thread, and the products split their rows), and burn-ndarray.
#[test]
fn logits_match_transformers() {
    let fixture_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir.join("logits.json")).unwrap())
            .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let run = common::converter(&[&"convert", &fixture_dir, &tmp.path()]);
    assert!(run.success, "{}", run.stderr);
    let flex = Generator::<FlexBackend>::load(tmp.path(), &Default::default()).unwrap();
    for threads in [1, 2, 3, 5] {
        runtime::in_thread_pool(Some(threads), || {
            assert_matches(&flex, &fixture, &format!("flex, {threads} threads"))
        })
        .unwrap();
    }
    let ndarray = Generator::<NdArrayBackend>::load(tmp.path(), &Default::default()).unwrap();
    assert_matches(&ndarray, &fixture, "ndarray");
}
