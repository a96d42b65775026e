//! The weights file against the record it is laid out from, and every corruption refused
//! with its own error.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::record::Recorder;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, bf16};
use serde_json::{Value, json};

use super::*;
use crate::model::config::{Biases, LlamaConfig};
use crate::model::params::params;
use crate::model::testing::Randomize;
use crate::weights::layout::Kept;
use crate::weights::load::{Source, check_laid_out, load_into};
use crate::weights::manifest::ArtifactRecorder;

type B = crate::FlexBackend;

fn config(tied: bool) -> LlamaConfig {
    LlamaConfig {
        biases: Biases {
            qkv: true,
            o: false,
            mlp: true,
        },
        tie_word_embeddings: tied,
        ..LlamaConfig::plain([8, 16, 2], [2, 1, 4], 10, 16)
    }
}

/// Rounds every matrix but the gate and up projections (`[8, 16]`) to bf16 values, so the
/// file holds both dtypes: exact bf16 matrices, f32 ones, f32 vectors.
struct MostlyBf16;

impl<B: Backend> ModuleMapper<B> for MostlyBf16 {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let [rows, cols] = match param.lazy_shape().as_slice() {
            &[rows, cols] if cols != 16 => [rows, cols],
            _ => return param,
        };
        param.map(|t| {
            let values: Vec<f32> = (t.into_data().into_vec::<f32>().unwrap().into_iter())
                .map(|v| bf16::from_f32(v).to_f32())
                .collect();
            Tensor::from_data(TensorData::new(values, [rows, cols]), &Default::default())
        })
    }
}

/// A random model of `config`, its record (in `dir`) and weights file, and the record's
/// length.
fn write_model(dir: &Path, config: &LlamaConfig) -> (Record, Vec<u8>, u64) {
    let device = Default::default();
    let model = config.init::<B>(&device).map(&mut Randomize(7));
    let mut model = model.map(&mut MostlyBf16);
    if config.tie_word_embeddings {
        // The converter writes a tied lm_head as the embedding transposed.
        let embedding = model.embed_tokens.weight.val();
        model.lm_head.weight = model.lm_head.weight.map(|_| embedding.transpose());
    }
    let path = dir.join("model.mpk");
    ArtifactRecorder::new()
        .record(model.into_record(), path.clone())
        .unwrap();
    let record = Record::open(&path).unwrap();
    let record_bytes = std::fs::metadata(&path).unwrap().len();
    let id = RecordId {
        bytes: record_bytes,
        sha256: SHA256.into(),
    };
    let declared = params(&config.init::<B>(&device));
    let mut bytes = Vec::new();
    write(
        &record,
        id,
        &declared,
        config.tie_word_embeddings,
        &HashMap::new(),
        &mut bytes,
    )
    .unwrap();
    (record, bytes, record_bytes)
}

/// What the tests say the record's sha256 is.
const SHA256: &str = "5e";

/// Every parameter of `model`: path, dtype and shape, values' bytes.
fn snapshot<B: Backend>(model: &crate::model::llama::Llama<B>) -> Vec<(String, String, Vec<u8>)> {
    struct Snapshot(
        Vec<(String, String, Vec<u8>)>,
        crate::model::params::FieldPath,
    );
    impl<B: Backend> ModuleVisitor<B> for Snapshot {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.1.enter(name, container_type);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.1.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data();
            let what = format!("{:?} {:?}", data.dtype, data.shape);
            self.0.push((self.1.path(), what, data.as_bytes().to_vec()));
        }
    }
    let mut visitor = Snapshot(Vec::new(), Default::default());
    model.visit(&mut visitor);
    visitor.0
}

