//! Embedding models against sentence-transformers: tiny random checkpoints saved as
//! sentence-transformers saves them (tests/data/embed-llama: a `LlamaModel`, mean pooling,
//! Normalize; tests/data/embed-qwen3: a `Qwen3Model`, last-token pooling, Matryoshka
//! sizes), converted and run by the runtime, must give the embeddings sentence-transformers
//! computed (within 1e-5 per element), from the same token ids. Made by
//! scripts/make_embedding_fixture.py (`made_by` in each embeddings.json names the versions).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use runtime::generate::{GenerateError, GenerateOptions, Generator};
use runtime::model::config::{Pooling, PoolingMode};
use runtime::text::tokenizer::Tokenizer;
use runtime::{FlexBackend, NdArrayBackend};
use serde::Deserialize;

/// A fixture's embeddings.json.
#[derive(Deserialize)]
struct Fixture {
    texts: Vec<String>,
    /// sentence-transformers' token ids of each text.
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
    /// embed-qwen3: with a Normalize module added, whole and cut to each size.
    #[serde(default)]
    normalized: Vec<Vec<f32>>,
    #[serde(default)]
    truncated_normalized: BTreeMap<usize, Vec<Vec<f32>>>,
}

const TOLERANCE: f32 = 1e-5;

fn data_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn fixture(dir: &Path) -> Fixture {
    serde_json::from_str(&std::fs::read_to_string(dir.join("embeddings.json")).unwrap()).unwrap()
}

/// Converts `src` into a new directory, which is returned with the artifact in it.
fn convert(src: &Path) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let run = common::converter(&[&"convert", &src, &out.path()]);
    assert!(run.success, "{}: {}", src.display(), run.stderr);
    out
}

/// Largest absolute difference between two vectors of the same length.
fn max_diff(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    (ours.iter().zip(reference))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Every text's embedding by `generator` (tokenized by the artifact's tokenizer, which must
/// give sentence-transformers' ids) against `expected`.
fn assert_embeds<B: runtime::model::backend::KernelBackend>(
    generator: &Generator<B>,
    tokenizer: &Tokenizer,
    fixture: &Fixture,
    dimensions: Option<usize>,
    expected: &[Vec<f32>],
    what: &str,
) {
    for (i, text) in fixture.texts.iter().enumerate() {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids, fixture.ids[i], "{what}: text {i}'s ids");
        let ours = generator.embed(&ids, dimensions).unwrap();
        let diff = max_diff(&ours, &expected[i]);
        assert!(diff <= TOLERANCE, "{what}: text {i} differs by {diff}");
    }
}

/// Both fixtures, on burn-flex at 1, 2 and 3 threads and on burn-ndarray, equal
/// sentence-transformers' embeddings; the artifact says how it pools.
#[test]
fn embeddings_match_sentence_transformers() {
    for (name, pooling, normalize) in [
        ("embed-llama", PoolingMode::Mean, true),
        ("embed-qwen3", PoolingMode::Last, false),
    ] {
        let src = data_dir(name);
        let fixture = fixture(&src);
        let out = convert(&src);
        let written = Pooling::from_file(&out.path().join("pooling.json"))
            .unwrap()
            .expect("an embedding model's artifact has pooling.json");
        assert_eq!(
            (written.pooling, written.normalize),
            (pooling, normalize),
            "{name}"
        );
        let verified = common::converter(&[&"verify", &out.path()]);
        assert!(verified.success, "{name}: {}", verified.stderr);
        let tokenizer = Tokenizer::from_dir(out.path()).unwrap();
        let flex = Generator::<FlexBackend>::load(out.path(), &Default::default()).unwrap();
        for threads in [1, 2, 3] {
            let what = format!("{name}, flex, {threads} threads");
            runtime::in_thread_pool(Some(threads), || {
                assert_embeds(
                    &flex,
                    &tokenizer,
                    &fixture,
                    None,
                    &fixture.embeddings,
                    &what,
                )
            })
            .unwrap();
        }
        let ndarray = Generator::<NdArrayBackend>::load(out.path(), &Default::default()).unwrap();
        let what = format!("{name}, ndarray");
        assert_embeds(
            &ndarray,
            &tokenizer,
            &fixture,
            None,
            &fixture.embeddings,
            &what,
        );
    }
}

