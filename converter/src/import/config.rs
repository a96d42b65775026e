//! config.json synthesised from a GGUF's `llama.*` metadata.

use anyhow::{Context, Result, bail};
use serde_json::{Value as Json, json};

use super::tokenizer::TokenizerSpec;
use crate::gguf::{Gguf, Value};

/// The GGUF architectures we import, with the Hugging Face class each becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `llama`: Llama 2/3, SmolLM, ...; q and k rows permuted by llama.cpp's converter.
    Llama,
    /// `qwen2`: biases on q, k and v; rows as published.
    Qwen2,
}

impl Arch {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        match gguf.str("general.architecture")? {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            other => bail!(
                "unsupported GGUF architecture {other:?}: supported are \"llama\" and \"qwen2\""
            ),
        }
    }

    /// The metadata key prefix, `llama.block_count`.
    fn prefix(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// Model hyperparameters from the GGUF metadata (`{arch}.*` keys).
pub struct Hyperparams {
    pub arch: Arch,
    pub layers: u64,
    pub context_length: u64,
    pub hidden: u64,
    pub ffn: u64,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// `attention.key_length`, where it differs from hidden / heads.
    pub head_dim: Option<u64>,
    pub rope_theta: f64,
    /// `rope.scaling.factor` of linear scaling, the only kind llama.cpp's metadata describes
    /// in full (Llama 3.1's is a `rope_freqs` tensor, refused by the importer).
    pub linear_rope_factor: Option<f64>,
    pub rms_eps: f64,
    pub vocab: u64,
    /// Llama's `attention_bias` and `mlp_bias`: whether the tensors have them.
    pub attention_bias: bool,
    pub mlp_bias: bool,
}

impl Hyperparams {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        let arch = Arch::read(gguf)?;
        let key = |name: &str| format!("{}.{name}", arch.prefix());
        let n_heads = gguf.u64(&key("attention.head_count"))?;
        let float = |name: &str| {
            gguf.get(&key(name))
                .and_then(Value::as_f64)
                .with_context(|| format!("GGUF metadata {} is missing or not a number", key(name)))
        };
        let optional = |name: &str| gguf.get(&key(name));
        let vocab = match optional("vocab_size").and_then(Value::as_u64) {
            Some(v) => v,
            None => gguf.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        let hidden = gguf.u64(&key("embedding_length"))?;
        let has = |tensor: &str| gguf.tensors.iter().any(|t| t.name.ends_with(tensor));
        let head_dim = optional("attention.key_length")
            .and_then(Value::as_u64)
            .filter(|&d| n_heads == 0 || d != hidden / n_heads);
        let linear_rope_factor = match optional("rope.scaling.type").and_then(Value::as_str) {
            None | Some("none") => None,
            Some("linear") => Some(float("rope.scaling.factor")?),
            Some(other) => bail!(
                "unsupported GGUF RoPE scaling {other:?} ({}): supported are none and linear",
                key("rope.scaling.type")
            ),
        };
        Ok(Self {
            arch,
            layers: gguf.u64(&key("block_count"))?,
            context_length: gguf.u64(&key("context_length"))?,
            hidden,
            ffn: gguf.u64(&key("feed_forward_length"))?,
            n_heads: n_heads as usize,
            n_kv_heads: optional("attention.head_count_kv")
                .and_then(Value::as_u64)
                .unwrap_or(n_heads) as usize,
            head_dim,
            rope_theta: optional("rope.freq_base")
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
            linear_rope_factor,
            rms_eps: float("attention.layer_norm_rms_epsilon")?,
            vocab,
            attention_bias: has("attn_output.bias"),
            mlp_bias: has("ffn_gate.bias"),
        })
    }

    pub fn config_json(&self, tok: &TokenizerSpec, tied: bool) -> Json {
        let rope_scaling = self.linear_rope_factor.map_or(
            Json::Null,
            |factor| json!({"rope_type": "linear", "factor": factor}),
        );
        let mut config = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "bos_token_id": tok.bos,
            "eos_token_id": tok.eos,
            "pad_token_id": tok.pad,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "max_position_embeddings": self.context_length,
            "mlp_bias": self.mlp_bias,
            "num_attention_heads": self.n_heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.n_kv_heads,
            "rms_norm_eps": self.rms_eps,
            "rope_scaling": rope_scaling,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": tied,
            "torch_dtype": "bfloat16",
            "use_cache": true,
            "vocab_size": self.vocab,
        });
        let fields = config.as_object_mut().expect("an object");
        if let Some(head_dim) = self.head_dim {
            fields.insert("head_dim".into(), json!(head_dim));
        }
        if self.arch == Arch::Qwen2 {
            // Qwen2's q/k/v biases come with the class, not a flag.
            for flag in ["attention_bias", "mlp_bias"] {
                fields.remove(flag);
            }
            fields.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
            fields.insert("model_type".into(), json!("qwen2"));
            fields.insert("use_sliding_window".into(), json!(false));
        }
        config
    }
}
