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
        "unsupported architecture {0}: supported are LlamaForCausalLM, MistralForCausalLM and \
         Qwen2ForCausalLM (model_type \"llama\", \"mistral\", \"qwen2\")"
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

/// The model families this runtime runs. All are Llama's decoder (pre-norm, RoPE,
/// grouped-query attention, SwiGLU); they differ in what the config turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM`: Llama 2 and 3.x, SmolLM, TinyLlama, ...
    Llama,
    /// `MistralForCausalLM`: no biases; `sliding_window` (4096 when absent, `null` for none).
    Mistral,
    /// `Qwen2ForCausalLM`: q, k and v always have a bias, o never.
    Qwen2,
    /// `Qwen3ForCausalLM`: each head's query and key RMS-normalized before RoPE (`q_norm`,
    /// `k_norm`); biases as `attention_bias` says (none in the published models).
    Qwen3,
    /// `SmolLM3ForCausalLM`: no RoPE in the layers `no_rope_layers` marks 0 (every fourth
    /// by default, `no_rope_layer_interval`).
    SmolLM3,
}

/// (`architectures` entry, `model_type`, family).
const FAMILIES: [(&str, &str, Family); 5] = [
    ("LlamaForCausalLM", "llama", Family::Llama),
    ("MistralForCausalLM", "mistral", Family::Mistral),
    ("Qwen2ForCausalLM", "qwen2", Family::Qwen2),
    ("Qwen3ForCausalLM", "qwen3", Family::Qwen3),
    ("SmolLM3ForCausalLM", "smollm3", Family::SmolLM3),
];

impl Family {
    /// The transformers class of the family.
    fn architecture(self) -> &'static str {
        let listed = FAMILIES.iter().find(|(.., family)| *family == self);
        listed.expect("every family is listed").0
    }

    /// The family `hf` names: its first `architectures` entry, or `model_type` without one.
    fn of(hf: &HfConfig) -> Result<Self, ConfigError> {
        let known = match hf.architectures.first() {
            Some(name) => FAMILIES.iter().find(|(arch, ..)| arch == name),
            None => (hf.model_type.as_deref())
                .and_then(|t| FAMILIES.iter().find(|(_, model_type, _)| *model_type == t)),
        };
        known.map(|&(.., family)| family).ok_or_else(|| {
            ConfigError::Architecture(
                (hf.architectures.first().cloned())
                    .or_else(|| hf.model_type.clone())
                    .unwrap_or_else(|| "(none given)".into()),
            )
        })
    }
}

/// config.json as transformers writes it for the [`Family`] models (the keys we read).
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
    /// RoPE scaling as the hub's files write it (transformers < 5).
    pub rope_scaling: Option<RopeParameters>,
    /// transformers ≥ 5 writes RoPE's theta and scaling here instead.
    pub rope_parameters: Option<RopeParameters>,
    pub partial_rotary_factor: Option<f64>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: Option<bool>,
    pub hidden_act: Option<String>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    /// Mistral's and Qwen2's window: absent (`None`) and `null` (`Some(None)`) differ.
    #[serde(default, deserialize_with = "present")]
    pub sliding_window: Option<Option<usize>>,
    /// Qwen2: whether `sliding_window` applies at all.
    pub use_sliding_window: Option<bool>,
    /// Per-layer attention kinds (transformers ≥ 4.53): `full_attention` or
    /// `sliding_attention`.
    pub layer_types: Option<Vec<String>>,
    /// SmolLM3: per layer, 1 where it applies RoPE, 0 where not; without it, every
    /// `no_rope_layer_interval`-th layer has none.
    pub no_rope_layers: Option<Vec<u8>>,
    pub no_rope_layer_interval: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
}

/// Deserializes a key that is present, `null` included, as `Some`: with `#[serde(default)]`
/// an absent key stays `None`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
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

/// `rope_scaling` (hub files) or `rope_parameters` (transformers ≥ 5): the same keys,
/// besides `rope_theta`, which older files keep at the top level.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct RopeParameters {
    pub rope_theta: Option<f64>,
    /// Older files say `type`.
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
    pub attention_factor: Option<f64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub truncate: Option<bool>,
}

/// How RoPE's frequencies are changed to stretch a model's context, as transformers'
/// `modeling_rope_utils` computes them (`rope.rs` does the arithmetic).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Every frequency divided by `factor` (position interpolation).
    Linear { factor: f64 },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth blend
    /// between the two wavelengths `original_max_position_embeddings / {low,high}_freq_factor`.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN: frequencies blended between kept and divided by `factor` over the dimensions
    /// between the `beta_fast` and `beta_slow` rotation counts; cos and sin scaled by
    /// `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