/// A text's embedding is the same bits alone and among 15 others, before and after them.
#[test]
fn a_text_embeds_alike_alone_and_in_a_batch_of_16() {
    let src = data_dir("embed-llama");
    let fixture = fixture(&src);
    let out = convert(&src);
    let generator = Generator::<FlexBackend>::load(out.path(), &Default::default()).unwrap();
    runtime::in_thread_pool(Some(2), || {
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let alone: Vec<_> = (fixture.ids.iter())
            .map(|ids| bits(generator.embed(ids, None).unwrap()))
            .collect();
        let batch: Vec<&Vec<u32>> = fixture.ids.iter().cycle().take(16).collect();
        for (i, ids) in batch.iter().enumerate() {
            let among = bits(generator.embed(ids, None).unwrap());
            assert_eq!(among, alone[i % fixture.ids.len()], "text {i} of 16");
        }
    })
    .unwrap();
}

/// Without modules.json an embedding model pools by its last token, normalized (what
/// sentence-transformers gives with a Normalize module added); cut to a listed Matryoshka
/// size, each vector is cut then normalized; other sizes are refused.
#[test]
fn default_pooling_and_matryoshka_sizes() {
    let src = data_dir("embed-qwen3");
    let fixture = fixture(&src);
    // The checkpoint without its sentence-transformers modules.
    let bare = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() && path.file_name().unwrap() != "modules.json" {
            std::fs::copy(&path, bare.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let out = convert(bare.path());
    let written = Pooling::from_file(&out.path().join("pooling.json"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (written.pooling, written.normalize),
        (PoolingMode::Last, true)
    );
    assert_eq!(written.matryoshka_dimensions, [16, 32]);
    let tokenizer = Tokenizer::from_dir(out.path()).unwrap();
    let generator = Generator::<FlexBackend>::load(out.path(), &Default::default()).unwrap();
    runtime::in_thread_pool(Some(2), || {
        let normalized = &fixture.normalized;
        assert_embeds(
            &generator, &tokenizer, &fixture, None, normalized, "default",
        );
        assert_embeds(
            &generator,
            &tokenizer,
            &fixture,
            Some(64),
            normalized,
            "full size",
        );
        for (&d, expected) in &fixture.truncated_normalized {
            let what = format!("cut to {d}");
            assert_embeds(&generator, &tokenizer, &fixture, Some(d), expected, &what);
        }
        let refused = generator.embed(&fixture.ids[0], Some(8)).unwrap_err();
        assert!(
            matches!(refused, GenerateError::Dimensions { dimensions: 8, .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("[16, 32]"), "{refused}");
    })
    .unwrap();
}

/// An embedding model generates nothing and scores nothing: a clear error, not text made
/// from its embedding's rows.
#[test]
fn an_embedding_model_refuses_to_generate() {
    let out = convert(&data_dir("embed-llama"));
    let tokenizer = Tokenizer::from_dir(out.path()).unwrap();
    let generator = Generator::<FlexBackend>::load(out.path(), &Default::default()).unwrap();
    let options = GenerateOptions {
        max_new_tokens: 4,
        sampling: Default::default(),
        stop: Vec::new(),
        grammar: None,
    };
    let generated = generator.generate(&tokenizer, &[1, 5, 6], &options, |_| {});
    let error = generated.unwrap_err().to_string();
    assert!(error.contains("embedding model"), "{error}");
    let scored = generator.perplexity(&[1, 5, 6]).unwrap_err().to_string();
    assert!(scored.contains("embedding model"), "{scored}");
}

/// What the runtime does not compute is refused at conversion, by name: another pooling
/// mode, a module after the pooling.
#[test]
fn unsupported_sentence_transformers_modules_are_refused() {
    let src = data_dir("embed-llama");
    for (file, text, named) in [
        (
            "1_Pooling/config.json",
            r#"{"embedding_dimension": 64, "pooling_mode": "max"}"#,
            "\"max\"",
        ),
        (
            "modules.json",
            r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
            "Dense",
        ),
    ] {
        let copy = tempfile::tempdir().unwrap();
        copy_tree(&src, copy.path());
        std::fs::write(copy.path().join(file), text).unwrap();
        let out = tempfile::tempdir().unwrap();
        let run = common::converter(&[&"convert", &copy.path(), &out.path().join("a")]);
        assert!(!run.success, "{file} accepted");
        assert!(run.stderr.contains(named), "{file}: {}", run.stderr);
        assert!(
            !out.path().join("a").exists(),
            "{file}: an artifact was written"
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