/// Loading through the weights file keeps every parameter exactly as loading the record
/// does, with each `Weights`, tied or not, with biases, on both backends.
#[test]
fn the_weights_file_loads_what_the_record_loads() {
    for tied in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(tied);
        let (record, bytes, _) = write_model(dir.path(), &config);
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, &bytes).unwrap();
        let file = WeightsFile::open(&path).unwrap();
        let device = Default::default();
        let stored = file.index().tensors.len();
        assert_eq!(
            stored,
            params(&config.init::<B>(&device)).len() - usize::from(tied)
        );
        for weights in [Weights::Auto, Weights::F32, Weights::Bf16] {
            let load = |source| {
                load_into(source, config.init::<B>(&device), tied, weights, &device).unwrap()
            };
            let (from_record, kept) = load(Source::Record(&record));
            let (from_file, kept_from_file) = load(Source::LaidOut(&file));
            // Only tensors used where they lie are over the map.
            assert_eq!(kept_from_file.mapped, weights == Weights::Auto);
            let kept_from_file = Kept {
                mapped: false,
                ..kept_from_file
            };
            assert_eq!(kept, kept_from_file, "tied {tied}, {weights}");
            assert_eq!(
                snapshot(&from_record),
                snapshot(&from_file),
                "tied {tied}, {weights}"
            );
            // The embedding, lm_head unless tied, 7 projections a layer; 4 of them f32.
            let matrices = 2 + 7 * 2 - usize::from(tied);
            let expected = match weights {
                Weights::Auto => Kept {
                    bf16: matrices - 4,
                    f32: 4,
                    rounded: 0,
                    ..Kept::default()
                },
                Weights::F32 => Kept {
                    bf16: 0,
                    f32: matrices,
                    rounded: 0,
                    ..Kept::default()
                },
                Weights::Bf16 => Kept {
                    bf16: matrices,
                    f32: 0,
                    rounded: 4,
                    ..Kept::default()
                },
                Weights::Blocks(_) => unreachable!("not among the cases"),
            };
            assert_eq!(kept, expected, "tied {tied}, {weights}");
        }
        // A backend without bf16 weights gets f32 either way.
        let ndarray = |source| {
            let device = Default::default();
            let model = config.init::<crate::NdArrayBackend>(&device);
            let (model, kept) = load_into(source, model, tied, Weights::Auto, &device).unwrap();
            (snapshot(&model), kept)
        };
        let (from_record, kept) = ndarray(Source::Record(&record));
        assert_eq!((kept.bf16, kept.rounded), (0, 0));
        assert_eq!(ndarray(Source::LaidOut(&file)), (from_record, kept));
    }
}

/// The same record gives the same bytes.
#[test]
fn writing_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let (record, bytes, record_bytes) = write_model(dir.path(), &config(false));
    let id = RecordId {
        bytes: record_bytes,
        sha256: SHA256.into(),
    };
    let declared = params(&config(false).init::<B>(&Default::default()));
    let mut again = Vec::new();
    let none = HashMap::new();
    write(&record, id.clone(), &declared, false, &none, &mut again).unwrap();
    let mut third = Vec::new();
    write(&record, id, &declared, false, &none, &mut third).unwrap();
    assert_eq!(again, third);
    assert_eq!(bytes, again);
}

/// `bytes` with its index edited by `edit` and the header and padding rewritten to fit:
/// the data stays where the index's offsets, relative to it, place it.
fn with_index(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let index_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    let data_start = (HEADER + index_len).next_multiple_of(ALIGN);
    let mut index: Value = serde_json::from_slice(&bytes[HEADER..HEADER + index_len]).unwrap();
    edit(&mut index);
    let index = serde_json::to_vec(&index).unwrap();
    let mut out = bytes[..16].to_vec();
    out.extend((index.len() as u64).to_le_bytes());
    out.extend(&index);
    out.resize((HEADER + index.len()).next_multiple_of(ALIGN), 0);
    out.extend(&bytes[data_start..]);
    out
}

/// `bytes` opened as a weights file and checked against the model and the record (of
/// `record_bytes`), as loading does.
fn check(dir: &Path, bytes: &[u8], record_bytes: u64) -> Result<(), String> {
    let path = dir.join("weights.bin");
    std::fs::write(&path, bytes).unwrap();
    let file = WeightsFile::open(&path)?;
    let declared = params(&config(false).init::<B>(&Default::default()));
    check_laid_out(&file, &declared, false)?;
    file.check_record(record_bytes, SHA256)
}