impl RopeScaling {
    /// Reads the scaling of `rope`; `max_position_embeddings` is YaRN's fallback for
    /// `factor`, as in transformers.
    fn from_parameters(
        rope: &RopeParameters,
        max_position_embeddings: usize,
    ) -> Result<Self, ConfigError> {
        let kind = rope.rope_type.as_deref().unwrap_or("default");
        let key = |value: Option<f64>, name: &str| {
            value.filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "rope_type {kind:?} needs a positive {name}, found {value:?}"
                ))
            })
        };
        Ok(match kind {
            "default" => Self::None,
            "linear" => Self::Linear {
                factor: key(rope.factor, "factor")?,
            },
            "llama3" => {
                let (low_freq_factor, high_freq_factor) = (
                    key(rope.low_freq_factor, "low_freq_factor")?,
                    key(rope.high_freq_factor, "high_freq_factor")?,
                );
                if high_freq_factor <= low_freq_factor {
                    return Err(ConfigError::Invalid(format!(
                        "rope_type \"llama3\" needs high_freq_factor {high_freq_factor} > \
                         low_freq_factor {low_freq_factor}"
                    )));
                }
                Self::Llama3 {
                    factor: key(rope.factor, "factor")?,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: key(
                        rope.original_max_position_embeddings,
                        "original_max_position_embeddings",
                    )?,
                }
            }
            "yarn" => {
                let original = key(
                    rope.original_max_position_embeddings,
                    "original_max_position_embeddings",
                )?;
                let factor = match rope.factor {
                    Some(factor) => key(Some(factor), "factor")?,
                    None => max_position_embeddings as f64 / original,
                };
                // transformers' `get_mscale`.
                let mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                let attention_factor =
                    match (rope.attention_factor, rope.mscale, rope.mscale_all_dim) {
                        (Some(a), ..) => key(Some(a), "attention_factor")?,
                        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                            mscale(factor, m) / mscale(factor, all)
                        }
                        _ => mscale(factor, 1.0),
                    };
                Self::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: rope.beta_fast.filter(|b| *b != 0.0).unwrap_or(32.0),
                    beta_slow: rope.beta_slow.filter(|b| *b != 0.0).unwrap_or(1.0),
                    attention_factor,
                    truncate: rope.truncate.unwrap_or(true),
                }
            }
            other => {
                return Err(ConfigError::Invalid(format!(
                    "rope_type {other:?} is not supported (supported: default, linear, llama3, \
                     yarn)"
                )));
            }
        })
    }
}

/// Which linear layers of a decoder layer add a bias.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Biases {
    /// q, k and v.
    pub qkv: bool,
    /// o.
    pub o: bool,
    /// gate, up and down.
    pub mlp: bool,
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
    pub rope_scaling: RopeScaling,
    /// A token attends to itself and the `sliding_window - 1` positions before it; `None`:
    /// to every earlier position.
    pub sliding_window: Option<usize>,
    pub biases: Biases,
    /// Each head's query and key RMS-normalized (over `head_dim`, with their own weights)
    /// before RoPE, as Qwen3 does.
    pub qk_norm: bool,
    /// The layers that apply no RoPE (SmolLM3's NoPE layers), in order.
    pub layers_without_rope: Vec<usize>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// SmolLM3's NoPE layers, as transformers' `SmolLM3Config` reads them: `no_rope_layers`
