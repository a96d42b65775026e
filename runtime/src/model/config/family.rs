//! The model families and the rules each brings to config.json: which architectures are
//! one decoder with which switches, and how a family's keys name its layers.

use kernels::layer::Activation;

use super::{ConfigError, HfConfig};

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
    /// `Gemma3ForCausalLM` (the text models, `gemma3_text`): sliding-window layers
    /// interleaved with global ones, each kind with its own RoPE base; q/k norms; norms
    /// around both attention and MLP (sandwich); embeddings scaled by `sqrt(hidden)`;
    /// GELU-tanh; norm weights stored as offsets from 1; attention scaled by
    /// `query_pre_attn_scalar`.
    Gemma3,
    /// `Phi3ForCausalLM`: q, k and v in one fused projection, gate and up in another (the
    /// converter splits them); `sliding_window` over every layer when given.
    Phi3,
}

/// (`architectures` entry, `model_type`, family).
const FAMILIES: [(&str, &str, Family); 7] = [
    ("LlamaForCausalLM", "llama", Family::Llama),
    ("MistralForCausalLM", "mistral", Family::Mistral),
    ("Qwen2ForCausalLM", "qwen2", Family::Qwen2),
    ("Qwen3ForCausalLM", "qwen3", Family::Qwen3),
    ("SmolLM3ForCausalLM", "smollm3", Family::SmolLM3),
    ("Gemma3ForCausalLM", "gemma3_text", Family::Gemma3),
    ("Phi3ForCausalLM", "phi3", Family::Phi3),
];

/// Base models without an lm_head, saved as transformers' `LlamaModel` / `Qwen3Model` (an
/// embedding model: Qwen3-Embedding, sentence-transformers' decoders): (`architectures`
/// entry, family). They embed text and generate none.
const EMBEDDING_MODELS: [(&str, Family); 2] =
    [("LlamaModel", Family::Llama), ("Qwen3Model", Family::Qwen3)];

impl Family {
    /// The transformers class of the family.
    pub(super) fn architecture(self) -> &'static str {
        let listed = FAMILIES.iter().find(|(.., family)| *family == self);
        listed.expect("every family is listed").0
    }

    /// The family `hf` names: its first `architectures` entry, or `model_type` without one.
    pub(super) fn of(hf: &HfConfig) -> Result<Self, ConfigError> {
        if let Some(family) = embedding_family(hf) {
            return Ok(family);
        }
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

/// The family of an embedding model (its first `architectures` entry a base model without
/// lm_head, [`EMBEDDING_MODELS`]), or `None` for a model that generates.
pub(super) fn embedding_family(hf: &HfConfig) -> Option<Family> {
    let name = hf.architectures.first()?;
    let listed = EMBEDDING_MODELS.iter().find(|(arch, _)| arch == name);
    listed.map(|&(_, family)| family)
}

/// The activation transformers' `ACT2FN` names `name`.
pub(super) fn activation_named(name: &str) -> Result<Activation, ConfigError> {
    match name {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
        other => Err(ConfigError::Invalid(format!(
            "hidden_act {other:?} is not supported (supported: \"silu\", \
                 \"gelu_pytorch_tanh\")"
        ))),
    }
}

/// SmolLM3's NoPE layers, as transformers' `SmolLM3Config` reads them: `no_rope_layers`
/// (1 = RoPE, 0 = none, one a layer), else every `no_rope_layer_interval`-th layer (4).
pub(super) fn layers_without_rope(hf: &HfConfig) -> Result<Vec<usize>, ConfigError> {
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

/// Gemma 3's global layers: `layer_types`' `full_attention` entries (the others must be
/// `sliding_attention`; `LlamaConfig::from_hf` checked their number), else the last of every `sliding_window_pattern` (6) layers, as
/// transformers' `Gemma3TextConfig` reads them.
pub(super) fn gemma_full_attention_layers(hf: &HfConfig) -> Result<Vec<usize>, ConfigError> {
    let invalid = |msg: String| Err(ConfigError::Invalid(msg));
    match (&hf.layer_types, hf.sliding_window_pattern.unwrap_or(6)) {
        (Some(types), _) => {
            let mut full = Vec::new();
            for (layer, kind) in types.iter().enumerate() {
                match kind.as_str() {
                    "full_attention" => full.push(layer),
                    "sliding_attention" => {}
                    other => {
                        return invalid(format!(
                            "layer_types {other:?} is not supported (only \"full_attention\" \
                             and \"sliding_attention\")"
                        ));
                    }
                }
            }
            Ok(full)
        }
        (None, 0) => invalid("sliding_window_pattern 0 is not a layer interval".into()),
        (None, pattern) => Ok((0..hf.num_hidden_layers)
            .filter(|layer| (layer + 1) % pattern == 0)
            .collect()),
    }
}
