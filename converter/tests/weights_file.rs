//! weights.bin, the parameters laid out once by `convert`: loading through it gives the
//! logits loading the record gives, to the bit, for every `Weights`; `verify` checks it;
//! an artifact without one (from an older converter) loads from the record.

mod common;

use std::path::Path;

use common::{converted_tiny, converter, drop_weights_file, logits, write_json};
use runtime::generate::Generator;
use runtime::util::file_names::WEIGHTS_FILE;
use runtime::weights::artifact::load_model;
use runtime::weights::layout::Weights;
use runtime::{FlexBackend, NdArrayBackend};

fn data_dir(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Copies the artifact in `from` to `to` without its weights file, as an older converter
/// wrote it: the manifest does not list one.
fn record_only(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
    drop_weights_file(to);
}

fn edit_manifest(out: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = out.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut manifest);
    write_json(&path, &manifest);
}

/// Each fixture converted, loaded through weights.bin and, from a copy without it, through
/// the record: the same matrices kept as the same types and the same logits to the bit,
/// with `Weights::Auto`, `F32` and `Bf16` on burn-flex and with burn-ndarray (f32 weights).
/// tiny: f32 (so `Auto` keeps f32 and `Bf16` rounds), untied; tiny-llama3: bf16, tied,
/// with q/k/v/o and MLP biases; tiny-linear: bf16, untied.
#[test]
fn the_weights_file_gives_the_record_s_logits_to_the_bit() {
    for fixture in ["tiny", "tiny-llama3", "tiny-linear"] {
        let tmp = tempfile::tempdir().unwrap();
        let (laid_out, record) = (tmp.path().join("laid-out"), tmp.path().join("record"));
        let run = converter(&[&"convert", &data_dir(fixture), &laid_out]);
        assert!(run.success, "{fixture}: {}", run.stderr);
        assert!(laid_out.join(WEIGHTS_FILE).is_file());
        record_only(&laid_out, &record);
        for weights in [Weights::Auto, Weights::F32, Weights::Bf16] {
            let load = |dir: &Path| {
                let generator =
                    Generator::<FlexBackend>::load_with(dir, &Default::default(), weights).unwrap();
                (generator.kept, logits(&generator))
            };
            let (kept, from_record) = load(&record);
            let (kept_laid_out, from_file) = load(&laid_out);
            assert_eq!(kept, kept_laid_out, "{fixture}, {weights}");
            assert!(
                from_record == from_file,
                "{fixture}, {weights}: logits differ"
            );
            match (fixture, weights) {
                ("tiny", Weights::Bf16) => assert!(kept.rounded > 0, "{kept:?}"),
                (_, Weights::F32) | ("tiny", _) => assert_eq!(kept.bf16, 0, "{kept:?}"),
                _ => assert_eq!(kept.f32, 0, "{fixture}, {weights}: {kept:?}"),
            }
        }
        let ndarray = |dir: &Path| {
            logits(&Generator::<NdArrayBackend>::load(dir, &Default::default()).unwrap())
        };
        assert!(ndarray(&record) == ndarray(&laid_out), "{fixture}: ndarray");
    }
}

#[test]
fn converting_twice_gives_the_same_weights_file() {
    let tmp = tempfile::tempdir().unwrap();
    for out in ["a", "b"] {
        let run = converter(&[&"convert", &data_dir("tiny-llama3"), &tmp.path().join(out)]);
        assert!(run.success, "{}", run.stderr);
    }
    let read = |out: &str| std::fs::read(tmp.path().join(out).join(WEIGHTS_FILE)).unwrap();
    assert_eq!(read("a"), read("b"));
}

#[test]
fn verify_names_a_changed_weights_file() {
    let (_tmp, _src, out) = converted_tiny();
    assert!(converter(&[&"verify", &out]).success);
    let path = out.join(WEIGHTS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let run = converter(&[&"verify", &out]);
    assert!(!run.success);
    assert!(run.stderr.contains("weights.bin: sha256"), "{}", run.stderr);
}

/// A weights file whose manifest entry was updated to match it (as by hand) is still
/// checked as loading checks it: `verify` and loading name what is wrong.
#[test]
fn verify_and_loading_check_a_relisted_weights_file() {
    let (_tmp, _src, out) = converted_tiny();
    let path = out.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).unwrap();
    // The record the index names: one byte of its sha256 changed.
    let at = bytes.windows(8).position(|w| w == b"\"sha256\"").unwrap() + 10;
    let mut edited = bytes.clone();
    edited[at] = if edited[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(&path, &edited).unwrap();
    let digest = converter::digest::digests(&out, std::iter::once(WEIGHTS_FILE.to_string()));
    let digest = serde_json::to_value(&digest.unwrap()[0]).unwrap();
    edit_manifest(&out, |m| {
        for file in m["files"].as_array_mut().unwrap() {
            if file["name"] == WEIGHTS_FILE {
                *file = digest.clone();
            }
        }
    });
    let expected = "left from another conversion; convert again";
    let run = converter(&[&"verify", &out]);
    assert!(!run.success);
    assert!(run.stderr.contains(expected), "{}", run.stderr);
    let error = load_model::<FlexBackend>(&out, &Default::default()).unwrap_err();
    let error = error.to_string();
    assert!(
        error.contains("weights.bin: cannot load the weights: it was laid out from a record"),
        "{error}"
    );
    assert!(error.contains(expected), "{error}");
}

/// An artifact from before weights.bin loads from its record; one listing a weights file
/// that is missing, or holding one it does not list, is refused.
#[test]
fn the_manifest_decides_whether_the_weights_file_is_read() {
    let (tmp, _src, out) = converted_tiny();
    let older = tmp.path().join("older");
    record_only(&out, &older);
    assert!(converter(&[&"verify", &older]).success);
    assert!(load_model::<FlexBackend>(&older, &Default::default()).is_ok());

    std::fs::copy(out.join(WEIGHTS_FILE), older.join(WEIGHTS_FILE)).unwrap();
    let error = load_model::<FlexBackend>(&older, &Default::default()).unwrap_err();
    assert!(
        error.to_string().contains("left from another conversion"),
        "{error}"
    );

    std::fs::remove_file(out.join(WEIGHTS_FILE)).unwrap();
    let error = load_model::<FlexBackend>(&out, &Default::default()).unwrap_err();
    assert!(error.to_string().contains("weights.bin"), "{error}");
    assert!(!converter(&[&"verify", &out]).success);
}
