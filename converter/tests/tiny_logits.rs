//! The forward pass against transformers: tiny random checkpoints converted and run by the
//! runtime must give the logits transformers computed for their 100-token sequences.
//! - tests/data/tiny: Llama (grouped-query attention, untied lm_head, rope_theta 500, random
//!   norm weights, transformers 5 `rope_parameters` config), f32;
//! - tests/data/tiny-VARIANT: one per Llama-family variant (Llama 3.x RoPE scaling with
//!   explicit head_dim and biases, linear scaling, Mistral's sliding window, Qwen2's biases,
//!   YaRN), bf16, with randomised biases and norms, each fixture checked when made to move by
//!   far more than the tolerance with its feature switched off.
//!
//! All made by scripts/make_tiny_fixture.py (`made_by` in each names the versions).

mod common;

use runtime::generate::Generator;
use runtime::model::backend::KernelBackend;
use runtime::{FlexBackend, NdArrayBackend};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// A family fixture's fixture.json; its logits are logits.bin, `[ids, vocab_size]` f32.
#[derive(Deserialize)]
struct FamilyFixture {
    ids: Vec<u32>,
    vocab_size: usize,
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

/// The fixture's logits four ways through `generator`: the whole sequence at once (the
/// prompt path, causal mask), token by token through the KV cache (the decode path), in
/// chunks of mixed sizes, and token by token in a batch of sequences at other positions.
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

    // Chunks of 10, 1, 1, 33, 1 and 54 positions: prompts after cached positions too.
    let mut cache = generator.new_cache(n).unwrap();
    let mut mixed = Vec::new();
    let mut at = 0;
    for chunk in [10, 1, 1, 33, 1, n - 46] {
        let ids = &fixture.ids[at..at + chunk];
        mixed.extend(generator.forward_logits(ids, &mut cache, true).unwrap());
        at += chunk;
    }
    let diff = max_diff(&mixed, &fixture.logits);
    assert!(diff < 1e-4, "{what}: mixed logits differ by {diff}");

    // Four sequences decoded together (`decode_each`: a batch through the fused layers),
    // each at its own position: sequence s after a prompt of `starts[s]` tokens. The batch
    // shrinks as they finish.
    let starts = [0, 5, 20, 47];
    let mut caches: Vec<_> = (starts.iter())
        .map(|&start| {
            let mut cache = generator.new_cache(n).unwrap();
            if start > 0 {
                (generator.forward_logits(&fixture.ids[..start], &mut cache, false)).unwrap();
            }
            cache
        })
        .collect();
    let mut at = starts;
    loop {
        let running: Vec<usize> = (0..starts.len()).filter(|&s| at[s] < n).collect();
        if running.is_empty() {
            break;
        }
        let ids: Vec<u32> = running.iter().map(|&s| fixture.ids[at[s]]).collect();
        let mut batch: Vec<_> = (caches.iter_mut().enumerate())
            .filter(|(s, _)| running.contains(s))
            .map(|(_, cache)| cache)
            .collect();
        let logits = generator.decode_each(&ids, &mut batch).unwrap();
        let vocab = logits.len() / ids.len();
        for (&s, row) in running.iter().zip(logits.chunks(vocab)) {
            let diff = max_diff(row, &fixture.logits[at[s]..at[s] + 1]);
            assert!(
                diff < 1e-4,
                "{what}: batched logits of sequence {s} at {} differ by {diff}",
                at[s]
            );
            at[s] += 1;
        }
    }
}

