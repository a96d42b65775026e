//! config.json synthesised from a GGUF's `llama.*` metadata.

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value as Json, json};

use super::tokenizer::TokenizerSpec;
use crate::gguf::{Gguf, Value};

/// The tensor llama.cpp's converter writes Llama 3.1's RoPE scaling as.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// The GGUF architectures we import, with the Hugging Face class each becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `llama`: Llama 2/3, SmolLM, ...; q and k rows permuted by llama.cpp's converter.
    Llama,
    /// `qwen2`: biases on q, k and v; rows as published.
    Qwen2,
    /// `qwen3`: each query and key head normalized (`attn_q_norm`, `attn_k_norm`); rows as
    /// published.
    Qwen3,
    /// `gemma3` (the text model): sliding-window layers with their own RoPE base, q/k and
    /// sandwich norms, norm weights written by llama.cpp's converter as `1 + w`; rows as
    /// published.
    Gemma3,
    /// `phi3`: q/k/v and gate/up each one fused tensor, as Phi3ForCausalLM holds them.
    Phi3,
    /// `smollm3`: a Llama (q and k rows permuted alike) without RoPE in every fourth layer.
    SmolLM3,
}

/// The GGUF names of the architectures [`Arch::read`] accepts.
const SUPPORTED: &str = "\"llama\", \"qwen2\", \"qwen3\", \"gemma3\", \"phi3\" and \"smollm3\"";

impl Arch {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        match gguf.str("general.architecture")? {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "gemma3" => Ok(Self::Gemma3),
            "phi3" => Ok(Self::Phi3),
            "smollm3" => Ok(Self::SmolLM3),
            other => bail!("unsupported GGUF architecture {other:?}: supported are {SUPPORTED}"),
        }
    }

    /// The metadata key prefix, `llama.block_count`.
    fn prefix(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma3 => "gemma3",
            Self::Phi3 => "phi3",
            Self::SmolLM3 => "smollm3",
        }
    }

    /// Whether llama.cpp's converter interleaves the rotary halves of q's and k's rows
    /// (`LlamaModel.permute`, `undo_permute`).
    pub fn permutes_q_k(self) -> bool {
        matches!(self, Self::Llama | Self::SmolLM3)
    }

    /// What llama.cpp's converter added to a tensor's values (`norm_shift`: Gemma 3's norm
    /// weights are written as `1 + w`, the weight llama.cpp multiplies by).
    pub fn value_shift(self, gguf_name: &str) -> f32 {
        match self {
            Self::Gemma3 if gguf_name.ends_with("norm.weight") => 1.0,
            _ => 0.0,
        }
    }
}

/// SmolLM3's NoPE layers: llama.cpp's fixed step (`n_no_rope_layer_step`), every fourth
/// layer without RoPE, as transformers' default `no_rope_layer_interval`.
const SMOLLM3_NO_ROPE_INTERVAL: u64 = 4;

/// Gemma 3's defaults in llama.cpp when the metadata does not say: one global layer in 6,
/// the last of each run (`load_swa_pattern(ml, 6)`), and the sliding layers' RoPE base.
const GEMMA3_SWA_PATTERN: u64 = 6;
const GEMMA3_ROPE_BASE_SWA: f64 = 10_000.0;

