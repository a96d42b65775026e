//! Hugging Face tensor names from Burn record field paths, by rule.
//!
//! The runtime's module uses the checkpoint's own names, so the rules hold only what really
//! differs: the `model.` prefix (all but `lm_head`), RmsNorm's `weight` called `gamma` in
//! Burn, and Linear weights, which Burn stores as `[d_in, d_out]` (PyTorch: `[out, in]`).
//! Which tensors a checkpoint must have comes from the model itself (`runtime::model::params`), so
//! a new projection or bias in `runtime/src/model/llama.rs` needs no edit here.
//!
//! No q/k permutation: the runtime's RoPE uses transformers' `rotate_half` layout, so q_proj
//! and k_proj rows are used as published.
//!
//! Two checkpoint conventions the config names: norm weights stored as offsets from 1
//! (Gemma; [`Transform::AddOne`]), and fused projections (Phi-3's `qkv_proj` and
//! `gate_up_proj`), whose blocks of rows are the model's q, k, v, gate and up ([`fused`]).

use std::ops::Range;

use runtime::model::config::LlamaConfig;
use runtime::model::params::ParamInfo;

/// What happens to a tensor between the checkpoint and the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// Copied as is.
    Keep,
    /// `[out, in]` → `[in, out]`.
    Transpose,
    /// `w` → `1 + w` (a Gemma norm weight, which the norm multiplies by as `1 + w`).
    AddOne,
}

/// What a causal LM's checkpoint names its base model's tensors with (all but `lm_head`).
pub const MODEL_PREFIX: &str = "model.";

/// The tied source of `lm_head.weight`.
pub const EMBEDDING: &str = "model.embed_tokens.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// Checkpoint entries that are buffers, not parameters (older transformers saved RoPE's
/// `inv_freq`); they are recomputed from config.json and skipped.
pub fn is_ignored(hf_name: &str) -> bool {
    hf_name.ends_with(".rotary_emb.inv_freq")
}

/// Hugging Face name of a Burn parameter and how its values are transformed, or `None` for
/// a parameter of a module type the rules don't know.
pub fn to_hf(param: &ParamInfo) -> Option<(String, Transform)> {
    let (module, field) = param.path.rsplit_once('.')?;
    let (hf_field, transform) = match (param.owner.as_str(), field) {
        ("Linear", "weight") => ("weight", Transform::Transpose),
        ("Linear", "bias") | ("Embedding", "weight") => (field, Transform::Keep),
        ("RmsNorm", "gamma") => ("weight", Transform::Keep),
        _ => return None,
    };
    let prefix = if module == "lm_head" {
        ""
    } else {
        MODEL_PREFIX
    };
    Some((format!("{prefix}{module}.{hf_field}"), transform))
}

/// The fused tensor that holds `hf_name` (a q, k, v, gate or up projection's weight or
/// bias) as a block of rows, those rows, and how many rows the fused tensor has: q, k and
/// v are `qkv_proj`'s in that order, gate and up `gate_up_proj`'s, as transformers' Phi-3
/// splits them.
pub fn fused(hf_name: &str, config: &LlamaConfig) -> Option<(String, Range<usize>, usize)> {
    let q = config.n_heads * config.head_dim;
    let kv = config.n_kv_heads * config.head_dim;
    let ff = config.intermediate_size;
    let parts = [
        ("self_attn.q_proj", "self_attn.qkv_proj", 0..q),
        ("self_attn.k_proj", "self_attn.qkv_proj", q..q + kv),
        ("self_attn.v_proj", "self_attn.qkv_proj", q + kv..q + 2 * kv),
        ("mlp.gate_proj", "mlp.gate_up_proj", 0..ff),
        ("mlp.up_proj", "mlp.gate_up_proj", ff..2 * ff),
    ];
    let (module, field) = hf_name.rsplit_once('.')?;
    parts.into_iter().find_map(|(part, whole, rows)| {
        let layer = module.strip_suffix(part)?;
        let total = if whole.ends_with("qkv_proj") {
            q + 2 * kv
        } else {
            2 * ff
        };
        Some((format!("{layer}{whole}.{field}"), rows, total))
    })
}

