//! model.bpk (`convert --burnpack`): Burn's own burnpack bytes for the record's parameters,
//! listed in the manifest and checked by `verify`; the runtime loads it when there is no
//! weights file, to the bit as from the other two.

mod common;

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::Recorder;
use burn_store::{BurnpackStore, ModuleSnapshot};
use common::{converter, drop_weights_file, logits, write_json};
use runtime::generate::Generator;
use runtime::model::config::LlamaConfig;
use runtime::weights::burnpack::Burnpack;
use runtime::weights::layout::Weights;
use runtime::weights::manifest::ArtifactRecorder;
use runtime::{FlexBackend, NdArrayBackend};

const BPK: &str = "model.bpk";

fn data_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// `fixture` converted with `--burnpack` into `tmp/out`.
fn converted(tmp: &Path, fixture: &str) -> PathBuf {
    let out = tmp.join("out");
    let run = converter(&[&"convert", &data_dir(fixture), &out, &"--burnpack"]);
    assert!(run.success, "{fixture}: {}", run.stderr);
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

fn drop_file(dir: &Path, name: &str) {
    std::fs::remove_file(dir.join(name)).unwrap();
    let path = dir.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["files"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != name);
    write_json(&path, &manifest);
}

/// The record loaded by Burn's own recorder into the model, saved by Burn's own
/// `BurnpackStore`: the converter's model.bpk, streamed a tensor at a time from the record,
/// is those bytes. tiny: f32, untied; tiny-llama3: bf16 values, tied (lm_head stored, as in
/// the record), q/k/v/o and MLP biases.
#[test]
fn model_bpk_is_what_burnpack_store_saves_for_the_record() {
    for fixture in ["tiny", "tiny-llama3"] {
        let tmp = tempfile::tempdir().unwrap();
        let out = converted(tmp.path(), fixture);
        let config = LlamaConfig::from_file(&out.join("config.json")).unwrap();
        let device = Default::default();
        let record = ArtifactRecorder::new()
            .load(out.join("model.mpk"), &device)
            .unwrap();
        let model = config.init::<FlexBackend>(&device).load_record(record);
        let expected = tmp.path().join("burn-store.bpk");
        let mut store = BurnpackStore::from_file(&expected);
        model.save_into(&mut store).unwrap();
        let written = std::fs::read(out.join(BPK)).unwrap();
        assert!(
            written == std::fs::read(&expected).unwrap(),
            "{fixture}: model.bpk differs from BurnpackStore's"
        );
        // Every parameter, f32, by the record's paths (the runtime's reader agrees).
        let pack = Burnpack::open(&out.join(BPK)).unwrap();
        let record = runtime::weights::record::Record::open(&out.join("model.mpk")).unwrap();
        let mut paths = record.param_paths();
        paths.sort();
        assert_eq!(pack.paths(), paths, "{fixture}");
        for path in &paths {
            let (entry, stored) = (pack.entry(path).unwrap(), record.param(path).unwrap());
            assert_eq!(entry.shape, stored.shape, "{path}");
            assert!(pack.bytes(entry) == stored.bytes, "{fixture}: {path}");
        }
    }
}

/// model.bpk is in the manifest; `verify` names it when a byte of a tensor or of its
/// header changes; converting again without `--burnpack` removes it.
#[test]
fn verify_catches_a_changed_byte_in_model_bpk() {
    let tmp = tempfile::tempdir().unwrap();
    let out = converted(tmp.path(), "tiny-llama3");
    let manifest = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"model.bpk\""));
    assert!(converter(&[&"verify", &out]).success);
    let original = std::fs::read(out.join(BPK)).unwrap();
    // The last byte is a value of the last tensor; byte 6 is the metadata's length.
    for at in [original.len() - 1, 6] {
        let mut bytes = original.clone();
        bytes[at] ^= 1;
        std::fs::write(out.join(BPK), &bytes).unwrap();
        let run = converter(&[&"verify", &out]);
        assert!(!run.success, "byte {at}");
        assert!(run.stderr.contains("model.bpk: sha256"), "{}", run.stderr);
    }
    std::fs::write(out.join(BPK), &original).unwrap();
    let run = converter(&[&"convert", &data_dir("tiny-llama3"), &out]);
    assert!(run.success, "{}", run.stderr);
    assert!(!out.join(BPK).exists());
    let manifest = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    assert!(!manifest.contains("model.bpk"));
}

/// Loaded through weights.bin, through model.bpk (no weights file; the record overwritten
/// with zeros, so nothing can come from it) and through the record alone: the same matrices
/// kept as the same types and the same logits to the bit, for every `Weights` on
/// burn-flex and on burn-ndarray.
#[test]
fn model_bpk_gives_the_logits_of_the_record_and_the_weights_file() {
    for fixture in ["tiny", "tiny-llama3", "tiny-linear"] {
        let tmp = tempfile::tempdir().unwrap();
        let laid_out = converted(tmp.path(), fixture);
        let (burnpack, record) = (tmp.path().join("bpk"), tmp.path().join("record"));
        copy_dir(&laid_out, &burnpack);
        drop_weights_file(&burnpack);
        let mpk = burnpack.join("model.mpk");
        let len = std::fs::metadata(&mpk).unwrap().len() as usize;
        std::fs::write(&mpk, vec![0u8; len]).unwrap();
        copy_dir(&laid_out, &record);
        drop_weights_file(&record);
        drop_file(&record, BPK);
        for weights in [Weights::Auto, Weights::F32, Weights::Bf16] {
            let load = |dir: &Path| {
                let generator =
                    Generator::<FlexBackend>::load_with(dir, &Default::default(), weights).unwrap();
                (generator.kept, logits(&generator))
            };
            let from_record = load(&record);
            assert!(load(&burnpack) == from_record, "{fixture}, {weights}");
            assert!(load(&laid_out) == from_record, "{fixture}, {weights}");
        }
        let ndarray = |dir: &Path| {
            logits(&Generator::<NdArrayBackend>::load(dir, &Default::default()).unwrap())
        };
        assert!(ndarray(&burnpack) == ndarray(&record), "{fixture}: ndarray");
    }
}

/// The converter's model.bpk cut anywhere in its header, metadata or data: opening it is one
/// message, and loading the artifact (the manifest's size edited to match) too.
#[test]
fn a_truncated_model_bpk_is_one_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = converted(tmp.path(), "tiny");
    drop_weights_file(&out);
    let whole = std::fs::read(out.join(BPK)).unwrap();
    let metadata_end = 10 + u32::from_le_bytes(whole[6..10].try_into().unwrap()) as usize;
    for len in [0, 9, 10, metadata_end - 1, metadata_end, whole.len() - 1] {
        std::fs::write(out.join(BPK), &whole[..len]).unwrap();
        let error = Burnpack::open(&out.join(BPK)).err();
        let error = error.unwrap_or_else(|| panic!("{len} bytes opened"));
        assert!(error.starts_with("truncated: "), "{len}: {error}");
        let path = out.join("manifest.json");
        let mut manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for file in manifest["files"].as_array_mut().unwrap() {
            if file["name"] == BPK {
                file["bytes"] = len.into();
            }
        }
        write_json(&path, &manifest);
        let error = Generator::<FlexBackend>::load(&out, &Default::default()).err();
        let error = error.expect("a truncated model.bpk loaded").to_string();
        assert!(
            error.contains("model.bpk: cannot load the weights: the file is corrupt (truncated: "),
            "{len}: {error}"
        );
        assert!(!error.contains('\n'), "{error}");
    }
}