/// Gemma 3 27B, whose scores llama.cpp scales by `(hidden / heads)^-0.5`, not
/// `head_dim^-0.5` (its `query_pre_attn_scalar`).
const GEMMA3_27B_LAYERS: u64 = 62;

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
    /// in full.
    pub linear_rope_factor: Option<f64>,
    /// Llama 3.1's scaling, which llama.cpp's converter writes only as the `rope_freqs`
    /// tensor of per-frequency divisors: the parameters that give those divisors.
    pub llama3_rope: Option<Llama3Rope>,
    pub rms_eps: f64,
    pub vocab: u64,
    /// Llama's `attention_bias` and `mlp_bias`: whether the tensors have them.
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// `attention.key_length`, or hidden / heads.
    pub key_length: u64,
    /// Gemma 3's and Phi-3's `attention.sliding_window` (0 or absent: none).
    pub sliding_window: Option<u64>,
    /// Gemma 3: per layer, whether it is a sliding-window layer, as llama.cpp reads them.
    pub sliding_layers: Vec<bool>,
    /// Gemma 3: the sliding-window layers' RoPE base (`rope.freq_base_swa`).
    pub rope_theta_swa: f64,
    /// Phi-3: `rope.dimension_count / head_dim`, where it is not 1.
    pub partial_rotary_factor: Option<f64>,
    /// Phi-3: `rope.scaling.original_context_length`.
    pub original_context: Option<u64>,
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
        // The embedding's rows where there is one: config.json's vocab_size is its size
        // (Gemma 3's converter drops rows past the tokenizer's).
        let embedding_rows = (gguf.tensors.iter())
            .find(|t| t.name == "token_embd.weight")
            .and_then(|t| t.shape().first().copied());
        let vocab = match (
            embedding_rows,
            optional("vocab_size").and_then(Value::as_u64),
        ) {
            (Some(rows), _) => rows as u64,
            (None, Some(v)) => v,
            (None, None) => gguf.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        for tensor in ["rope_factors_long.weight", "rope_factors_short.weight"] {
            ensure!(
                !gguf.tensors.iter().any(|t| t.name == tensor),
                "unsupported GGUF tensor {tensor} (LongRoPE scaling, Phi-3's long-context \
                 variants): convert the Hugging Face checkpoint instead"
            );
        }
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
        let head_dim_or_default = head_dim.unwrap_or(hidden / n_heads.max(1)) as usize;
        let rope_theta = optional("rope.freq_base")
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0);
        let llama3_rope = match gguf.tensors.iter().find(|t| t.name == ROPE_FREQS) {
            None => None,
            Some(info) => {
                let divisors = gguf.dequantize(info)?;
                let rope = Llama3Rope::from_divisors(&divisors, head_dim_or_default, rope_theta)
                    .with_context(|| {
                        format!(
                            "unsupported GGUF tensor {ROPE_FREQS} (RoPE scaling as frequency \
                             factors): convert the Hugging Face checkpoint instead"
                        )
                    })?;
                ensure!(
                    linear_rope_factor.is_none(),
                    "the GGUF has both linear RoPE scaling and {ROPE_FREQS}"
                );
                Some(rope)
            }
        };
        let layers = gguf.u64(&key("block_count"))?;
        // Every layer has tensors of its own: a count past the file's tensors is corrupt,
        // and refusing it here keeps the per-layer lists below within the file's size.
        ensure!(
            (1..=gguf.tensors.len() as u64).contains(&layers),
            "GGUF metadata {} is {layers}, but the file holds {} tensors",
            key("block_count"),
            gguf.tensors.len()
        );
        let key_length = optional("attention.key_length")
            .and_then(Value::as_u64)
            .unwrap_or(hidden / n_heads.max(1));
        let sliding_window = match arch {
            Arch::Gemma3 | Arch::Phi3 => optional("attention.sliding_window")
                .and_then(Value::as_u64)
                .filter(|&w| w > 0),
            _ => None,
        };
        let mlp_bias = has("ffn_gate.bias") || has("ffn_up.bias") || has("ffn_down.bias");
        let mut sliding_layers = Vec::new();
        let mut rope_theta_swa = rope_theta;
        let mut partial_rotary_factor = None;
        let mut original_context = None;
        match arch {
            Arch::Gemma3 => {
                ensure!(!mlp_bias, "Gemma 3's MLP has no biases, the GGUF has");
                if let Some(cap) = optional("final_logit_softcapping").and_then(Value::as_f64) {
                    ensure!(
                        cap == 0.0,
                        "unsupported GGUF metadata {} {cap} (soft-capped logits)",
                        key("final_logit_softcapping")
                    );
                }
                if sliding_window.is_some() {
                    sliding_layers = gemma3_sliding_layers(
                        optional("attention.sliding_window_pattern"),
                        layers,
                        &key("attention.sliding_window_pattern"),
                    )?;
                    rope_theta_swa = optional("rope.freq_base_swa")
                        .and_then(Value::as_f64)
                        .unwrap_or(GEMMA3_ROPE_BASE_SWA);
                } else {
                    // llama.cpp: no window, every layer global.
                    sliding_layers = vec![false; layers as usize];
                }
            }
            Arch::Phi3 => {
                ensure!(!mlp_bias, "Phi-3's MLP has no biases, the GGUF has");
                ensure!(
                    linear_rope_factor.is_none(),
                    "unsupported GGUF RoPE scaling \"linear\" for phi3 (Phi3ForCausalLM has none)"
                );
                ensure!(
                    n_heads > 0 && key_length == hidden / n_heads,
                    "{} {key_length} is not hidden / heads, as Phi3ForCausalLM's head size is",
                    key("attention.key_length")
                );
                let rope_dims = optional("rope.dimension_count")
                    .and_then(Value::as_u64)
                    .unwrap_or(key_length);
                ensure!(
                    rope_dims > 0 && rope_dims <= key_length && rope_dims % 2 == 0,
                    "{} {rope_dims} does not fit heads of {key_length}",
                    key("rope.dimension_count")
                );
                partial_rotary_factor =
                    (rope_dims != key_length).then(|| rope_dims as f64 / key_length as f64);
                original_context =
                    optional("rope.scaling.original_context_length").and_then(Value::as_u64);
            }
            _ => {}
        }
        Ok(Self {
            arch,
            layers,
            context_length: gguf.u64(&key("context_length"))?,
            hidden,
            ffn: gguf.u64(&key("feed_forward_length"))?,
            n_heads: n_heads as usize,
            n_kv_heads: optional("attention.head_count_kv")
                .and_then(Value::as_u64)
                .unwrap_or(n_heads) as usize,
            head_dim,
            rope_theta,
            linear_rope_factor,
            llama3_rope,
            rms_eps: float("attention.layer_norm_rms_epsilon")?,
            vocab,
            attention_bias: has("attn_output.bias"),
            mlp_bias,
            key_length,
            sliding_window,
            sliding_layers,
            rope_theta_swa,
            partial_rotary_factor,
            original_context,
        })
    }

    pub fn config_json(&self, tok: &TokenizerSpec, tied: bool) -> Json {
        let rope_scaling = match (self.linear_rope_factor, &self.llama3_rope) {
            (Some(factor), _) => json!({"rope_type": "linear", "factor": factor}),
            (None, Some(rope)) => json!({
                "rope_type": "llama3",
                "factor": rope.factor,
                "low_freq_factor": rope.low_freq_factor,
                "high_freq_factor": rope.high_freq_factor,
                "original_max_position_embeddings": rope.original_context,
            }),
            (None, None) => Json::Null,
        };
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
        if self.arch == Arch::Qwen3 {
            // Biases on q, k, v and o alike, as `attention_bias` says; none on the MLP.
            fields.remove("mlp_bias");
            fields.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
            fields.insert("model_type".into(), json!("qwen3"));
            fields.insert("use_sliding_window".into(), json!(false));
        }
        self.arch_fields(fields);
        config
    }

    /// The fields of Gemma 3's, Phi-3's and SmolLM3's config.json that differ from Llama's.
    fn arch_fields(&self, fields: &mut serde_json::Map<String, Json>) {
        match self.arch {
            Arch::Gemma3 => self.gemma3_fields(fields),
            Arch::Phi3 => {
                // Phi-3 has no biases and its head size is hidden / heads.
                for field in ["attention_bias", "mlp_bias", "head_dim"] {
                    fields.remove(field);
                }
                fields.insert("architectures".into(), json!(["Phi3ForCausalLM"]));
                fields.insert("model_type".into(), json!("phi3"));
                // llama.cpp ignores Phi-3's window when it loads a GGUF (llama-model's
                // phi3 "SWA is currently disabled"), transformers applies it: the model as
                // published has it, so config.json keeps it (null: none).
                fields.insert("sliding_window".into(), json!(self.sliding_window));
                if let Some(context) = self.original_context {
                    fields.insert("original_max_position_embeddings".into(), json!(context));
                }
                if let Some(factor) = self.partial_rotary_factor {
                    fields.insert("partial_rotary_factor".into(), json!(factor));
                }
            }
            Arch::SmolLM3 => {
                fields.insert("architectures".into(), json!(["SmolLM3ForCausalLM"]));
                fields.insert("model_type".into(), json!("smollm3"));
                fields.insert(
                    "no_rope_layer_interval".into(),
                    json!(SMOLLM3_NO_ROPE_INTERVAL),
                );
                // 1: the layer applies RoPE (llama.cpp: `(il + 1) % 4 != 0`).
                let no_rope: Vec<u8> = (0..self.layers)
                    .map(|i| u8::from((i + 1) % SMOLLM3_NO_ROPE_INTERVAL != 0))
                    .collect();
                fields.insert("no_rope_layers".into(), json!(no_rope));
                fields.insert("use_sliding_window".into(), json!(false));
                fields.insert("sliding_window".into(), Json::Null);
            }
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {}
        }
    }

    /// Gemma 3's config.json fields, as the hub writes them (`rope_theta`,
    /// `rope_local_base_freq`, `rope_scaling` of the global layers) with the layers' kinds
    /// as `layer_types`.
    fn gemma3_fields(&self, fields: &mut serde_json::Map<String, Json>) {
        for field in ["hidden_act", "mlp_bias"] {
            fields.remove(field);
        }
        let kinds: Vec<&str> = (self.sliding_layers.iter())
            .map(|&sliding| match sliding {
                true => "sliding_attention",
                false => "full_attention",
            })
            .collect();
        // llama.cpp's score scale (`f_attention_scale`): head_dim^-0.5, but for the 27B.
        let query_pre_attn_scalar = match self.layers {
            GEMMA3_27B_LAYERS => self.hidden / self.n_heads.max(1) as u64,
            _ => self.key_length,
        };
        for (field, value) in [
            ("architectures", json!(["Gemma3ForCausalLM"])),
            ("model_type", json!("gemma3_text")),
            ("hidden_activation", json!("gelu_pytorch_tanh")),
            ("head_dim", json!(self.key_length)),
            ("query_pre_attn_scalar", json!(query_pre_attn_scalar)),
            ("layer_types", json!(kinds)),
            // Without a window every layer is global: any window then means nothing.
            (
                "sliding_window",
                json!(self.sliding_window.unwrap_or(self.context_length)),
            ),
            ("rope_local_base_freq", json!(self.rope_theta_swa)),
            ("attn_logit_softcapping", Json::Null),
            ("final_logit_softcapping", Json::Null),
        ] {
            fields.insert(field.into(), value);
        }
    }
}

