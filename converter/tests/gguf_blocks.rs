//! A quantized GGUF's blocks kept, end to end: `import-gguf` then `convert` store every
//! projection of a type the runtime keeps (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K) in weights.bin as
//! the GGUF's own bytes (q/k rows moved back to Hugging Face's order, whole), the record
//! holding exactly their values; the runtime on the blocks gives the logits it gives on
//! those values, to the bit; and a blocks file that does not stand for the checkpoint is
//! refused with one error.
//!
//! Fixtures, each made by llama.cpp's own quantizer (`llama_model_quantize`):
//! tests/data/gguf-q8_0 (Q8_0, tied) and gguf-q4_0 (Q4_0 and a Q6_K lm_head), made by
//! scripts/make_gguf_block_fixtures.py; gguf-llama-bpe (Q4_K and Q6_K, attention biases)
//! and gguf-qwen2 (Q3_K, Q4_K, Q5_K, Q6_K: some kept, some not), by
//! scripts/make_gguf_fixtures.py.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{converter, logits};
use converter::gguf::Gguf;
use converter::import::hf_name;
use converter::quants::GgmlType;
use kernels::int8::Matmul;
use runtime::FlexBackend;
use runtime::generate::Generator;
use runtime::util::file_names::WEIGHTS_FILE;
use runtime::weights::file::{Dtype, WeightsFile};
use runtime::weights::layout::Weights;

fn data_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// `fixture`'s GGUF imported into `dir/hf` and converted into `dir/out`.
fn imported(fixture: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let (hf, out) = (dir.join("hf"), dir.join("out"));
    let run = converter(&[&"import-gguf", &data_dir(fixture).join("model.gguf"), &hf]);
    assert!(run.success, "{fixture}: {}", run.stderr);
    let run = converter(&[&"convert", &hf, &out]);
    assert!(run.success, "{fixture}: {}", run.stderr);
    (hf, out)
}

/// Rows of `row_len` elements moved from llama.cpp's q/k order to Hugging Face's: within
/// each head of `rows / heads` rows, GGUF row `2j + i` is HF row `i * half + j`.
fn unpermuted(data: &[u8], row_len: usize, heads: usize) -> Vec<u8> {
    let rows = data.len() / row_len;
    let head_dim = rows / heads;
    let mut out = vec![0; data.len()];
    for (gguf_row, row) in data.chunks_exact(row_len).enumerate() {
        let (head, within) = (gguf_row / head_dim, gguf_row % head_dim);
        let hf_row = head * head_dim + (within % 2) * head_dim / 2 + within / 2;
        out[hf_row * row_len..][..row_len].copy_from_slice(row);
    }
    out
}

const FIXTURES: [&str; 4] = ["gguf-q8_0", "gguf-q4_0", "gguf-llama-bpe", "gguf-qwen2"];

/// How many matrices of each fixture are of a kept type: all 14 projections of gguf-q8_0's
/// two layers and its Q8_0 embedding (lm_head tied), gguf-q4_0's 7, its Q6_K lm_head and Q4_0
/// embedding, gguf-llama-bpe's 7, lm_head and Q4_K embedding, gguf-qwen2's two Q4_K and its
/// Q6_K lm_head (its Q3_K and Q5_K, the embedding among them, are not kept).
const KEPT: [usize; 4] = [15, 9, 9, 3];

