//! `converter convert` and `converter import-gguf` on small inputs the tests write
//! themselves: values survive the round trip into the runtime's module, and every kind of
//! bad input fails with one clear line and leaves nothing behind.

mod common;

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use common::*;
use half::f16;
use runtime::FlexBackend;
use runtime::artifact::load_model;
use safetensors::Dtype;

fn values_of<const D: usize>(t: Tensor<FlexBackend, D>) -> (Vec<usize>, Vec<f32>) {
    (t.dims().to_vec(), t.into_data().to_vec::<f32>().unwrap())
}

fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| values[r * cols + c]))
        .collect()
}

const TIED_BF16: Spec = Spec {
    dtype: Dtype::BF16,
    tied: true,
    shards: 1,
};

/// A tied bf16 checkpoint in `tmp/hf`, converted into `tmp/out`.
fn converted_tiny() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("hf"), tmp.path().join("out"));
    write_checkpoint(&src, TIED_BF16);
    let run = converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);
    (tmp, src, out)
}

fn roundtrip(spec: Spec) {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("hf"), tmp.path().join("out"));
    write_checkpoint(&src, spec);
    let run = converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);

    let (model, config) = load_model::<FlexBackend>(&out, &Default::default()).unwrap();
    assert_eq!(config.tie_word_embeddings, spec.tied);
    let embed = values("model.embed_tokens.weight", VOCAB * HIDDEN, spec.dtype);
    assert_eq!(
        values_of(model.embed_tokens.weight.val()),
        (vec![VOCAB, HIDDEN], embed.clone())
    );
    // A Linear weight is the checkpoint's [out, in] tensor transposed to [in, out].
    let assert_linear = |weight: Tensor<FlexBackend, 2>, hf_name: &str, out_dim, in_dim| {
        let source = values(hf_name, out_dim * in_dim, spec.dtype);
        let expected = (vec![in_dim, out_dim], transposed(&source, out_dim, in_dim));
        assert_eq!(values_of(weight), expected, "{hf_name}");
    };
    // Tied: lm_head is the embedding.
    let head_source = if spec.tied {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    assert_linear(model.lm_head.weight.val(), head_source, VOCAB, HIDDEN);
    let layer = &model.layers[1];
    let k_proj = layer.self_attn.k_proj.weight.val();
    assert_linear(
        k_proj,
        "model.layers.1.self_attn.k_proj.weight",
        HEAD_DIM,
        HIDDEN,
    );
    let down_proj = layer.mlp.down_proj.weight.val();
    assert_linear(
        down_proj,
        "model.layers.1.mlp.down_proj.weight",
        HIDDEN,
        FFN,
    );
    let gamma = values(
        "model.layers.1.post_attention_layernorm.weight",
        HIDDEN,
        spec.dtype,
    );
    assert_eq!(
        values_of(layer.post_attention_layernorm.gamma.val()).1,
        gamma
    );

    let verify = converter(&[&"verify", &out, &"--source", &src]);
    assert!(verify.success, "{}", verify.stderr);
}

#[test]
fn tied_bf16_roundtrip() {
    roundtrip(Spec {
        dtype: Dtype::BF16,
        tied: true,
        shards: 1,
    });
}

#[test]
fn untied_f16_roundtrip() {
    roundtrip(Spec {
        dtype: Dtype::F16,
        tied: false,
        shards: 1,
    });
}

#[test]
fn sharded_f32_roundtrip() {
    roundtrip(Spec {
        dtype: Dtype::F32,
        tied: false,
        shards: 3,
    });
}

#[test]
fn converting_twice_gives_identical_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("hf");
    write_checkpoint(&src, TIED_BF16);
    for out in ["a", "b"] {
        assert!(converter(&[&"convert", &src, &tmp.path().join(out)]).success);
    }
    let read = |out: &str| std::fs::read(tmp.path().join(out).join("model.mpk")).unwrap();
    assert_eq!(read("a"), read("b"));
    let manifest = |out: &str| std::fs::read(tmp.path().join(out).join("manifest.json")).unwrap();
    assert_eq!(manifest("a"), manifest("b"));
}