/// Gemma 3's sliding-window layers as llama.cpp reads them (`load_swa_pattern`):
/// `attention.sliding_window_pattern` as one flag a layer, or as a period `n` (every `n`-th
/// layer global, the last of each run; 0: none), else the period 6.
fn gemma3_sliding_layers(pattern: Option<&Value>, layers: u64, key: &str) -> Result<Vec<bool>> {
    let flags = match pattern {
        Some(Value::Array(items)) => {
            let flags = (items.values())
                .map(|v| match v {
                    Value::Bool(b) => Some(b),
                    _ => None,
                })
                .collect::<Option<Vec<bool>>>()
                .with_context(|| format!("GGUF metadata {key} holds a non-boolean"))?;
            ensure!(
                flags.len() as u64 == layers,
                "GGUF metadata {key} has {} entries for {layers} layers",
                flags.len()
            );
            flags
        }
        Some(other) => {
            let n = other
                .as_u64()
                .with_context(|| format!("GGUF metadata {key} is not a layer count or flags"))?;
            (0..layers).map(|i| n == 0 || i % n < n - 1).collect()
        }
        None => (0..layers)
            .map(|i| i % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1)
            .collect(),
    };
    Ok(flags)
}

/// Llama 3.1's RoPE scaling (`rope_type: llama3` in config.json).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_context: u64,
}

