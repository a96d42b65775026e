//! config.json of a Hugging Face Llama checkpoint, read with serde and resolved once.
//!
//! Two steps, as candle does: [`HfConfig`] mirrors the file (optional keys stay `Option`),
//! [`LlamaConfig::from_hf`] checks it and fills the defaults into plain numbers.

use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::files::{FileError, read_text_bounded};

/// Largest config.json we read: real ones are a few KB.
pub const CONFIG_LIMIT: u64 = 1 << 20;

/// Largest vocabulary we accept; far above any real Llama (Llama 3 has 128 256 tokens) and
/// small enough that a corrupt value can't make us allocate gigabytes.
const MAX_VOCAB: usize = 1 << 20;
/// Upper bound for every other size (hidden, layers, heads, context): corrupt values fail
/// here with a clear message instead of in an allocation.
const MAX_DIM: usize = 1 << 20;

/// Errors in a config.json.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path} is not valid: {error}")]
    Parse {
        path: String,
        error: serde_json::Error,
    },
    #[error(
        "unsupported architecture {0}: only LlamaForCausalLM (model_type \"llama\") is supported"
    )]
    Architecture(String),
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// `eos_token_id` is a single id in some checkpoints and a list in others.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// config.json as transformers writes it for `LlamaForCausalLM` (the keys we read).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers ≥ 5 writes `rope_theta` here instead of at the top level.
    pub rope_parameters: Option<RopeParameters>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: Option<bool>,
    pub hidden_act: Option<String>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
}

/// generation_config.json: the keys we read. Optional in a checkpoint; the converter and
/// the runtime read it with this one parser, so a file the runtime would refuse never
/// makes it into an artifact.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationConfig {
    pub bos_token_id: Option<TokenIds>,
    /// Ids that end a sequence, besides config.json's.
    pub eos_token_id: Option<TokenIds>,
}

impl GenerationConfig {
    /// Reads `path`; `None` if there is no such file.
    pub fn from_file(path: &Path) -> Result<Option<Self>, ConfigError> {
        let text = match read_text_bounded(path, CONFIG_LIMIT) {
            Ok(text) => text,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| ConfigError::Parse {
                path: path.display().to_string(),
                error,
            })
    }
}

/// `rope_parameters` of transformers ≥ 5 configs.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RopeParameters {
    pub rope_theta: Option<f64>,
    pub rope_type: Option<String>,
}

/// The resolved hyperparameters the model is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl HfConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = read_text_bounded(path, CONFIG_LIMIT)?;
        serde_json::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.display().to_string(),
            error,
        })
    }
}

impl LlamaConfig {
    /// Checks that `id` (the tokenizer's largest, or a special token's, named `what`) is a
    /// row of the embedding: a larger one would index past it.
    pub fn check_token_id(&self, id: u32, what: &str) -> Result<(), ConfigError> {
        if id as usize >= self.vocab_size {
            return Err(ConfigError::Invalid(format!(
                "{what} {id} is outside the model's vocabulary (vocab_size {})",
                self.vocab_size
            )));
        }
        Ok(())
    }