#[test]
fn verify_names_a_changed_file() {
    let (_tmp, _src, out) = converted_tiny();
    let mut bytes = std::fs::read(out.join("model.mpk")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(out.join("model.mpk"), bytes).unwrap();
    let run = converter(&[&"verify", &out]);
    assert!(!run.success);
    assert!(run.stderr.contains("model.mpk"), "{}", run.stderr);
    assert!(!run.stderr.contains("config.json:"), "{}", run.stderr);
}

/// Runs `args`, expects failure with one `error:` line containing `expected`, no panic, and
/// no artifact or staging files in `out`.
fn assert_clean_failure(args: &[&dyn AsRef<std::ffi::OsStr>], expected: &str, out: &Path) {
    let run = converter(args);
    assert!(
        !run.success,
        "succeeded, expected an error containing {expected:?}"
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got:\n{}", run.stderr);
    assert!(lines[0].starts_with("error: "), "{}", run.stderr);
    assert!(
        lines[0].contains(expected),
        "{:?} does not contain {expected:?}",
        lines[0]
    );
    if out.exists() {
        let left: Vec<_> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "left behind in {}: {left:?}",
            out.display()
        );
    }
}

/// A valid tied bf16 checkpoint with `break_it` applied, converted; must fail cleanly.
fn bad_checkpoint(expected: &str, break_it: impl FnOnce(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("hf"), tmp.path().join("out"));
    write_checkpoint(&src, TIED_BF16);
    break_it(&src);
    assert_clean_failure(&[&"convert", &src, &out], expected, &out);
}

/// Rewrites model.safetensors with `edit` applied to the list of tensors.
fn edit_tensors(
    src: &Path,
    edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<u8>)>, &mut Dtype),
) {
    let mut tensors: Vec<_> = tensor_shapes(true)
        .into_iter()
        .map(|(name, shape)| {
            let bytes = vec![0u8; shape.iter().product::<usize>() * 2];
            (name, shape, bytes)
        })
        .collect();
    let mut dtype = Dtype::BF16;
    edit(&mut tensors, &mut dtype);
    write_safetensors(&src.join("model.safetensors"), &tensors, dtype);
}

#[test]
fn missing_config_file() {
    bad_checkpoint("config.json", |src| {
        std::fs::remove_file(src.join("config.json")).unwrap()
    });
}

#[test]
fn missing_weights_file() {
    bad_checkpoint("no model.safetensors", |src| {
        std::fs::remove_file(src.join("model.safetensors")).unwrap()
    });
}

#[test]
fn truncated_safetensors() {
    bad_checkpoint("invalid safetensors file", |src| {
        let path = src.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    });
}

#[test]
fn garbage_safetensors_header() {
    bad_checkpoint("invalid safetensors file", |src| {
        let mut bytes = 16u64.to_le_bytes().to_vec();
        bytes.extend(b"this is not json");
        std::fs::write(src.join("model.safetensors"), bytes).unwrap();
    });
}

#[test]
fn missing_tensor() {
    bad_checkpoint("missing tensor model.layers.1.mlp.up_proj.weight", |src| {
        edit_tensors(src, |t, _| {
            t.retain(|(name, _, _)| name != "model.layers.1.mlp.up_proj.weight")
        })
    });
}

#[test]
fn wrong_shape() {
    bad_checkpoint(
        "tensor model.layers.0.self_attn.k_proj.weight has shape [8, 8]",
        |src| {
            edit_tensors(src, |t, _| {
                let k = t
                    .iter_mut()
                    .find(|(n, _, _)| n == "model.layers.0.self_attn.k_proj.weight")
                    .unwrap();
                k.1 = vec![HIDDEN, HIDDEN];
                k.2 = vec![0; HIDDEN * HIDDEN * 2];
            })
        },
    );
}

#[test]
fn unsupported_dtype() {
    bad_checkpoint("unsupported dtype I16", |src| {
        edit_tensors(src, |_, dtype| *dtype = Dtype::I16)
    });
}

#[test]
fn unmapped_tensor() {
    bad_checkpoint(
        "unmapped tensor model.layers.0.self_attn.q_proj.bias",
        |src| {
            edit_tensors(src, |t, _| {
                t.push((
                    "model.layers.0.self_attn.q_proj.bias".into(),
                    vec![HIDDEN],
                    vec![0; HIDDEN * 2],
                ))
            })
        },
    );
}

#[test]
fn wrong_architecture() {
    bad_checkpoint("unsupported architecture BertModel", |src| {
        let mut config = config_json(true);
        config["architectures"] = serde_json::json!(["BertModel"]);
        write_json(&src.join("config.json"), &config);
    });
}

#[test]
fn failed_conversion_keeps_the_previous_artifact() {
    let (_tmp, src, out) = converted_tiny();
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    std::fs::remove_file(src.join("tokenizer.json")).unwrap();
    assert!(!converter(&[&"convert", &src, &out]).success);
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
    assert!(!out.join(".partial").exists());
    assert!(converter(&[&"verify", &out]).success);
}

// ---- GGUF import ----

/// A minimal GGUF v3 writer: metadata of the kinds the importer reads, and raw tensors.
struct GgufBuilder {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    data: Vec<u8>,
    n_tensors: u64,
}

impl GgufBuilder {
    fn new() -> Self {
        Self {
            kv: vec![],
            n_kv: 0,
            infos: vec![],
            data: vec![],
            n_tensors: 0,
        }
    }