impl Llama3Rope {
    /// The parameters whose divisors (convert_hf_to_gguf.py's `rope_freqs`: per rotary
    /// frequency `1/theta^(2i/head_dim)` of wavelength `w`, 1 where `w < context / high`,
    /// `factor` where `w > context / low`, and `1 / ((1 - s) / factor + s)` between, with
    /// `s = (context / w - low) / (high - low)`) are `divisors`, within f32 rounding.
    ///
    /// The divisors fix `factor`, and the between ones `context / (high - low)` and
    /// `low / (high - low)`: not all three of `low`, `high` and `context`. `low` is taken as
    /// 1, as in every Llama 3.x release (which the divisors then give exactly); with one
    /// divisor between, `high` as 4, as in those releases. Whatever is assumed, the result
    /// is checked to reproduce every divisor, else refused.
    pub fn from_divisors(divisors: &[f32], head_dim: usize, theta: f64) -> Result<Self> {
        ensure!(
            divisors.len() * 2 == head_dim,
            "{} factors for rotary dimension {head_dim} (one per pair expected)",
            divisors.len()
        );
        let factor = f64::from(divisors.iter().copied().fold(f32::NAN, f32::max));
        ensure!(
            factor.is_finite() && factor > 1.0,
            "the largest factor is {factor}, not a scaling factor above 1"
        );
        let wavelength = |i: usize| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            2.0 * std::f64::consts::PI / freq
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs();
        // (wavelength, s) of each divisor strictly between 1 and factor.
        let between: Vec<(f64, f64)> = (divisors.iter().enumerate())
            .map(|(i, &d)| (wavelength(i), f64::from(d)))
            .filter(|&(_, d)| !close(d, 1.0) && !close(d, factor))
            .map(|(w, d)| (w, (1.0 / d - 1.0 / factor) / (1.0 - 1.0 / factor)))
            .collect();
        // With low = 1: s (high - 1) + 1 = context / w.
        let high_minus_1 = match between.as_slice() {
            [] => {
                bail!("no factor lies between 1 and {factor}: the scaling's bounds are not fixed")
            }
            [_] => 3.0,
            [(w1, s1), .., (w2, s2)] => (w2 - w1) / (s1 * w1 - s2 * w2),
        };
        let (w, s) = between[0];
        let context = (w * (s * high_minus_1 + 1.0)).round();
        // Parameters as published are round; the check below holds them to the divisors.
        let high = (high_minus_1 * 1000.0).round() / 1000.0 + 1.0;
        ensure!(
            high > 1.0 && (1.0..1e12).contains(&context),
            "no Llama 3 scaling gives these factors"
        );
        let rope = Self {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: high,
            original_context: context as u64,
        };
        for (i, &d) in divisors.iter().enumerate() {
            let expected = rope.divisor(wavelength(i));
            ensure!(
                (expected - f64::from(d)).abs() <= 1e-4 * expected,
                "factor {i} is {d}, Llama 3 scaling with factor {factor}, high_freq_factor {high} \
                 and original context {context} would give {expected}"
            );
        }
        Ok(rope)
    }