fn data_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Converts the checkpoint in `dir` and checks its logits on burn-flex at 1, 2, 3 and 5
/// threads (a decoded token's attention splits its up to 100 keys into one span per
/// thread, and the products split their rows) and on burn-ndarray (the reference ops).
fn convert_and_check(dir: &std::path::Path, fixture: &Fixture) {
    let tmp = tempfile::tempdir().unwrap();
    let run = common::converter(&[&"convert", &dir, &tmp.path()]);
    assert!(run.success, "{}: {}", dir.display(), run.stderr);
    let flex = Generator::<FlexBackend>::load(tmp.path(), &Default::default()).unwrap();
    for threads in [1, 2, 3, 5] {
        let what = format!("{}, flex, {threads} threads", dir.display());
        runtime::in_thread_pool(Some(threads), || assert_matches(&flex, fixture, &what)).unwrap();
    }
    let ndarray = Generator::<NdArrayBackend>::load(tmp.path(), &Default::default()).unwrap();
    assert_matches(&ndarray, fixture, &format!("{}, ndarray", dir.display()));
}

#[test]
fn logits_match_transformers() {
    let dir = data_dir("tiny");
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    convert_and_check(&dir, &fixture);
}

/// Every Llama-family variant's logits, prefill, decode and mixed, within 1e-4.
#[test]
fn family_logits_match_transformers() {
    for variant in [
        "llama3", "linear", "mistral", "qwen2", "yarn", "qwen3", "smollm3", "gemma3", "phi3",
    ] {
        let dir = data_dir(&format!("tiny-{variant}"));
        convert_and_check(&dir, &family_fixture(&dir));
    }
}

/// A fixture.json and logits.bin pair.
fn family_fixture(dir: &std::path::Path) -> Fixture {
    let meta: FamilyFixture =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fixture.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("logits.bin")).unwrap();
    let flat: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(
        flat.len(),
        meta.ids.len() * meta.vocab_size,
        "{}",
        dir.display()
    );
    Fixture {
        logits: flat.chunks(meta.vocab_size).map(<[f32]>::to_vec).collect(),
        ids: meta.ids,
    }
}

/// GGUF files beyond SmolLM2. K-quantized by llama.cpp: a Llama 3 style one (`llama-bpe`
/// pre-tokenizer, BOS added; Q4_K and Q6_K tensors), a Qwen2 one (`qwen2` pre-tokenizer,
/// q/k/v biases; Q3_K to Q6_K) and a Qwen3 one (head norms, head_dim 128; Q4_K, Q6_K).
/// Written (F32) by llama.cpp's own convert_hf_to_gguf.py: a Gemma 3 one (sliding-window
/// pattern, two RoPE bases, sandwich and q/k norms written as 1 + w), a Phi-3 one (fused
/// projections, a window) and a SmolLM3 one (NoPE layers, q/k permuted). `import-gguf`
/// must give a tokenizer that encodes as the source tokenizer.json does (which llama.cpp's
/// tokenization of the GGUF was checked against when the fixture was made) on the tokenizer
/// oracle's 293 strings, and a checkpoint whose logits are transformers'.
/// Fixtures: tests/data/gguf-*, made by scripts/make_gguf_fixtures.py resp.
/// scripts/make_gguf_fixtures_llamacpp.py. The quantized ones' logits are of gguf-py's
/// dequantization rounded to bf16 (as imports were then); the import keeps them exact now
/// (it keeps Q4_K and Q6_K blocks, which tests/gguf_blocks.rs checks), so the test rounds
/// them as the fixture did before converting. The F32 ones hold bf16 values, imported as
/// they are (Gemma's norms, less the 1, as f32).
/// And a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`, as llama.cpp's
/// converter writes Llama 2's) around a 2-layer Llama (tests/data/gguf-spm, made by
/// scripts/make_gguf_spm_fixture.py): the imported tokenizer must give the ids llama.cpp
/// gives for each of its 761 strings (the oracle's 293, 57 of spaces, tabs, newlines, CJK,
/// emoji and digits, 400 random ones of the vocabulary's pieces, 11 holding control tokens),
/// BOS first, and decode them to the text llama.cpp decodes them to.
#[test]
fn gguf_family_imports_match_transformers() {
    #[derive(Deserialize)]
    struct Oracle {
        cases: Vec<Case>,
    }
    #[derive(Deserialize)]
    struct Case {
        text: String,
    }
    let oracle = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../runtime/tests/data/tokenizer_oracle.json");
    let oracle: Oracle = serde_json::from_str(&std::fs::read_to_string(oracle).unwrap()).unwrap();
    for (variant, quantized) in [
        ("llama-bpe", true),
        ("qwen2", true),
        ("qwen3", true),
        ("gemma3", false),
        ("phi3", false),
        ("smollm3", false),
        ("spm", false),
    ] {
        let dir = data_dir(&format!("gguf-{variant}"));
        eprintln!("gguf-{variant}");
        let tmp = tempfile::tempdir().unwrap();
        let checkpoint = tmp.path().join("hf");
        let run = common::converter(&[&"import-gguf", &dir.join("model.gguf"), &checkpoint]);
        assert!(run.success, "{variant}: {}", run.stderr);

        let imported = tokenizers::Tokenizer::from_file(checkpoint.join("tokenizer.json")).unwrap();
        if dir.join("cases.json").exists() {
            assert_llama_cpp_tokenizes_alike(&imported, &dir.join("cases.json"), "model.gguf");
        } else {
            let source = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            for text in oracle.cases.iter().map(|c| c.text.as_str()) {
                let ids =
                    |t: &tokenizers::Tokenizer| t.encode(text, true).unwrap().get_ids().to_vec();
                assert_eq!(ids(&imported), ids(&source), "{variant}: {text:?}");
            }
        }

        let fixture = family_fixture(&dir);
        if quantized {
            rounded_to_bf16(&checkpoint);
        }
        convert_and_check(&checkpoint, &fixture);
    }
}