    fn string(buf: &mut Vec<u8>, s: &str) {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s.as_bytes());
    }

    fn key(&mut self, key: &str, type_id: u32) {
        Self::string(&mut self.kv, key);
        self.kv.extend(type_id.to_le_bytes());
        self.n_kv += 1;
    }

    fn u32(mut self, key: &str, v: u32) -> Self {
        self.key(key, 4);
        self.kv.extend(v.to_le_bytes());
        self
    }

    fn f32(mut self, key: &str, v: f32) -> Self {
        self.key(key, 6);
        self.kv.extend(v.to_le_bytes());
        self
    }

    fn str(mut self, key: &str, v: &str) -> Self {
        self.key(key, 8);
        Self::string(&mut self.kv, v);
        self
    }

    fn strings(mut self, key: &str, items: &[&str]) -> Self {
        self.key(key, 9);
        self.kv.extend(8u32.to_le_bytes());
        self.kv.extend((items.len() as u64).to_le_bytes());
        for item in items {
            Self::string(&mut self.kv, item);
        }
        self
    }

    /// `dims` innermost first, as GGUF stores them.
    fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, bytes: &[u8]) -> Self {
        Self::string(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(type_id.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.data.resize(self.data.len().div_ceil(32) * 32, 0);
        self.n_tensors += 1;
        self
    }

    fn build(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(self.kv);
        out.extend(self.infos);
        out.resize(out.len().div_ceil(32) * 32, 0);
        out.extend(self.data);
        out
    }
}

/// A llama GGUF with one F32 embedding [3 tokens × 4] and one Q8_0 q projection [4 × 32].
fn tiny_gguf() -> GgufBuilder {
    let embed: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let mut q8 = Vec::new();
    for row in 0..4u8 {
        q8.extend(f16::from_f32(0.5).to_le_bytes());
        q8.extend((0..32u8).map(|c| row * 10 + c));
    }
    GgufBuilder::new()
        .str("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.context_length", 16)
        .u32("llama.embedding_length", 4)
        .u32("llama.feed_forward_length", 8)
        .u32("llama.attention.head_count", 1)
        .u32("llama.attention.head_count_kv", 1)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "smollm")
        .strings("tokenizer.ggml.tokens", &["a", "b", "ab"])
        .strings("tokenizer.ggml.merges", &["a b"])
        .tensor("token_embd.weight", &[4, 3], 0, &embed)
        .tensor("blk.0.attn_q.weight", &[32, 4], 8, &q8)
}

#[test]
fn gguf_import_dequantizes_and_unpermutes() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, out) = (tmp.path().join("m.gguf"), tmp.path().join("hf"));
    std::fs::write(&gguf, tiny_gguf().build()).unwrap();
    let run = converter(&[&"import-gguf", &gguf, &out]);
    assert!(run.success, "{}", run.stderr);

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let bf16s = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::BF16);
        t.data()
            .chunks(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()
    };
    let embed = st.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embed.shape(), [3, 4]);
    assert_eq!(
        bf16s("model.embed_tokens.weight"),
        (0..12).map(|i| i as f32 * 0.5).collect::<Vec<_>>()
    );
    // One head of 4 rows: GGUF rows (0, 1, 2, 3) hold HF rows (0, 2, 1, 3).
    let q = bf16s("model.layers.0.self_attn.q_proj.weight");
    for (hf_row, gguf_row) in [(0, 0), (1, 2), (2, 1), (3, 3)] {
        let expected: Vec<f32> = (0..32).map(|c| 0.5 * (gguf_row * 10 + c) as f32).collect();
        assert_eq!(
            q[hf_row * 32..hf_row * 32 + 32],
            expected[..],
            "row {hf_row}"
        );
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["rms_norm_eps"], serde_json::json!(1e-5));
    assert_eq!(config["tie_word_embeddings"], serde_json::json!(true));
    let tokenizer = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    assert_eq!(tokenizer.encode("ab", false).unwrap().get_ids(), [2]);
}

#[test]
fn truncated_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, out) = (tmp.path().join("m.gguf"), tmp.path().join("hf"));
    let bytes = tiny_gguf().build();
    std::fs::write(&gguf, &bytes[..bytes.len() - 40]).unwrap();
    assert_clean_failure(
        &[&"import-gguf", &gguf, &out],
        "past the end of the file",
        &out,
    );
    std::fs::write(&gguf, &bytes[..300]).unwrap();
    assert_clean_failure(&[&"import-gguf", &gguf, &out], "truncated", &out);
    assert!(!tmp.path().join(".hf.partial").exists());
}

#[test]
fn unsupported_gguf_quant_type() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, out) = (tmp.path().join("m.gguf"), tmp.path().join("hf"));
    // Q4_K (ggml type 12): 256-element blocks of 144 bytes.
    let bytes = tiny_gguf()
        .tensor("blk.0.attn_k.weight", &[256, 1], 12, &[0; 144])
        .build();
    std::fs::write(&gguf, bytes).unwrap();
    assert_clean_failure(
        &[&"import-gguf", &gguf, &out],
        "unsupported GGUF tensor type Q4_K",
        &out,
    );
}

#[test]
fn loading_checks_record_shapes_against_config() {
    let (_tmp, _src, out) = converted_tiny();
    // Same length, so the manifest's size check passes and the shape check must catch it.
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    let edited = config.replace("\"intermediate_size\": 12", "\"intermediate_size\": 14");
    assert_ne!(config, edited);
    std::fs::write(out.join("config.json"), edited).unwrap();
    let err = load_model::<FlexBackend>(&out, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layers.0.mlp.gate_proj.weight has shape [8, 12]"),
        "{err}"
    );
}