    /// The divisor of a frequency of wavelength `w`.
    fn divisor(&self, w: f64) -> f64 {
        let context = self.original_context as f64;
        let (low, high) = (self.low_freq_factor, self.high_freq_factor);
        if w < context / high {
            1.0
        } else if w > context / low {
            self.factor
        } else {
            let smooth = (context / w - low) / (high - low);
            1.0 / ((1.0 - smooth) / self.factor + smooth)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Array;

    fn hyperparams(arch: Arch, layers: u64) -> Hyperparams {
        Hyperparams {
            arch,
            layers,
            context_length: 4096,
            hidden: 1152,
            ffn: 6912,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: Some(256),
            rope_theta: 1e6,
            linear_rope_factor: None,
            llama3_rope: None,
            rms_eps: 1e-6,
            vocab: 262144,
            attention_bias: false,
            mlp_bias: false,
            key_length: 256,
            sliding_window: Some(512),
            sliding_layers: Vec::new(),
            rope_theta_swa: 1e4,
            partial_rotary_factor: None,
            original_context: None,
        }
    }

    fn fields(hp: &Hyperparams) -> serde_json::Map<String, Json> {
        let mut fields = serde_json::Map::new();
        fields.insert("hidden_act".into(), json!("silu"));
        fields.insert("mlp_bias".into(), json!(false));
        fields.insert("attention_bias".into(), json!(false));
        fields.insert("head_dim".into(), json!(256));
        hp.arch_fields(&mut fields);
        fields
    }

    /// Gemma 3 1B's shape: its config.json's fields, as llama.cpp reads the GGUF (the
    /// window's layers by the default pattern 6, the score scale head_dim's).
    #[test]
    fn gemma3_config_fields() {
        let mut hp = hyperparams(Arch::Gemma3, 26);
        hp.sliding_layers = gemma3_sliding_layers(None, 26, "k").unwrap();
        let f = fields(&hp);
        assert_eq!(f["architectures"], json!(["Gemma3ForCausalLM"]));
        assert_eq!(f["model_type"], "gemma3_text");
        assert_eq!(f["hidden_activation"], "gelu_pytorch_tanh");
        assert!(!f.contains_key("hidden_act") && !f.contains_key("mlp_bias"));
        assert_eq!(f["head_dim"], 256);
        assert_eq!(f["query_pre_attn_scalar"], 256);
        assert_eq!(f["sliding_window"], 512);
        assert_eq!(f["rope_local_base_freq"], 1e4);
        assert_eq!(f["final_logit_softcapping"], Json::Null);
        let kinds = f["layer_types"].as_array().unwrap();
        let global: Vec<usize> = (0..26).filter(|&i| kinds[i] == "full_attention").collect();
        assert_eq!(global, [5, 11, 17, 23]);
        // The 27B: scores scaled by hidden / heads (5376 / 32).
        let mut hp = hyperparams(Arch::Gemma3, 62);
        (hp.hidden, hp.n_heads, hp.key_length) = (5376, 32, 128);
        assert_eq!(fields(&hp)["query_pre_attn_scalar"], 168);
    }

    /// `attention.sliding_window_pattern` as llama.cpp reads it: flags, a period, none.
    #[test]
    fn gemma3_sliding_layers_as_llama_cpp_reads_them() {
        let layers = |v: Option<Value>, n| gemma3_sliding_layers(v.as_ref(), n, "p");
        assert_eq!(
            layers(Some(Value::U32(3)), 6).unwrap(),
            [true, true, false, true, true, false]
        );
        assert_eq!(layers(Some(Value::U32(0)), 2).unwrap(), [true, true]);
        assert_eq!(layers(Some(Value::U32(1)), 2).unwrap(), [false, false]);
        // Booleans false, true, as the file stores them.
        let flags = Value::Array(Array::Scalars {
            type_id: 7,
            bytes: vec![0, 1],
        });
        assert_eq!(layers(Some(flags.clone()), 2).unwrap(), [false, true]);
        for (value, expected) in [
            (flags, "has 2 entries for 3 layers"),
            (
                // Three u8 ones.
                Value::Array(Array::Scalars {
                    type_id: 0,
                    bytes: vec![1; 3],
                }),
                "holds a non-boolean",
            ),
            (Value::String("6".into()), "is not a layer count or flags"),
        ] {
            let error = layers(Some(value), 3).unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
    }

    /// Phi-3's window (kept though llama.cpp drops it), its original context; SmolLM3's
    /// NoPE layers as llama.cpp's fixed step 4 has them.
    #[test]
    fn phi3_and_smollm3_config_fields() {
        let mut hp = hyperparams(Arch::Phi3, 32);
        (hp.sliding_window, hp.original_context) = (Some(2047), Some(4096));
        hp.partial_rotary_factor = Some(0.75);
        let f = fields(&hp);
        assert_eq!(f["architectures"], json!(["Phi3ForCausalLM"]));
        assert_eq!(f["sliding_window"], 2047);
        assert_eq!(f["original_max_position_embeddings"], 4096);
        assert_eq!(f["partial_rotary_factor"], 0.75);
        for gone in ["attention_bias", "mlp_bias", "head_dim"] {
            assert!(!f.contains_key(gone), "{gone}");
        }
        hp.sliding_window = None;
        assert_eq!(fields(&hp)["sliding_window"], Json::Null);

        let f = fields(&hyperparams(Arch::SmolLM3, 8));
        assert_eq!(f["architectures"], json!(["SmolLM3ForCausalLM"]));
        assert_eq!(f["no_rope_layers"], json!([1, 1, 1, 0, 1, 1, 1, 0]));
        assert_eq!(f["no_rope_layer_interval"], 4);
        assert_eq!(f["use_sliding_window"], false);
        assert!(Arch::SmolLM3.permutes_q_k() && !Arch::Gemma3.permutes_q_k());
        assert_eq!(Arch::Gemma3.value_shift("blk.3.post_ffw_norm.weight"), 1.0);
        assert_eq!(Arch::Gemma3.value_shift("blk.3.ffn_up.weight"), 0.0);
        assert_eq!(Arch::Phi3.value_shift("output_norm.weight"), 0.0);
    }

    /// convert_hf_to_gguf.py's divisors, in f32 as it computes them.
    fn divisors(rope: &Llama3Rope, head_dim: usize, theta: f32) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf((2 * i) as f32 / head_dim as f32);
                rope.divisor(f64::from(2.0 * std::f32::consts::PI / freq)) as f32
            })
            .collect()
    }