#[test]
fn every_corruption_is_refused_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_record, good, record_bytes) = write_model(dir.path(), &config(false));
    assert_eq!(check(dir.path(), &good, record_bytes), Ok(()));
    let tensor = |i: usize| format!("/tensors/{i}");
    let set = |pointer: String, value: Value| {
        move |index: &mut Value| *index.pointer_mut(&pointer).unwrap() = value
    };
    let entry = |index: &Value, i: usize, field: &str| {
        index
            .pointer(&format!("{}/{field}", tensor(i)))
            .unwrap()
            .clone()
    };
    let index: Value = {
        let len = u64::from_le_bytes(good[16..24].try_into().unwrap()) as usize;
        serde_json::from_slice(&good[HEADER..HEADER + len]).unwrap()
    };
    let last = index["tensors"].as_array().unwrap().len() - 1;
    let mut version = good.clone();
    version[8] = 3;
    let mut trailing = good.clone();
    trailing.extend([0; 3]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "truncated: 10 bytes, shorter than the 24-byte header",
            good[..10].to_vec(),
        ),
        ("not a weights file", [b"RTWEIGHS", &good[8..]].concat()),
        (
            "version 3, this runtime reads versions 1 to 2: convert again",
            version,
        ),
        (
            "truncated: the header announces a",
            [&good[..16], &u64::MAX.to_le_bytes(), &good[24..]].concat(),
        ),
        ("truncated: ", good[..good.len() - 100].to_vec()),
        ("3 bytes follow the last tensor", trailing),
        (
            "its index is not valid",
            with_index(&good, |i| i["tensors"] = json!(7)),
        ),
        (
            "its index is not valid: embed_tokens.weight has dtype \"f16\", which this runtime does not read (it reads f32, bf16, q4_0, q5_0, q8_0, q4_k, q6_k)",
            with_index(&good, set(tensor(0) + "/dtype", json!("f16"))),
        ),
        (
            "its index is not valid: unknown field `extra`",
            with_index(&good, |i| i["extra"] = json!(1)),
        ),
        (
            "ends past the file",
            with_index(&good, set(tensor(last) + "/offset", json!(1u64 << 40))),
        ),
        (
            "not a multiple of 4096",
            with_index(&good, set(tensor(last) + "/offset", json!(12))),
        ),
        (
            "inside the tensor before it",
            with_index(
                &good,
                set(tensor(last) + "/offset", entry(&index, last - 1, "offset")),
            ),
        ),
        (
            "needs",
            with_index(&good, set(tensor(0) + "/bytes", json!(4))),
        ),
        (
            "holds 0 bytes, its shape [4611686018427387904, 8] of bf16 needs more than 2^64",
            with_index(&good, |i| {
                i["tensors"][0]["shape"] = json!([1u64 << 62, 8]);
                i["tensors"][0]["bytes"] = json!(0);
            }),
        ),
        (
            "norm.gamma is a vector stored as bf16",
            with_index(&good, |i| {
                let norm = (i["tensors"].as_array().unwrap().iter())
                    .position(|t| t["path"] == "norm.gamma")
                    .unwrap();
                let t = &mut i["tensors"][norm];
                t["dtype"] = json!("bf16");
                t["bytes"] = json!(t["bytes"].as_u64().unwrap() / 2);
            }),
        ),
        (
            "embed_tokens.weight is listed twice",
            with_index(&good, |i| {
                i["tensors"][1]["path"] = i["tensors"][0]["path"].clone();
            }),
        ),
        (
            "layers.0.self_attn.q_proj.weight has shape [4, 16] (stored transposed as [16, 4]), config.json implies [8, 8]",
            with_index(&good, |i| {
                let q = (i["tensors"].as_array().unwrap().iter())
                    .position(|t| t["path"] == "layers.0.self_attn.q_proj.weight")
                    .unwrap();
                i["tensors"][q]["shape"] = json!([16, 4]);
            }),
        ),
        (
            "weights.bin holds 1 parameter config.json does not declare (lm_head.weights); config.json declares 1 parameter weights.bin lacks (lm_head.weight): config.json and weights.bin disagree",
            with_index(&good, |i| {
                let tensors = i["tensors"].as_array_mut().unwrap();
                let lm_head = tensors.iter_mut().find(|t| t["path"] == "lm_head.weight");
                lm_head.unwrap()["path"] = json!("lm_head.weights");
            }),
        ),
        (
            "weights.bin holds 1 parameter config.json does not declare (layers.2.mlp.up_proj.weight)",
            with_index(&good, |i| {
                i["tensors"][last]["path"] = json!("layers.2.mlp.up_proj.weight");
            }),
        ),
        (
            "it was laid out from a record of",
            with_index(&good, |i| i["record"]["sha256"] = json!("ff")),
        ),
    ];
    for (expected, bytes) in cases {
        let error = check(dir.path(), &bytes, record_bytes).unwrap_err();
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
    // Version 1, from before the block types, is read as it is.
    let mut version_1 = good.clone();
    version_1[8] = 1;
    assert_eq!(check(dir.path(), &version_1, record_bytes), Ok(()));
    let error = check(dir.path(), &good, record_bytes + 1).unwrap_err();
    assert!(
        error.contains("left from another conversion; convert again"),
        "{error}"
    );
}