/// (1 = RoPE, 0 = none, one a layer), else every `no_rope_layer_interval`-th layer (4).
fn layers_without_rope(hf: &HfConfig) -> Result<Vec<usize>, ConfigError> {
    let invalid = |msg: String| Err(ConfigError::Invalid(msg));
    if hf.use_sliding_window == Some(true) {
        return invalid(
            "use_sliding_window: true is not supported for SmolLM3ForCausalLM (its NoPE \
             layers would take a window)"
                .into(),
        );
    }
    match (&hf.no_rope_layers, hf.no_rope_layer_interval.unwrap_or(4)) {
        (Some(flags), _) if flags.len() != hf.num_hidden_layers => invalid(format!(
            "no_rope_layers has {} entries for {} layers",
            flags.len(),
            hf.num_hidden_layers
        )),
        (Some(flags), _) => match flags.iter().find(|&&flag| flag > 1) {
            Some(flag) => invalid(format!(
                "no_rope_layers holds {flag}; only 0 and 1 mean something"
            )),
            None => Ok((0..flags.len()).filter(|&i| flags[i] == 0).collect()),
        },
        (None, 0) => invalid("no_rope_layer_interval 0 is not a layer interval".into()),
        (None, interval) => Ok((0..hf.num_hidden_layers)
            .filter(|layer| (layer + 1) % interval == 0)
            .collect()),
    }
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
    /// A config with these sizes and nothing else switched on (no scaling, window or bias),
    /// for tests and tools.
    pub fn plain(
        [hidden_size, intermediate_size, num_layers]: [usize; 3],
        [n_heads, n_kv_heads, head_dim]: [usize; 3],
        vocab_size: usize,
        max_position_embeddings: usize,
    ) -> Self {
        Self {
            hidden_size,
            intermediate_size,
            num_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::None,
            sliding_window: None,
            biases: Biases::default(),
            qk_norm: false,
            layers_without_rope: Vec::new(),
            max_position_embeddings,
            tie_word_embeddings: false,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
        }
    }

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

    /// Checks that `hf` describes a model of a [`Family`] we can run and fills defaults as
    /// transformers' config classes do (kv heads = heads, head_dim = hidden / heads, eps
    /// 1e-6, theta 10000, Mistral's window 4096).
    pub fn from_hf(hf: &HfConfig) -> Result<Self, ConfigError> {
        let family = Family::of(hf)?;
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
        if let Some(factor) = hf.partial_rotary_factor.filter(|f| *f != 1.0) {
            return invalid(format!(
                "partial_rotary_factor {factor} is not supported (only 1.0)"
            ));
        }
        // transformers ≥ 5 reads `rope_parameters`, older files `rope_scaling`; a file with
        // both (hand-edited) must not say two different things.
        let scaling = [&hf.rope_parameters, &hf.rope_scaling]
            .map(|r| r.as_ref().and_then(|r| r.rope_type.as_deref()))
            .map(|kind| kind.filter(|k| *k != "default"));
        if let [Some(a), Some(b)] = scaling
            && a != b
        {
            return invalid(format!(
                "rope_parameters says rope_type {a:?} but rope_scaling says {b:?}"
            ));
        }
        let rope = match scaling {
            [Some(_), _] | [None, None] => hf.rope_parameters.clone(),
            [None, Some(_)] => hf.rope_scaling.clone(),
        }
        .unwrap_or_default();
        let rope_scaling = RopeScaling::from_parameters(&rope, hf.max_position_embeddings)?;
        let rms_norm_eps = hf.rms_norm_eps.unwrap_or(1e-6);
        let rope_theta = (hf.rope_theta)
            .or_else(|| hf.rope_parameters.as_ref().and_then(|r| r.rope_theta))
            .unwrap_or(10_000.0);
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            return invalid(format!("rms_norm_eps {rms_norm_eps} must be positive"));
        }
        if !(rope_theta.is_finite() && rope_theta > 1.0) {
            return invalid(format!("rope_theta {rope_theta} must be greater than 1"));
        }
        let (sliding_window, biases) = match family {
            Family::Llama | Family::SmolLM3 => (
                None,
                Biases {
                    qkv: hf.attention_bias == Some(true),
                    o: hf.attention_bias == Some(true),
                    mlp: hf.mlp_bias == Some(true),
                },
            ),
            Family::Mistral => (hf.sliding_window.unwrap_or(Some(4096)), Biases::default()),
            Family::Qwen2 | Family::Qwen3 => {
                if hf.use_sliding_window == Some(true) {
                    return invalid(format!(
                        "use_sliding_window: true is not supported for {} (its window \
                         covers only some layers)",
                        family.architecture()
                    ));
                }
                let biases = match family {
                    Family::Qwen2 => Biases {
                        qkv: true,
                        ..Biases::default()
                    },
                    _ => Biases {
                        qkv: hf.attention_bias == Some(true),
                        o: hf.attention_bias == Some(true),
                        mlp: false,
                    },
                };
                (None, biases)
            }
        };
        if let Some(kind) = (hf.layer_types.iter().flatten()).find(|t| *t != "full_attention") {
            return invalid(format!(
                "layer_types {kind:?} is not supported (only \"full_attention\")"
            ));
        }
        if sliding_window == Some(0) {
            return invalid("sliding_window 0 leaves nothing to attend to".into());
        }
        let layers_without_rope = match family {
            Family::SmolLM3 => layers_without_rope(hf)?,
            _ => Vec::new(),
        };
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
            rope_scaling,
            sliding_window,
            biases,
            qk_norm: family == Family::Qwen3,
            layers_without_rope,
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
        v["architectures"] = serde_json::json!(["Gemma2ForCausalLM"]);
        let err = resolve(v).unwrap_err().to_string();
        assert!(err.contains("Gemma2ForCausalLM"), "{err}");
        let mut v = smollm();
        v.as_object_mut().unwrap().remove("architectures");
        v["model_type"] = "phi3".into();
        let err = resolve(v).unwrap_err().to_string();
        assert!(err.contains("phi3"), "{err}");
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
                serde_json::json!({"rope_type": "dynamic", "factor": 2.0}),
                "dynamic",
            ),
            (
                "rope_scaling",
                serde_json::json!({"type": "longrope", "factor": 2.0}),
                "longrope",
            ),
            ("hidden_act", serde_json::json!("gelu"), "gelu"),
            (
                "partial_rotary_factor",
                serde_json::json!(0.5),
                "partial_rotary_factor",
            ),
            (
                "layer_types",
                serde_json::json!(["full_attention", "sliding_attention"]),
                "sliding_attention",
            ),
            (
                "rope_parameters",
                serde_json::json!({"rope_theta": 500000.0, "rope_type": "llama3"}),
                "low_freq_factor",
            ),
        ] {
            let mut v = smollm();
            v[key] = value;
            let err = resolve(v).unwrap_err().to_string();
            assert!(err.contains(named), "{key}: {err}");
        }
        for architecture in ["Qwen2ForCausalLM", "Qwen3ForCausalLM"] {
            let mut v = smollm();
            v["architectures"] = serde_json::json!([architecture]);
            v["use_sliding_window"] = true.into();
            let err = resolve(v).unwrap_err().to_string();
            assert!(
                err.contains("use_sliding_window") && err.contains(architecture),
                "{err}"
            );
        }
        // The neutral values of the same keys are accepted.
        let mut v = smollm();
        v["rope_scaling"] = serde_json::Value::Null;
        v["attention_bias"] = false.into();
        v["rope_parameters"] = serde_json::json!({"rope_theta": 100000.0, "rope_type": "default"});
        v["layer_types"] = serde_json::json!(["full_attention"]);
        assert_eq!(resolve(v).unwrap(), resolve(smollm()).unwrap());
    }

    /// Qwen3 normalizes each query and key head; its biases follow `attention_bias` (on q,
    /// k, v and o alike), where Qwen2's q/k/v always have one.
    #[test]
    fn qwen3_has_head_norms_and_its_own_biases() {
        let mut v = smollm();
        v["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
        v["head_dim"] = 128.into();
        let plain = resolve(v.clone()).unwrap();
        assert!(plain.qk_norm);
        assert_eq!(plain.biases, Biases::default());
        assert_eq!(plain.head_dim, 128);
        v["attention_bias"] = true.into();
        let biased = resolve(v).unwrap().biases;
        assert_eq!((biased.qkv, biased.o, biased.mlp), (true, true, false));
        assert!(!resolve(smollm()).unwrap().qk_norm);
    }

    /// SmolLM3's NoPE layers: listed (`no_rope_layers`, 0 = none) or every fourth
    /// (`no_rope_layer_interval`); a list that does not fit the layers is refused.
    #[test]
    fn smollm3_layers_without_rope() {
        let mut v = smollm();
        v["architectures"] = serde_json::json!(["SmolLM3ForCausalLM"]);
        v["num_hidden_layers"] = 8.into();
        assert_eq!(resolve(v.clone()).unwrap().layers_without_rope, [3, 7]);
        v["no_rope_layer_interval"] = 3.into();
        assert_eq!(resolve(v.clone()).unwrap().layers_without_rope, [2, 5]);
        v["no_rope_layers"] = serde_json::json!([0, 1, 1, 1, 1, 1, 1, 0]);
        assert_eq!(resolve(v.clone()).unwrap().layers_without_rope, [0, 7]);
        for (flags, named) in [
            (serde_json::json!([1, 1]), "2 entries for 8 layers"),
            (serde_json::json!([1, 1, 1, 2, 1, 1, 1, 1]), "holds 2"),
        ] {
            let mut v = v.clone();
            v["no_rope_layers"] = flags;
            let err = resolve(v).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
        v["use_sliding_window"] = true.into();
        assert!(
            resolve(v)
                .unwrap_err()
                .to_string()
                .contains("use_sliding_window")
        );
        assert!(resolve(smollm()).unwrap().layers_without_rope.is_empty());
    }

    /// Llama 3.x as published (`rope_scaling` with `rope_type`, top-level `rope_theta`) and
    /// as transformers 5 saves it (`rope_parameters`), older files' `type`, explicit
    /// head_dim and biases.
    #[test]
    fn resolves_rope_scaling_and_biases() {
        let llama3 = serde_json::json!({"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let expected = RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let mut v = smollm();
        v["rope_scaling"] = llama3.clone();
        v["rope_theta"] = 500000.0.into();
        let hub = resolve(v).unwrap();
        assert_eq!(
            (hub.rope_scaling.clone(), hub.rope_theta),
            (expected, 500000.0)
        );
        let mut v = smollm();
        v.as_object_mut().unwrap().remove("rope_theta");
        let mut parameters = llama3;
        parameters["rope_theta"] = 500000.0.into();
        v["rope_parameters"] = parameters;
        assert_eq!(resolve(v).unwrap(), hub);

        let mut v = smollm();
        v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 4.0});
        v["head_dim"] = 96.into();
        v["attention_bias"] = true.into();
        v["mlp_bias"] = true.into();
        let c = resolve(v).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        assert_eq!(c.head_dim, 96);
        let all = Biases {
            qkv: true,
            o: true,
            mlp: true,
        };
        assert_eq!(c.biases, all);

        let mut v = smollm();
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32768});
        let RopeScaling::Yarn {
            attention_factor, ..
        } = resolve(v).unwrap().rope_scaling
        else {
            panic!("yarn")
        };
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
    }

    /// Mistral's window: 4096 when absent (transformers' default), none when `null`; Qwen2:
    /// q/k/v biases with no flag, its window off unless `use_sliding_window`.
    #[test]
    fn resolves_mistral_and_qwen2() {
        let mut v = smollm();
        v["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        assert_eq!(resolve(v.clone()).unwrap().sliding_window, Some(4096));
        v["sliding_window"] = serde_json::Value::Null;
        assert_eq!(resolve(v.clone()).unwrap().sliding_window, None);
        v["sliding_window"] = 24.into();
        let mistral = resolve(v).unwrap();
        assert_eq!(
            (mistral.sliding_window, mistral.biases),
            (Some(24), Biases::default())
        );

        let mut v = smollm();
        v["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        v["sliding_window"] = 4096.into();
        v["use_sliding_window"] = false.into();
        let qwen = resolve(v).unwrap();
        assert_eq!(qwen.sliding_window, None);
        assert_eq!(
            qwen.biases,
            Biases {
                qkv: true,
                ..Biases::default()
            }
        );
        let mut v = smollm();
        v.as_object_mut().unwrap().remove("architectures");
        v["model_type"] = "qwen2".into();
        assert_eq!(resolve(v).unwrap(), qwen);
    }

    /// Configs as the hub publishes them for the models each family is for (every key of
    /// Llama-3.2-1B-Instruct's, Qwen2.5-0.5B-Instruct's and Mistral-7B-v0.1's config.json),
    /// resolved as transformers reads them.
    #[test]
    fn resolves_published_configs() {
        let llama = resolve(serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "attention_bias": false,
            "attention_dropout": 0.0, "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
            "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
            "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
            "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
        }))
        .unwrap();
        assert_eq!(
            llama.rope_scaling,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0
            }
        );
        assert_eq!(llama.eos_token_ids, vec![128001, 128008, 128009]);
        assert!(llama.tie_word_embeddings && llama.biases == Biases::default());

        let qwen = resolve(serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
            "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
            "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
            "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
            "vocab_size": 151936
        }))
        .unwrap();
        assert_eq!((qwen.head_dim, qwen.sliding_window), (64, None));
        assert!(qwen.biases.qkv && !qwen.biases.o && !qwen.biases.mlp);

        let mistral = resolve(serde_json::json!({
            "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
            "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
            "intermediate_size": 14336, "max_position_embeddings": 32768,
            "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000
        }))
        .unwrap();
        assert_eq!(
            (mistral.head_dim, mistral.sliding_window),
            (128, Some(4096))
        );
        assert_eq!(mistral.rope_scaling, RopeScaling::None);
    }
}