    /// Llama 3.2's and 3.1's scaling recovered from their divisors; divisors no Llama 3
    /// scaling gives, refused.
    #[test]
    fn recovers_llama3_scaling_from_its_divisors() {
        for (factor, head_dim, theta) in [(32.0, 64, 500_000.0), (8.0, 128, 500_000.0)] {
            let rope = Llama3Rope {
                factor,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 8192,
            };
            let found = Llama3Rope::from_divisors(&divisors(&rope, head_dim, theta), head_dim, 5e5);
            assert_eq!(found.unwrap(), rope);
        }
        let rope = Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 8192,
        };
        let mut bent = divisors(&rope, 128, 500_000.0);
        let middle = bent.iter().position(|&d| d > 1.5 && d < 7.0).unwrap();
        bent[middle] *= 1.01;
        let error = Llama3Rope::from_divisors(&bent, 128, 5e5).unwrap_err();
        assert!(error.to_string().contains("would give"), "{error}");
        for (divisors, expected) in [
            (vec![1.0f32, 8.0], "no factor lies between 1 and 8"),
            (vec![1.0, 1.0], "not a scaling factor above 1"),
            (vec![1.0, 8.0, 8.0], "3 factors for rotary dimension 4"),
        ] {
            let error = Llama3Rope::from_divisors(&divisors, 4, 1e4).unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
    }
}
