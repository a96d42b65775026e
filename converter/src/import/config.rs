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
}

impl Arch {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        match gguf.str("general.architecture")? {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            other => bail!(
                "unsupported GGUF architecture {other:?}: supported are \"llama\", \"qwen2\" and \"qwen3\""
            ),
        }
    }

    /// The metadata key prefix, `llama.block_count`.
    fn prefix(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
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
            rope_theta,
            linear_rope_factor,
            llama3_rope,
            rms_eps: float("attention.layer_norm_rms_epsilon")?,
            vocab,
            attention_bias: has("attn_output.bias"),
            mlp_bias: has("ffn_gate.bias"),
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
        config
    }
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