/// `(layer, rest)` of a per-layer name, `model.layers.{layer}.{rest}`, with the layer
/// written as a plain decimal number.
pub fn split_layer(hf_name: &str) -> Option<(usize, &str)> {
    let (index, rest) = hf_name.strip_prefix("model.layers.")?.split_once('.')?;
    let layer = index.parse::<usize>().ok()?;
    (layer.to_string() == index).then_some((layer, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(path: &str, owner: &str) -> ParamInfo {
        ParamInfo {
            path: path.into(),
            shape: Vec::new(),
            owner: owner.into(),
            element_bytes: 4,
        }
    }

    #[test]
    fn names_by_rule() {
        let cases = [
            (
                param("layers.12.self_attn.k_proj.weight", "Linear"),
                "model.layers.12.self_attn.k_proj.weight",
                Transform::Transpose,
            ),
            (
                param("layers.3.self_attn.q_proj.bias", "Linear"),
                "model.layers.3.self_attn.q_proj.bias",
                Transform::Keep,
            ),
            (
                param("layers.0.post_attention_layernorm.gamma", "RmsNorm"),
                "model.layers.0.post_attention_layernorm.weight",
                Transform::Keep,
            ),
            (
                param("norm.gamma", "RmsNorm"),
                "model.norm.weight",
                Transform::Keep,
            ),
            (
                param("embed_tokens.weight", "Embedding"),
                EMBEDDING,
                Transform::Keep,
            ),
            (
                param("lm_head.weight", "Linear"),
                LM_HEAD,
                Transform::Transpose,
            ),
        ];
        for (param, hf, transform) in cases {
            assert_eq!(to_hf(&param), Some((hf.to_string(), transform)));
        }
        assert_eq!(to_hf(&param("layers.0.rotary.freqs", "Rope")), None);
    }

    /// Phi-3's fused projections: q, k, v rows of `qkv_proj` in that order (GQA widths), gate
    /// then up of `gate_up_proj`; other names are no part of a fused one.
    #[test]
    fn fused_parts_by_rule() {
        let config = LlamaConfig::plain([64, 112, 2], [4, 2, 16], 96, 128);
        let part = |name: &str| fused(name, &config);
        let qkv = "model.layers.1.self_attn.qkv_proj.weight".to_string();
        assert_eq!(
            part("model.layers.1.self_attn.q_proj.weight"),
            Some((qkv.clone(), 0..64, 128))
        );
        assert_eq!(
            part("model.layers.1.self_attn.k_proj.weight"),
            Some((qkv.clone(), 64..96, 128))
        );
        assert_eq!(
            part("model.layers.1.self_attn.v_proj.weight"),
            Some((qkv, 96..128, 128))
        );
        let gate_up = "model.layers.0.mlp.gate_up_proj.bias".to_string();
        assert_eq!(
            part("model.layers.0.mlp.gate_proj.bias"),
            Some((gate_up.clone(), 0..112, 224))
        );
        assert_eq!(
            part("model.layers.0.mlp.up_proj.bias"),
            Some((gate_up, 112..224, 224))
        );
        for name in [
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.norm.weight",
            "lm_head.weight",
        ] {
            assert_eq!(part(name), None, "{name}");
        }
    }

    #[test]
    fn splits_only_canonical_layer_numbers() {
        assert_eq!(
            split_layer("model.layers.7.mlp.up_proj.weight"),
            Some((7, "mlp.up_proj.weight"))
        );
        for name in [
            "model.layers.x.mlp.up_proj.weight",
            "model.layers.01.mlp.up_proj.weight",
            "model.norm.weight",
        ] {
            assert_eq!(split_layer(name), None, "{name}");
        }
    }
}
