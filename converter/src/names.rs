//! The one table from Hugging Face tensor names to Burn record field paths.
//!
//! The runtime's module uses the checkpoint's own names, so the table holds only what really
//! differs: the `model.` prefix, RmsNorm's `weight` called `gamma` in Burn, and Linear
//! weights, which Burn stores as `[d_in, d_out]` (PyTorch: `[out, in]`).
//!
//! No q/k permutation: the runtime's RoPE uses transformers' `rotate_half` layout, so q_proj
//! and k_proj rows are used as published.

/// What happens to a tensor between the checkpoint and the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// Copied as is.
    Keep,
    /// `[out, in]` → `[in, out]`.
    Transpose,
}

/// `(Hugging Face name, Burn path, transform)`; `{i}` stands for the layer index.
const TABLE: &[(&str, &str, Transform)] = &[
    (
        "model.embed_tokens.weight",
        "embed_tokens.weight",
        Transform::Keep,
    ),
    ("model.norm.weight", "norm.gamma", Transform::Keep),
    ("lm_head.weight", "lm_head.weight", Transform::Transpose),
    (
        "model.layers.{i}.input_layernorm.weight",
        "layers.{i}.input_layernorm.gamma",
        Transform::Keep,
    ),
    (
        "model.layers.{i}.self_attn.q_proj.weight",
        "layers.{i}.self_attn.q_proj.weight",
        Transform::Transpose,
    ),
    (
        "model.layers.{i}.self_attn.k_proj.weight",
        "layers.{i}.self_attn.k_proj.weight",
        Transform::Transpose,
    ),
    (
        "model.layers.{i}.self_attn.v_proj.weight",
        "layers.{i}.self_attn.v_proj.weight",
        Transform::Transpose,
    ),
    (
        "model.layers.{i}.self_attn.o_proj.weight",
        "layers.{i}.self_attn.o_proj.weight",
        Transform::Transpose,
    ),
    (
        "model.layers.{i}.post_attention_layernorm.weight",
        "layers.{i}.post_attention_layernorm.gamma",
        Transform::Keep,
    ),
    (
        "model.layers.{i}.mlp.gate_proj.weight",
        "layers.{i}.mlp.gate_proj.weight",
        Transform::Transpose,
    ),
    (
        "model.layers.{i}.mlp.up_proj.weight",
        "layers.{i}.mlp.up_proj.weight",
        Transform::Transpose,
    ),
    (
        "model.layers.{i}.mlp.down_proj.weight",
        "layers.{i}.mlp.down_proj.weight",
        Transform::Transpose,
    ),
];

/// Checkpoint entries that are buffers, not parameters (older transformers saved RoPE's
/// `inv_freq`); they are recomputed from config.json and skipped.
pub fn is_ignored(hf_name: &str) -> bool {
    hf_name.ends_with(".rotary_emb.inv_freq")
}

/// The tied source of `lm_head.weight`.
pub const EMBEDDING: &str = "model.embed_tokens.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// Burn path and transform of a Hugging Face tensor name.
pub fn to_burn(hf_name: &str) -> Option<(String, Transform)> {
    TABLE.iter().find_map(|&(hf, burn, transform)| {
        let layer = match_pattern(hf, hf_name)?;
        Some((fill(burn, layer), transform))
    })
}

/// Hugging Face name and transform of a Burn path.
pub fn to_hf(burn_path: &str) -> Option<(String, Transform)> {
    TABLE.iter().find_map(|&(hf, burn, transform)| {
        let layer = match_pattern(burn, burn_path)?;
        Some((fill(hf, layer), transform))
    })
}

/// Matches `name` against a pattern with at most one `{i}`; returns the layer index text
/// (empty for patterns without one).
fn match_pattern<'a>(pattern: &str, name: &'a str) -> Option<&'a str> {
    match pattern.split_once("{i}") {
        None => (pattern == name).then_some(""),
        Some((prefix, suffix)) => {
            let index = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            let canonical = index.parse::<usize>().ok()?.to_string() == index;
            canonical.then_some(index)
        }
    }
}

fn fill(pattern: &str, layer: &str) -> String {
    pattern.replace("{i}", layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_both_ways() {
        let hf = "model.layers.12.self_attn.k_proj.weight";
        let (burn, t) = to_burn(hf).unwrap();
        assert_eq!(
            (burn.as_str(), t),
            ("layers.12.self_attn.k_proj.weight", Transform::Transpose)
        );
        assert_eq!(to_hf(&burn).unwrap().0, hf);
        assert_eq!(to_burn("model.norm.weight").unwrap().0, "norm.gamma");
        assert_eq!(
            to_hf("layers.0.post_attention_layernorm.gamma").unwrap().0,
            "model.layers.0.post_attention_layernorm.weight"
        );
    }

    #[test]
    fn rejects_near_misses() {
        for name in [
            "model.layers.x.mlp.up_proj.weight",
            "model.layers.01.mlp.up_proj.weight",
            "model.layers.1.mlp.up_proj.bias",
            "model.embed_tokens.weight.extra",
        ] {
            assert!(to_burn(name).is_none(), "{name} mapped");
        }
    }
}
