//! config.json synthesised from a GGUF's `llama.*` metadata.

use anyhow::{Context, Result};
use serde_json::{Value as Json, json};

use super::tokenizer::TokenizerSpec;
use crate::gguf::{Gguf, Value};

/// Model hyperparameters from the GGUF metadata (`llama.*` keys).
pub struct Hyperparams {
    pub layers: u64,
    pub context_length: u64,
    pub hidden: u64,
    pub ffn: u64,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    pub vocab: u64,
}

impl Hyperparams {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        let n_heads = gguf.u64("llama.attention.head_count")?;
        let float = |key: &str| {
            gguf.get(key)
                .and_then(Value::as_f64)
                .with_context(|| format!("GGUF metadata {key} is missing or not a number"))
        };
        let vocab = match gguf.get("llama.vocab_size").and_then(Value::as_u64) {
            Some(v) => v,
            None => gguf.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        Ok(Self {
            layers: gguf.u64("llama.block_count")?,
            context_length: gguf.u64("llama.context_length")?,
            hidden: gguf.u64("llama.embedding_length")?,
            ffn: gguf.u64("llama.feed_forward_length")?,
            n_heads: n_heads as usize,
            n_kv_heads: gguf
                .get("llama.attention.head_count_kv")
                .and_then(Value::as_u64)
                .unwrap_or(n_heads) as usize,
            rope_theta: gguf
                .get("llama.rope.freq_base")
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
            rms_eps: float("llama.attention.layer_norm_rms_epsilon")?,
            vocab,
        })
    }

    pub fn config_json(&self, tok: &TokenizerSpec, tied: bool) -> Json {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": tok.bos,
            "eos_token_id": tok.eos,
            "pad_token_id": tok.pad,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "max_position_embeddings": self.context_length,
            "mlp_bias": false,
            "num_attention_heads": self.n_heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.n_kv_heads,
            "rms_norm_eps": self.rms_eps,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": tied,
            "torch_dtype": "bfloat16",
            "use_cache": true,
            "vocab_size": self.vocab,
        })
    }
}