/// On burn-flex a tensor kept as stored is the file's bytes over the map, not a copy; the
/// map is read-only, and a write to such a tensor copies it first (a write through would
/// fault, or change the file under every other reader).
#[test]
fn tensors_lie_over_the_map_and_are_copied_before_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(false);
    let (_record, bytes, _) = write_model(dir.path(), &config);
    let path = dir.path().join("weights.bin");
    std::fs::write(&path, &bytes).unwrap();
    let file = WeightsFile::open(&path).unwrap();
    let device = Default::default();
    let model = config.init::<B>(&device);
    let (model, _) =
        load_into(Source::LaidOut(&file), model, false, Weights::Auto, &device).unwrap();
    let entry = file.entry("embed_tokens.weight").unwrap();
    let mapped = file.bytes(entry);
    let embedding = model.embed_tokens.weight.val().into_primitive().tensor();
    drop(model);
    assert_eq!(embedding.bytes().as_ptr(), mapped.as_ptr());
    let before = mapped.to_vec();
    let mut embedding = embedding;
    assert!(embedding.is_unique());
    embedding.storage_mut::<bf16>()[0] = bf16::from_f32(42.0);
    assert_ne!(embedding.bytes().as_ptr(), mapped.as_ptr());
    assert_eq!(embedding.storage::<bf16>()[0], bf16::from_f32(42.0));
    assert_eq!(mapped[..], before[..]);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

mod blocks;

/// `--mmap` maps and `--no-mmap` copies whatever fits in the memory available (and refuses
/// more, naming both sizes); by default a file copies when it takes at most half the memory
/// available, so one larger than memory is mapped.
#[test]
fn weights_memory_copies_what_fits() {
    assert_eq!(
        WeightsMemory::from_flags(true, false).copies(u64::MAX),
        Ok(false)
    );
    let copied = WeightsMemory::from_flags(false, true);
    assert_eq!(copied.copies(1 << 20), Ok(true));
    let refused = copied.copies(u64::MAX).unwrap_err();
    assert!(
        refused.contains("more than the") && refused.contains("--mmap"),
        "{refused}"
    );
    let auto = WeightsMemory::from_flags(false, false);
    assert_eq!(auto, WeightsMemory::default());
    let available = crate::util::memory::available().expect("a /proc/meminfo");
    assert_eq!(auto.copies(1 << 20), Ok(true));
    assert_eq!(auto.copies(available), Ok(false));
}
