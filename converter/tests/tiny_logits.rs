//! The forward pass against transformers: a tiny random Llama (grouped-query attention,
//! untied lm_head, rope_theta 500, transformers 5 `rope_parameters` config) converted and
//! run by the runtime must give the logits transformers computed for it.
//! Fixture: tests/data/tiny, made by scripts/make_tiny_fixture.py (its `made_by` field
//! names the versions).

mod common;

use runtime::FlexBackend;
use runtime::generate::Generator;
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

#[test]
fn logits_match_transformers() {
    let fixture_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir.join("logits.json")).unwrap())
            .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let run = common::converter(&[&"convert", &fixture_dir, &tmp.path()]);
    assert!(run.success, "{}", run.stderr);
    let generator = Generator::<FlexBackend>::load(tmp.path(), &Default::default()).unwrap();
    let n = fixture.ids.len();

    // The whole sequence at once (prefill path, causal mask).
    let mut cache = generator.new_cache(n);
    let all = generator
        .forward_logits(&fixture.ids, &mut cache, true)
        .unwrap();
    let diff = max_diff(&all, &fixture.logits);
    assert!(diff < 1e-4, "prefill logits differ by {diff}");

    // Token by token through the KV cache (decode path).
    let mut cache = generator.new_cache(n);
    let mut stepwise = Vec::new();
    for &id in &fixture.ids {
        stepwise.extend(generator.forward_logits(&[id], &mut cache, false).unwrap());
    }
    let diff = max_diff(&stepwise, &fixture.logits);
    assert!(diff < 1e-4, "decode logits differ by {diff}");

    // A prompt then single tokens: a chunk boundary in the middle.
    let mut cache = generator.new_cache(n);
    let mut mixed = generator
        .forward_logits(&fixture.ids[..10], &mut cache, true)
        .unwrap();
    for &id in &fixture.ids[10..] {
        mixed.extend(generator.forward_logits(&[id], &mut cache, false).unwrap());
    }
    let diff = max_diff(&mixed, &fixture.logits);
    assert!(diff < 1e-4, "mixed logits differ by {diff}");
}
