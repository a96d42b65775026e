//! config.json and generation_config.json as transformers writes them: the keys we read,
//! optional ones left `Option`, nothing resolved (that is [`super::LlamaConfig::from_hf`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{CONFIG_LIMIT, ConfigError};
use crate::util::files::read_text_bounded;

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
    /// transformers ≥ 5 writes RoPE's theta and scaling here instead (Gemma 3: one set per
    /// layer type).
    pub rope_parameters: Option<RopeField>,
    pub partial_rotary_factor: Option<f64>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: Option<bool>,
    pub hidden_act: Option<String>,
    /// Gemma's name for `hidden_act`.
    pub hidden_activation: Option<String>,
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
    /// Gemma 3: scores scaled by `query_pre_attn_scalar^-0.5` instead of `head_dim`'s.
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 3 as the hub writes it: the sliding-window layers' RoPE base, and one layer in
    /// `sliding_window_pattern` global (the last of each run) when `layer_types` is absent.
    pub rope_local_base_freq: Option<f64>,
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 2's soft caps (`null` in Gemma 3's configs) and EmbeddingGemma's
    /// bidirectional attention: refused.
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub use_bidirectional_attention: Option<bool>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
    /// An embedding model's sizes its embeddings may be cut to (Matryoshka training; as
    /// jina-embeddings-v3's config.json lists them and vLLM reads them).
    pub matryoshka_dimensions: Option<Vec<usize>>,
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
    /// Read through [`Self::kind`], which also takes `type`.
    pub rope_type: Option<String>,
    /// What older files say instead of `rope_type`; transformers' `save_pretrained` writes
    /// both for them (`LlamaConfig::from_hf` refuses the two if they disagree).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub legacy_type: Option<String>,
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
    pub partial_rotary_factor: Option<f64>,
}

impl RopeParameters {
    /// The RoPE type: `rope_type`, or else the older `type`.
    pub fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.legacy_type.as_deref())
    }

    /// Refuses a `rope_type` and a `type` that name different types (transformers reads
    /// `rope_type`; a file saying both ways must mean one thing).
    pub(super) fn check_kinds_agree(&self, field: &str) -> Result<(), ConfigError> {
        match (&self.rope_type, &self.legacy_type) {
            (Some(rope_type), Some(legacy)) if rope_type != legacy => Err(ConfigError::Invalid(
                format!("{field} says rope_type {rope_type:?} but type {legacy:?}"),
            )),
            _ => Ok(()),
        }
    }
}

/// `rope_parameters`: one set for every layer, or (Gemma 3) one per layer type
/// (`full_attention`, `sliding_attention`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RopeField {
    ByLayerType(std::collections::BTreeMap<String, RopeParameters>),
    Flat(Box<RopeParameters>),
}

impl RopeField {
    /// The parameters of layers of `kind`: the flat set, or that type's.
    pub(super) fn of(&self, kind: &str) -> Option<&RopeParameters> {
        match self {
            Self::Flat(parameters) => Some(parameters.as_ref()),
            Self::ByLayerType(types) => types.get(kind),
        }
    }

    /// Every set of parameters it holds.
    pub(super) fn all(&self) -> Vec<&RopeParameters> {
        match self {
            Self::Flat(parameters) => vec![parameters.as_ref()],
            Self::ByLayerType(types) => types.values().collect(),
        }
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
