//! config.json of a Hugging Face Llama checkpoint, read with serde and resolved once.
//!
//! Two steps, as candle does: [`HfConfig`] mirrors the file (optional keys stay `Option`;
//! `hf.rs`), [`LlamaConfig::from_hf`] checks it and fills the defaults into plain numbers
//! (here), with each family's rules (`family.rs`).

use std::path::Path;

use kernels::layer::Activation;

use crate::util::files::FileError;

mod family;
mod frequencies;
mod hf;
pub mod pooling;

pub use family::Family;
use family::{
    activation_named, embedding_family, gemma_full_attention_layers, layers_without_rope,
};
pub use frequencies::rope_frequencies;
pub use hf::{GenerationConfig, HfConfig, RopeField, RopeParameters, TokenIds};
pub use pooling::{Pooling, PoolingMode};

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
        "unsupported architecture {0}: supported are LlamaForCausalLM, MistralForCausalLM, \
         Qwen2ForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM, Gemma3ForCausalLM and \
         Phi3ForCausalLM, and the embedding models LlamaModel and Qwen3Model"
    )]
    Architecture(String),
    #[error("invalid config: {0}")]
    Invalid(String),
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
        let kind = rope.kind().unwrap_or("default");
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
    /// Layers the window does not apply to, which attend to every earlier position (Gemma
    /// 3's global layers), in order.
    pub full_attention_layers: Vec<usize>,
    /// The RoPE base of the sliding-window layers, which turn by plain RoPE (unscaled), when
    /// it differs from the other layers' `rope_theta` and `rope_scaling` (Gemma 3).
    pub sliding_rope_theta: Option<f64>,
    pub biases: Biases,
    /// Each head's query and key RMS-normalized (over `head_dim`, with their own weights)
    /// before RoPE, as Qwen3 and Gemma 3 do.
    pub qk_norm: bool,
    /// The layers that apply no RoPE (SmolLM3's NoPE layers), in order.
    pub layers_without_rope: Vec<usize>,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Attention's score scale when it is not `1/sqrt(head_dim)` (Gemma 3's
    /// `query_pre_attn_scalar^-0.5`).
    pub score_scale: Option<f32>,
    /// Norms around both sublayers (Gemma's sandwich): the attention's and the MLP's outputs
    /// are normalized too before their residual adds (`post_attention_layernorm`,
    /// `post_feedforward_layernorm`), and the MLP's input by `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// What the embedding's rows are multiplied by (Gemma: `sqrt(hidden)`, as an f32); the
    /// tied lm_head uses the rows unscaled.
    pub embedding_scale: Option<f32>,
    /// The checkpoint's norm weights are offsets from 1 (Gemma's norms multiply by `1 + w`).
    /// The converter writes `1 + w` (in f32, as transformers computes it) into the record,
    /// as llama.cpp's GGUF files hold them: a record's norm weights are always what the norm
    /// multiplies by, so nothing after the converter reads this.
    pub unit_offset_norms: bool,
    pub max_position_embeddings: usize,
    /// lm_head is the embedding (transposed). Always so for an [`Self::embedding_model`],
    /// which has no lm_head: the converter writes the record's as the embedding, which the
    /// weights file does not store, so nothing is added to the artifact for it.
    pub tie_word_embeddings: bool,
    /// A base model without lm_head (config.json's `architectures`: `LlamaModel`,
    /// `Qwen3Model`): it embeds text (its final-norm hidden states pooled,
    /// [`Pooling`]) and generates none.
    pub embedding_model: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// Which rotary table turns a layer's queries and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// None (SmolLM3's NoPE layers).
    None,
    /// The model's: `rope_theta`, `rope_scaling`.
    Global,
    /// The sliding-window layers' own ([`LlamaConfig::sliding_rope_theta`]).
    Sliding,
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
            full_attention_layers: Vec::new(),
            sliding_rope_theta: None,
            biases: Biases::default(),
            qk_norm: false,
            layers_without_rope: Vec::new(),
            activation: Activation::Silu,
            score_scale: None,
            sandwich_norms: false,
            embedding_scale: None,
            unit_offset_norms: false,
            max_position_embeddings,
            tie_word_embeddings: false,
            embedding_model: false,
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

    /// How many of the latest positions a token of `layer` attends to (itself included), if
    /// not all.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| !self.full_attention_layers.contains(&layer))
    }

    /// The rotary table of `layer`.
    pub fn rotation(&self, layer: usize) -> Rotation {
        if self.layers_without_rope.contains(&layer) {
            Rotation::None
        } else if self.sliding_rope_theta.is_some() && self.window(layer).is_some() {
            Rotation::Sliding
        } else {
            Rotation::Global
        }
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
        if let Some(types) = &hf.layer_types
            && types.len() != hf.num_hidden_layers
        {
            // As transformers' `layer_type_validation`, for every family.
            return invalid(format!(
                "layer_types has {} entries for {} layers",
                types.len(),
                hf.num_hidden_layers
            ));
        }
        if let Some(rope) = &hf.rope_scaling {
            rope.check_kinds_agree("rope_scaling")?;
        }
        for rope in hf.rope_parameters.iter().flat_map(RopeField::all) {
            rope.check_kinds_agree("rope_parameters")?;
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
        let gemma = family == Family::Gemma3;
        // Gemma3TextConfig's defaults differ from Llama's: head_dim 256 whatever the hidden
        // size, tied embeddings.
        let head_dim = (hf.head_dim)
            .or(gemma.then_some(256))
            .unwrap_or(hf.hidden_size / hf.num_attention_heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > MAX_DIM {
            return invalid(format!("head_dim {head_dim} must be even and non-zero"));
        }
        let activation = match [&hf.hidden_act, &hf.hidden_activation] {
            [Some(a), Some(b)] if a != b => {
                return invalid(format!(
                    "hidden_act {a:?} and hidden_activation {b:?} disagree"
                ));
            }
            [Some(name), _] | [None, Some(name)] => activation_named(name)?,
            [None, None] if gemma => Activation::GeluTanh,
            [None, None] => Activation::Silu,
        };
        for (name, value) in [
            ("attn_logit_softcapping", hf.attn_logit_softcapping),
            ("final_logit_softcapping", hf.final_logit_softcapping),
        ] {
            if let Some(cap) = value {
                return invalid(format!("{name} {cap} is not supported (only null)"));
            }
        }
        if hf.use_bidirectional_attention == Some(true) {
            return invalid("use_bidirectional_attention: true is not supported".into());
        }
        let rope_parameters = |kind: &str| match &hf.rope_parameters {
            Some(RopeField::ByLayerType(_)) if !gemma => Err(ConfigError::Invalid(format!(
                "rope_parameters by layer type is not supported for {}",
                family.architecture()
            ))),
            Some(field) => Ok(field.of(kind).cloned()),
            None => Ok(None),
        };
        let full_rope = rope_parameters("full_attention")?;
        // At the top level (hub files) or among the RoPE parameters (transformers 5).
        let nested = [&full_rope, &hf.rope_scaling].map(|r| r.as_ref()?.partial_rotary_factor);
        let factors = nested.into_iter().chain([hf.partial_rotary_factor]);
        if let Some(factor) = factors.flatten().find(|f| *f != 1.0) {
            return invalid(format!(
                "partial_rotary_factor {factor} is not supported (only 1.0)"
            ));
        }
        // transformers ≥ 5 reads `rope_parameters`, older files `rope_scaling`; a file with
        // both (hand-edited) must not say two different things.
        let scaling = [&full_rope, &hf.rope_scaling]
            .map(|r| r.as_ref().and_then(|r| r.kind()))
            .map(|kind| kind.filter(|k| *k != "default"));
        if let [Some(a), Some(b)] = scaling
            && a != b
        {
            return invalid(format!(
                "rope_parameters says rope_type {a:?} but rope_scaling says {b:?}"
            ));
        }
        let rope = match scaling {
            [Some(_), _] | [None, None] => full_rope.clone(),
            [None, Some(_)] => hf.rope_scaling.clone(),
        }
        .unwrap_or_default();
        let rope_scaling = RopeScaling::from_parameters(&rope, hf.max_position_embeddings)?;
        let rms_norm_eps = hf.rms_norm_eps.unwrap_or(1e-6);
        let rope_theta = (hf.rope_theta)
            .or_else(|| full_rope.as_ref().and_then(|r| r.rope_theta))
            .unwrap_or(if gemma { 1_000_000.0 } else { 10_000.0 });
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            return invalid(format!("rms_norm_eps {rms_norm_eps} must be positive"));
        }
        let check_theta = |theta: f64, name: &str| match theta.is_finite() && theta > 1.0 {
            true => Ok(theta),
            false => Err(ConfigError::Invalid(format!(
                "{name} {theta} must be greater than 1"
            ))),
        };
        let rope_theta = check_theta(rope_theta, "rope_theta")?;
        let mut full_attention_layers = Vec::new();
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
            Family::Phi3 => (hf.sliding_window.flatten(), Biases::default()),
            Family::Gemma3 => {
                full_attention_layers = gemma_full_attention_layers(hf)?;
                let window = match hf.sliding_window {
                    None => 4096,
                    Some(Some(window)) => window,
                    Some(None) => {
                        return invalid(
                            "sliding_window null is not supported for Gemma3ForCausalLM (its \
                             sliding_attention layers need one)"
                                .into(),
                        );
                    }
                };
                let bias = hf.attention_bias == Some(true);
                let biases = Biases {
                    qkv: bias,
                    o: bias,
                    mlp: false,
                };
                (Some(window), biases)
            }
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
        if !gemma
            && let Some(kind) = (hf.layer_types.iter().flatten()).find(|t| *t != "full_attention")
        {
            return invalid(format!(
                "layer_types {kind:?} is not supported for {} (only \"full_attention\")",
                family.architecture()
            ));
        }
        if sliding_window == Some(0) {
            return invalid("sliding_window 0 leaves nothing to attend to".into());
        }
        let sliding_rope_theta = match gemma {
            true => {
                let parameters = rope_parameters("sliding_attention")?.unwrap_or_default();
                if let Some(kind) = (parameters.kind()).filter(|k| *k != "default") {
                    return invalid(format!(
                        "rope_type {kind:?} for sliding_attention layers is not supported \
                         (only \"default\")"
                    ));
                }
                let theta = (parameters.rope_theta)
                    .or(hf.rope_local_base_freq)
                    .unwrap_or(10_000.0);
                Some(check_theta(theta, "rope_local_base_freq")?)
            }
            false => None,
        };
        // Values are checked as the model uses them: as f32, and through what they make
        // (a scale, the rotary tables' frequencies). 1e-300 is positive, its scale infinite.
        let positive = |v: f32| v.is_finite() && v > 0.0;
        let score_scale = match hf.query_pre_attn_scalar.or(gemma.then_some(256.0)) {
            Some(scalar) if positive(scalar.powf(-0.5) as f32) => {
                Some(scalar.powf(-0.5) as f32).filter(|_| gemma)
            }
            Some(scalar) => {
                return invalid(format!(
                    "query_pre_attn_scalar {scalar} must be positive, and its scale \
                     ({scalar}^-0.5) finite as an f32"
                ));
            }
            None => None,
        };
        if !positive(rms_norm_eps as f32) {
            return invalid(format!(
                "rms_norm_eps {rms_norm_eps:e} is 0 as an f32 (at least 1.2e-38)"
            ));
        }
        let rotations = [
            (rope_theta, &rope_scaling, "rope_theta and rope_scaling"),
            (
                sliding_rope_theta.unwrap_or(rope_theta),
                &RopeScaling::None,
                "rope_local_base_freq",
            ),
        ];
        for (theta, scaling, what) in rotations {
            let (inv_freq, scale) = rope_frequencies(head_dim, theta, scaling);
            if !(positive(scale) && inv_freq.iter().all(|&f| positive(f))) {
                return invalid(format!(
                    "{what} give RoPE frequencies or a scale that are not finite and \
                     positive as f32 (a factor that is 0 or infinite as an f32?): {scaling:?}"
                ));
            }
        }
        let layers_without_rope = match family {
            Family::SmolLM3 => layers_without_rope(hf)?,
            _ => Vec::new(),
        };
        let tied_by_default = matches!(family, Family::Gemma3 | Family::SmolLM3);
        let embedding_model = embedding_family(hf).is_some();
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
            full_attention_layers,
            sliding_rope_theta,
            biases,
            qk_norm: matches!(family, Family::Qwen3 | Family::Gemma3),
            layers_without_rope,
            activation,
            score_scale,
            sandwich_norms: gemma,
            embedding_scale: gemma.then(|| (hf.hidden_size as f64).sqrt() as f32),
            unit_offset_norms: gemma,
            max_position_embeddings: hf.max_position_embeddings,
            tie_word_embeddings: embedding_model
                || hf.tie_word_embeddings.unwrap_or(tied_by_default),
            embedding_model,
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
        v["model_type"] = "falcon".into();
        let err = resolve(v).unwrap_err().to_string();
        assert!(err.contains("falcon"), "{err}");
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
                // One entry per layer of SmolLM2's 30.
                serde_json::json!(
                    (0..30)
                        .map(|i| match i {
                            1 => "sliding_attention",
                            _ => "full_attention",
                        })
                        .collect::<Vec<_>>()
                ),
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
        v["layer_types"] = serde_json::json!(vec!["full_attention"; 30]);
        assert_eq!(resolve(v).unwrap(), resolve(smollm()).unwrap());
    }

    /// `layer_types` must have an entry per layer, whatever the family (as transformers'
    /// `layer_type_validation`); a legacy `type` beside `rope_type` must name the same type.
    #[test]
    fn layer_types_and_rope_types_must_agree_with_the_rest() {
        for architecture in ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"] {
            let mut v = smollm();
            v["architectures"] = serde_json::json!([architecture]);
            v["layer_types"] = serde_json::json!(vec!["full_attention"; 29]);
            let err = resolve(v).unwrap_err().to_string();
            assert!(
                err.contains("layer_types has 29 entries for 30 layers"),
                "{err}"
            );
        }
        let linear = |legacy: &str| {
            let mut v = smollm();
            v["rope_scaling"] =
                serde_json::json!({"rope_type": "linear", "type": legacy, "factor": 2.0});
            resolve(v)
        };
        let mut v = smollm();
        v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 2.0});
        assert_eq!(linear("linear").unwrap(), resolve(v).unwrap());
        let err = linear("yarn").unwrap_err().to_string();
        assert!(
            err.contains("rope_scaling says rope_type \"linear\" but type \"yarn\""),
            "{err}"
        );
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

    /// Gemma 3 1B's and Phi-3-mini-4k's config.json as the hub publishes them (every key),
    /// resolved as transformers reads them; and what of Gemma 3 is refused by name.
    #[test]
    fn resolves_gemma3_and_phi3() {
        let gemma = serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
            "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2,
            "cache_implementation": "hybrid", "eos_token_id": [1, 106],
            "final_logit_softcapping": null, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
            "initializer_range": 0.02, "intermediate_size": 6912,
            "max_position_embeddings": 32768, "model_type": "gemma3_text",
            "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
            "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
            "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
            "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144
        });
        let c = resolve(gemma.clone()).unwrap();
        assert_eq!(c.full_attention_layers, [5, 11, 17, 23]);
        assert_eq!(
            (c.window(0), c.window(5), c.window(25)),
            (Some(512), None, Some(512))
        );
        assert_eq!(
            (c.rotation(0), c.rotation(5)),
            (Rotation::Sliding, Rotation::Global)
        );
        assert_eq!(
            (c.rope_theta, c.sliding_rope_theta, c.rope_scaling.clone()),
            (1e6, Some(1e4), RopeScaling::None)
        );
        assert_eq!(c.activation, Activation::GeluTanh);
        assert_eq!(c.score_scale, Some(1.0 / 16.0));
        assert_eq!(c.embedding_scale, Some((1152f64).sqrt() as f32));
        assert!(c.qk_norm && c.sandwich_norms && c.unit_offset_norms && c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, [1, 106]);
        // As transformers 5 saves it: layer_types and rope_parameters by layer type.
        let mut saved = gemma.clone();
        let object = saved.as_object_mut().unwrap();
        for key in [
            "rope_local_base_freq",
            "rope_scaling",
            "rope_theta",
            "sliding_window_pattern",
        ] {
            object.remove(key);
        }
        let kinds: Vec<&str> = (0..26)
            .map(|i| match (i + 1) % 6 {
                0 => "full_attention",
                _ => "sliding_attention",
            })
            .collect();
        saved["layer_types"] = serde_json::json!(kinds);
        saved["rope_parameters"] = serde_json::json!({
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}});
        assert_eq!(resolve(saved).unwrap(), c);
        for (key, value, named) in [
            (
                "final_logit_softcapping",
                serde_json::json!(30.0),
                "final_logit_softcapping",
            ),
            (
                "attn_logit_softcapping",
                serde_json::json!(50.0),
                "attn_logit_softcapping",
            ),
            (
                "use_bidirectional_attention",
                true.into(),
                "use_bidirectional_attention",
            ),
            (
                "sliding_window",
                serde_json::Value::Null,
                "sliding_window null",
            ),
            (
                "layer_types",
                serde_json::json!(vec!["chunked_attention"; 26]),
                "chunked_attention",
            ),
            (
                "layer_types",
                serde_json::json!(vec!["full_attention"; 3]),
                "3 entries for 26",
            ),
        ] {
            let mut v = gemma.clone();
            v[key] = value;
            let err = resolve(v).unwrap_err().to_string();
            assert!(err.contains(named), "{key}: {err}");
        }
        // Per-layer-type RoPE is Gemma's alone.
        let mut v = smollm();
        v["rope_parameters"] = serde_json::json!({"full_attention": {"rope_theta": 1e4}});
        assert!(
            resolve(v)
                .unwrap_err()
                .to_string()
                .contains("by layer type")
        );

        let phi = resolve(serde_json::json!({
            "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
            "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0,
            "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
            "initializer_range": 0.02, "intermediate_size": 8192,
            "max_position_embeddings": 4096, "model_type": "phi3",
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "original_max_position_embeddings": 4096, "pad_token_id": 32000,
            "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
            "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true,
            "attention_bias": false, "vocab_size": 32064
        }))
        .unwrap();
        assert_eq!((phi.head_dim, phi.sliding_window), (96, Some(2047)));
        assert_eq!(
            (phi.window(31), phi.rotation(31)),
            (Some(2047), Rotation::Global)
        );
        assert!(!phi.tie_word_embeddings && !phi.qk_norm && phi.biases == Biases::default());
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