    /// Reads and resolves `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_hf(&HfConfig::from_file(path)?)
    }

    /// Checks that `hf` describes a Llama causal LM we can run and fills defaults
    /// (kv heads = heads, head_dim = hidden / heads, eps 1e-6 and theta 10000 as in
    /// transformers' `LlamaConfig`).
    pub fn from_hf(hf: &HfConfig) -> Result<Self, ConfigError> {
        let arch_ok = hf.architectures.iter().any(|a| a == "LlamaForCausalLM")
            || (hf.architectures.is_empty() && hf.model_type.as_deref() == Some("llama"));
        if !arch_ok {
            let name = hf
                .architectures
                .first()
                .cloned()
                .or_else(|| hf.model_type.clone())
                .unwrap_or_else(|| "(none given)".into());
            return Err(ConfigError::Architecture(name));
        }
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        let n_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        for (name, value) in [
            ("hidden_size", hf.hidden_size),
            ("intermediate_size", hf.intermediate_size),
            ("num_hidden_layers", hf.num_hidden_layers),
            ("num_attention_heads", hf.num_attention_heads),
            ("num_key_value_heads", n_kv_heads),
            ("max_position_embeddings", hf.max_position_embeddings),
        ] {
            if value == 0 || value > MAX_DIM {
                return invalid(format!("{name} = {value} is out of range 1..={MAX_DIM}"));
            }
        }
        if hf.vocab_size == 0 || hf.vocab_size > MAX_VOCAB {
            return invalid(format!(
                "vocab_size = {} is out of range 1..={MAX_VOCAB}",
                hf.vocab_size
            ));
        }
        if !hf.hidden_size.is_multiple_of(hf.num_attention_heads) && hf.head_dim.is_none() {
            return invalid(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                hf.hidden_size, hf.num_attention_heads
            ));
        }
        if !hf.num_attention_heads.is_multiple_of(n_kv_heads) {
            return invalid(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {n_kv_heads}",
                hf.num_attention_heads
            ));
        }
        let head_dim = hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > MAX_DIM {
            return invalid(format!("head_dim {head_dim} must be even and non-zero"));
        }
        if let Some(act) = hf.hidden_act.as_deref().filter(|a| *a != "silu") {
            return invalid(format!(
                "hidden_act {act:?} is not supported (only \"silu\")"
            ));
        }
        if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return invalid("rope_scaling is not supported".into());
        }
        if hf.attention_bias == Some(true) || hf.mlp_bias == Some(true) {
            return invalid("attention_bias / mlp_bias are not supported".into());
        }
        let rms_norm_eps = hf.rms_norm_eps.unwrap_or(1e-6);
        let rope = hf.rope_parameters.as_ref();
        if let Some(kind) = rope
            .and_then(|r| r.rope_type.as_deref())
            .filter(|t| *t != "default")
        {
            return invalid(format!(
                "rope_type {kind:?} is not supported (only \"default\")"
            ));
        }
        let rope_theta = hf
            .rope_theta
            .or_else(|| rope.and_then(|r| r.rope_theta))
            .unwrap_or(10_000.0);
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            return invalid(format!("rms_norm_eps {rms_norm_eps} must be positive"));
        }
        if !(rope_theta.is_finite() && rope_theta > 1.0) {
            return invalid(format!("rope_theta {rope_theta} must be greater than 1"));
        }
        Ok(Self {
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            n_heads: hf.num_attention_heads,
            n_kv_heads,
            head_dim,
            vocab_size: hf.vocab_size,
            rms_norm_eps,
            rope_theta,
            max_position_embeddings: hf.max_position_embeddings,
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            bos_token_id: hf.bos_token_id,
            eos_token_ids: hf
                .eos_token_id
                .as_ref()
                .map(TokenIds::to_vec)
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
            "tie_word_embeddings": true, "hidden_act": "silu", "eos_token_id": 2
        })
    }

    fn resolve(v: serde_json::Value) -> Result<LlamaConfig, ConfigError> {
        LlamaConfig::from_hf(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn resolves_smollm2() {
        let c = resolve(smollm()).unwrap();
        assert_eq!(
            (c.head_dim, c.n_kv_heads, c.eos_token_ids.clone()),
            (64, 3, vec![2])
        );
        assert!(c.tie_word_embeddings);
    }

    #[test]
    fn refuses_other_architectures_by_name() {
        let mut v = smollm();
        v["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        let err = resolve(v).unwrap_err().to_string();
        assert!(err.contains("MistralForCausalLM"), "{err}");
    }

    #[test]
    fn refuses_absurd_sizes() {
        for (key, value) in [
            ("num_attention_heads", 0),
            ("num_attention_heads", 7),
            ("num_key_value_heads", 2),
            ("vocab_size", 1i64 << 40),
        ] {
            let mut v = smollm();
            v[key] = serde_json::json!(value);
            assert!(resolve(v).is_err(), "{key} = {value} accepted");
        }
    }

    /// Each feature this runtime does not implement is refused by name, not run wrong.
    #[test]
    fn refuses_unsupported_features_by_name() {
        for (key, value, named) in [
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
                "rope_scaling",
            ),
            ("attention_bias", serde_json::json!(true), "attention_bias"),
            ("mlp_bias", serde_json::json!(true), "mlp_bias"),
            ("hidden_act", serde_json::json!("gelu"), "gelu"),
            (
                "rope_parameters",
                serde_json::json!({"rope_theta": 500000.0, "rope_type": "llama3"}),
                "llama3",
            ),
        ] {
            let mut v = smollm();
            v[key] = value;
            let err = resolve(v).unwrap_err().to_string();
            assert!(err.contains(named), "{key}: {err}");
        }
        // The neutral values of the same keys are accepted.
        let mut v = smollm();
        v["rope_scaling"] = serde_json::Value::Null;
        v["attention_bias"] = false.into();
        v["rope_parameters"] = serde_json::json!({"rope_theta": 100000.0, "rope_type": "default"});
        resolve(v).unwrap();
    }
}
