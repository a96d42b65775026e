//! The GGUF tensor name table: llama.cpp's names back to Hugging Face's.

use super::config::Arch;

/// GGUF tensor name → Hugging Face name in a GGUF of architecture `arch`: where the
/// architecture's layers differ from Llama's (gguf-py's tensor_mapping.py), then
/// [`hf_name`].
pub fn hf_name_in(arch: Arch, gguf_name: &str) -> Option<String> {
    let layer_tensor = gguf_name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
        .filter(|(layer, _)| layer.parse::<usize>().is_ok());
    if let Some((layer, tensor)) = layer_tensor {
        let hf = match (arch, tensor) {
            // Gemma's sandwich: a norm after attention, one before and one after the MLP.
            (Arch::Gemma3, "post_attention_norm.weight") => Some("post_attention_layernorm.weight"),
            (Arch::Gemma3, "ffn_norm.weight") => Some("pre_feedforward_layernorm.weight"),
            (Arch::Gemma3, "post_ffw_norm.weight") => Some("post_feedforward_layernorm.weight"),
            // Phi-3's fused projections, as Phi3ForCausalLM holds them (`ffn_up` is gate then
            // up, as `gate_up_proj`; convert_hf_to_gguf.py writes both unchanged).
            (Arch::Phi3, "attn_qkv.weight") => Some("self_attn.qkv_proj.weight"),
            (Arch::Phi3, "ffn_up.weight") => Some("mlp.gate_up_proj.weight"),
            _ => None,
        };
        if let Some(hf) = hf {
            return Some(format!("model.layers.{layer}.{hf}"));
        }
    }
    hf_name(gguf_name)
}

/// GGUF tensor name → Hugging Face name (llama.cpp's `convert_hf_to_gguf.py` in reverse),
/// for Llama's layers.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, tensor) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let hf = match tensor {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_output.bias" => "self_attn.o_proj.bias",
        "ffn_gate.bias" => "mlp.gate_proj.bias",
        "ffn_up.bias" => "mlp.up_proj.bias",
        "ffn_down.bias" => "mlp.down_proj.bias",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_gguf_names() {
        assert_eq!(
            hf_name("blk.7.ffn_down.weight").unwrap(),
            "model.layers.7.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert_eq!(
            hf_name("blk.0.attn_k.bias").unwrap(),
            "model.layers.0.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf_name("blk.3.attn_k_norm.weight").unwrap(),
            "model.layers.3.self_attn.k_norm.weight"
        );
        assert!(hf_name("blk.x.ffn_down.weight").is_none());
        assert!(hf_name("rope_freqs.weight").is_none());
    }

    /// Gemma 3's sandwich norms and Phi-3's fused projections, as llama.cpp's converter
    /// names them; the rest as Llama's.
    #[test]
    fn maps_names_by_architecture() {
        let layer = |arch, name: &str| {
            let hf = hf_name_in(arch, &format!("blk.4.{name}"))?;
            Some(hf.strip_prefix("model.layers.4.").unwrap().to_string())
        };
        for (name, hf) in [
            ("attn_norm.weight", "input_layernorm.weight"),
            (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight",
            ),
            ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
            ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
            ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            ("ffn_up.weight", "mlp.up_proj.weight"),
        ] {
            assert_eq!(layer(Arch::Gemma3, name).as_deref(), Some(hf), "{name}");
        }
        for (name, hf) in [
            ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
            ("ffn_up.weight", "mlp.gate_up_proj.weight"),
            ("ffn_norm.weight", "post_attention_layernorm.weight"),
            ("attn_output.weight", "self_attn.o_proj.weight"),
        ] {
            assert_eq!(layer(Arch::Phi3, name).as_deref(), Some(hf), "{name}");
        }
        assert_eq!(
            layer(Arch::SmolLM3, "ffn_norm.weight").as_deref(),
            Some("post_attention_layernorm.weight")
        );
        // Not Llama's, nor another architecture's.
        for (arch, name) in [
            (Arch::Llama, "post_attention_norm.weight"),
            (Arch::Llama, "attn_qkv.weight"),
            (Arch::Gemma3, "attn_qkv.weight"),
            (Arch::Phi3, "post_ffw_norm.weight"),
        ] {
            assert_eq!(layer(arch, name), None, "{arch:?} {name}");
        }
        assert_eq!(hf_name_in(Arch::Phi3, "rope_factors_long.weight"), None);
        assert_eq!(
            hf_name_in(Arch::Gemma3, "output_norm.weight").as_deref(),
            Some("model.norm.weight")
        );
    }
}