/// `tokenizer` encodes each string of `cases` (a fixture's cases.json: what llama.cpp did
/// with the GGUF `file`) to llama.cpp's ids, special tokens added as the file says, and
/// decodes the ids after the BOS it adds to the text llama.cpp decoded them to. Strings
/// holding a control token's text (`<s>`) are llama.cpp's with special tokens read (as the
/// runtime reads them), ids only.
fn assert_llama_cpp_tokenizes_alike(
    tokenizer: &tokenizers::Tokenizer,
    cases: &std::path::Path,
    file: &str,
) {
    #[derive(Deserialize)]
    struct Case {
        text: String,
        ids: Vec<u32>,
        /// None for a text holding control tokens' text (llama.cpp's ids with `special`).
        decoded: Option<String>,
    }
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cases).unwrap()).unwrap();
    let cases: Vec<Case> = serde_json::from_value(cases[file].clone()).unwrap();
    assert!(cases.len() >= 700, "{file}: {} cases", cases.len());
    let bos = tokenizer.token_to_id("<s>").unwrap();
    for case in &cases {
        let ids = tokenizer.encode(case.text.as_str(), true).unwrap();
        assert_eq!(ids.get_ids(), case.ids, "{file}: {:?}", case.text);
        if let Some(expected) = &case.decoded {
            let body = case.ids.strip_prefix(&[bos]).unwrap_or(&case.ids);
            let decoded = tokenizer.decode(body, true).unwrap();
            assert_eq!(&decoded, expected, "{file}: {:?} decoded", case.text);
        }
    }
}

/// The f32 checkpoint in `dir` rounded to bf16 (to nearest even, as PyTorch rounds), its
/// blocks file dropped: they stand for the values before rounding.
fn rounded_to_bf16(dir: &std::path::Path) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = (st.tensors().into_iter())
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            let rounded = (t.data().chunks_exact(4))
                .flat_map(|c| {
                    half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
                })
                .collect();
            (name, t.shape().to_vec(), rounded)
        })
        .collect();
    let views = (tensors.iter()).map(|(name, shape, data)| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), data);
        (name.clone(), view.unwrap())
    });
    safetensors::serialize_to_file(views, None, &path).unwrap();
    std::fs::remove_file(dir.join("blocks.safetensors")).unwrap();
}
