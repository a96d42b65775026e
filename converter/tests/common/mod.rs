//! Tiny synthetic checkpoints written by the tests themselves, and a way to run the binary.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;

pub const VOCAB: usize = 32;
pub const HIDDEN: usize = 8;
pub const FFN: usize = 12;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = HIDDEN / HEADS;

/// How a synthetic checkpoint is stored.
#[derive(Clone, Copy)]
pub struct Spec {
    pub dtype: Dtype,
    pub tied: bool,
    pub shards: usize,
}

/// Every tensor of a Llama checkpoint with the sizes above: (HF name, shape).
pub fn tensor_shapes(tied: bool) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".to_string(), vec![HIDDEN]),
    ];
    if !tied {
        out.push(("lm_head.weight".to_string(), vec![VOCAB, HIDDEN]));
    }
    let kv = KV_HEADS * HEAD_DIM;
    for i in 0..LAYERS {
        let l = format!("model.layers.{i}");
        out.extend([
            (format!("{l}.input_layernorm.weight"), vec![HIDDEN]),
            (format!("{l}.post_attention_layernorm.weight"), vec![HIDDEN]),
            (format!("{l}.self_attn.q_proj.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{l}.self_attn.k_proj.weight"), vec![kv, HIDDEN]),
            (format!("{l}.self_attn.v_proj.weight"), vec![kv, HIDDEN]),
            (format!("{l}.self_attn.o_proj.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{l}.mlp.gate_proj.weight"), vec![FFN, HIDDEN]),
            (format!("{l}.mlp.up_proj.weight"), vec![FFN, HIDDEN]),
            (format!("{l}.mlp.down_proj.weight"), vec![HIDDEN, FFN]),
        ]);
    }
    out
}

/// Deterministic values, different for every tensor, as the checkpoint's dtype stores them
/// (so the widened f32 is exactly what the converter must produce).
pub fn values(name: &str, numel: usize, dtype: Dtype) -> Vec<f32> {
    let salt = name.bytes().map(usize::from).sum::<usize>();
    (0..numel)
        .map(|i| ((i * 7919 + salt * 31) % 2001) as f32 / 1000.0 - 1.0)
        .map(|v| match dtype {
            Dtype::BF16 => bf16::from_f32(v).to_f32(),
            Dtype::F16 => f16::from_f32(v).to_f32(),
            _ => v,
        })
        .collect()
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F32 => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        other => panic!("test helper does not encode {other:?}"),
    }
}

pub fn config_json(tied: bool) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "tie_word_embeddings": tied, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2
    })
}

/// A word-level tokenizer.json over `t0 … t31`.
pub fn tokenizer_json() -> serde_json::Value {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..VOCAB).map(|i| (format!("t{i}"), json!(i))).collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    })
}

/// Writes a complete synthetic checkpoint into `dir`.
pub fn write_checkpoint(dir: &Path, spec: Spec) {
    std::fs::create_dir_all(dir).unwrap();
    write_json(&dir.join("config.json"), &config_json(spec.tied));
    write_json(&dir.join("tokenizer.json"), &tokenizer_json());
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = tensor_shapes(spec.tied)
        .into_iter()
        .map(|(name, shape)| {
            let bytes = encode(
                &values(&name, shape.iter().product(), spec.dtype),
                spec.dtype,
            );
            (name, shape, bytes)
        })
        .collect();
    if spec.shards <= 1 {
        write_safetensors(&dir.join("model.safetensors"), &tensors, spec.dtype);
        return;
    }
    let mut weight_map = serde_json::Map::new();
    let per_shard = tensors.len().div_ceil(spec.shards);
    for (k, chunk) in tensors.chunks(per_shard).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, spec.shards);
        write_safetensors(&dir.join(&file), chunk, spec.dtype);
        for (name, _, _) in chunk {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {}, "weight_map": weight_map}),
    );
}

pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)], dtype: Dtype) {
    let views = tensors.iter().map(|(name, shape, bytes)| {
        (
            name.clone(),
            TensorView::new(dtype, shape.clone(), bytes).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, path).unwrap();
}

pub fn write_json(path: &Path, value: &serde_json::Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// Output of one run of the converter binary.
pub struct Run {
    pub success: bool,
    pub stderr: String,
}

pub fn converter(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_converter"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap();
    Run {
        success: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}