/// Every projection of a kept type is in weights.bin as its type, its bytes the GGUF's (rows
/// unpermuted for a Llama's q and k); every other matrix as values; the checkpoint f32.
#[test]
fn import_and_convert_keep_every_block_bit_for_bit() {
    for (fixture, expected) in FIXTURES.into_iter().zip(KEPT) {
        let tmp = tempfile::tempdir().unwrap();
        let (hf, out) = imported(fixture, tmp.path());
        let gguf = Gguf::open(&data_dir(fixture).join("model.gguf")).unwrap();
        let llama = gguf.str("general.architecture").unwrap() == "llama";
        let heads = |key: &str| gguf.u64(&format!("llama.attention.{key}")).unwrap() as usize;
        let file = WeightsFile::open(&out.join(WEIGHTS_FILE)).unwrap();
        let mut kept = 0;
        // Matrices: vectors (norms, biases) are F32 in every GGUF and f32 in weights.bin.
        for info in gguf.tensors.iter().filter(|t| t.dims.len() == 2) {
            let name = hf_name(&info.name).unwrap();
            let path = name.strip_prefix("model.").unwrap_or(&name);
            let Some(entry) = file.entry(path) else {
                panic!("{fixture}: {path} is not in weights.bin");
            };
            let ty = match info.ggml_type {
                GgmlType::Blocks(ty) if ty.kept() => Some(ty),
                _ => None,
            };
            match ty {
                Some(ty) => {
                    kept += 1;
                    assert_eq!(entry.dtype, Dtype::Blocks(ty), "{fixture}: {path}");
                    let raw = gguf.raw(info);
                    let row_len = raw.len() / info.dims[1] as usize;
                    let expected = match info.name.rsplit('.').nth(1) {
                        Some("attn_q") if llama => unpermuted(raw, row_len, heads("head_count")),
                        Some("attn_k") if llama => unpermuted(raw, row_len, heads("head_count_kv")),
                        _ => raw.to_vec(),
                    };
                    assert!(file.bytes(entry) == expected, "{fixture}: {path}");
                }
                None => assert!(
                    matches!(entry.dtype, Dtype::F32 | Dtype::Bf16),
                    "{fixture}: {path} is {}",
                    entry.dtype
                ),
            }
        }
        assert_eq!(kept, expected, "{fixture}: tensors kept as blocks");
        let checkpoint = std::fs::read(hf.join("model.safetensors")).unwrap();
        let checkpoint = safetensors::SafeTensors::deserialize(&checkpoint).unwrap();
        for (name, tensor) in checkpoint.tensors() {
            assert_eq!(tensor.dtype(), safetensors::Dtype::F32, "{fixture}: {name}");
        }
        // The artifact holds no copy of the blocks file; its manifest names it as a source.
        assert!(!out.join("blocks.safetensors").exists());
        let manifest = std::fs::read_to_string(out.join("manifest.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        let names = |key: &str| -> Vec<String> {
            (manifest[key].as_array().unwrap().iter())
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert!(!names("files").contains(&"blocks.safetensors".to_string()));
        assert!(names("source").contains(&"blocks.safetensors".to_string()));
        assert!(converter(&[&"verify", &out, &"--source", &hf]).success);
    }
}

/// The artifact loaded with `Weights::Auto` computes on the GGUF's blocks (kept over the
/// map), with `Weights::F32` on their decoded values: with `Matmul::Exact` the logits are
/// the same to the bit, prompt and decode, at 1, 2 and 3 threads. (The default,
/// `Matmul::Auto`, rounds the inputs of the blocks' products: runtime/tests/int8.rs.)
#[test]
fn the_blocks_give_the_logits_of_their_values() {
    for fixture in FIXTURES {
        let tmp = tempfile::tempdir().unwrap();
        let (_, out) = imported(fixture, tmp.path());
        let load = |weights| {
            let mut generator =
                Generator::<FlexBackend>::load_with(&out, &Default::default(), weights).unwrap();
            generator.matmul = Matmul::Exact;
            generator
        };
        let (blocks, values) = (load(Weights::Auto), load(Weights::F32));
        let file = WeightsFile::open(&out.join(WEIGHTS_FILE)).unwrap();
        let stored = (file.index().tensors.iter())
            .filter(|t| matches!(t.dtype, Dtype::Blocks(_)))
            .count();
        assert_eq!(blocks.kept.blocks, stored, "{fixture}");
        assert_eq!(values.kept.blocks, 0, "{fixture}");
        for threads in [1, 2, 3] {
            let (on_blocks, on_values) =
                runtime::in_thread_pool(Some(threads), || (logits(&blocks), logits(&values)))
                    .unwrap();
            assert!(
                on_blocks == on_values,
                "{fixture}, {threads} threads: the logits differ"
            );
        }
    }
}

/// blocks.safetensors as `edit` leaves it (its tensors by name: type, shape, bytes).
type BlockTensors = HashMap<String, (String, Vec<usize>, Vec<u8>)>;

fn edit_blocks(hf: &Path, edit: impl FnOnce(&mut BlockTensors)) {
    let path = hf.join("blocks.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let types = metadata.metadata().clone().unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: BlockTensors = (st.tensors().into_iter())
        .map(|(name, t)| {
            let ty = types[&name].clone();
            (name, (ty, t.shape().to_vec(), t.data().to_vec()))
        })
        .collect();
    edit(&mut tensors);
    let types: HashMap<String, String> = (tensors.iter())
        .filter(|(_, (ty, _, _))| !ty.is_empty())
        .map(|(name, (ty, _, _))| (name.clone(), ty.clone()))
        .collect();
    let views = (tensors.iter()).map(|(name, (_, shape, data))| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::U8, shape.clone(), data);
        (name.clone(), view.unwrap())
    });
    safetensors::serialize_to_file(views, Some(types), &path).unwrap();
}

type Edit = Box<dyn Fn(&mut BlockTensors)>;

/// Each way blocks.safetensors can fail to stand for the checkpoint, one error: blocks
/// that decode to other values, a NaN scale, a type not kept, a type missing, a shape
/// config.json does not imply, blocks of the embedding. Nothing is written.
#[test]
fn blocks_that_do_not_stand_for_the_checkpoint_are_refused() {
    let q = "model.layers.0.self_attn.q_proj.weight";
    let cases: Vec<(&str, Edit)> = vec![
        (
            "the Q8_0 blocks of layers.0.self_attn.q_proj.weight decode to",
            Box::new(|t| t.get_mut(q).unwrap().2[2 + 5] ^= 4),
        ),
        (
            "layers.0.self_attn.q_proj.weight: Q8_0 block 1 of row 3 has a NaN or infinite scale",
            Box::new(|t| {
                let row = 128 / 32 * 34;
                t.get_mut(q).unwrap().2[3 * row + 34..][..2].copy_from_slice(&[0, 0x7e]);
            }),
        ),
        (
            "has ggml type \"Q4_1\", not one kept as blocks (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K)",
            Box::new(|t| t.get_mut(q).unwrap().0 = "Q4_1".into()),
        ),
        (
            "tensor model.layers.0.self_attn.q_proj.weight has no ggml type in the metadata",
            Box::new(|t| t.get_mut(q).unwrap().0 = String::new()),
        ),
        (
            "blocks.safetensors: model.layers.0.self_attn.q_proj.weight is [64, 272] bytes of Q8_0 blocks, config.json implies 128 rows of 128 values ([128, 136] bytes)",
            Box::new(|t| {
                let (_, shape, _) = t.get_mut(q).unwrap();
                *shape = vec![64, 272];
            }),
        ),
        (
            // The embedding may be kept, but these blocks are zeros, not its values.
            "the Q8_0 blocks of embed_tokens.weight decode to 0.0 at row 0, column 0, where the record holds",
            Box::new(|t| {
                let blocks = (String::from("Q8_0"), vec![384, 136], vec![0; 384 * 136]);
                t.insert("model.embed_tokens.weight".into(), blocks);
            }),
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let (hf, _) = imported("gguf-q8_0", tmp.path());
    let original = std::fs::read(hf.join("blocks.safetensors")).unwrap();
    for (expected, edit) in cases {
        std::fs::write(hf.join("blocks.safetensors"), &original).unwrap();
        edit_blocks(&hf, edit);
        let out = tmp.path().join("refused");
        let run = converter(&[&"convert", &hf, &out]);
        assert!(!run.success, "{expected}");
        assert!(
            run.stderr.contains(expected),
            "{:?} lacks {expected:?}",
            run.stderr
        );
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(!out.exists(), "{expected}: {} was left", out.display());
    }
}
