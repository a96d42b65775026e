//! Llama in Burn 0.22: token embedding, pre-norm blocks of grouped-query attention with
//! rotary positions (Hugging Face's `rotate_half` layout) and a SwiGLU MLP, final RMSNorm,
//! lm_head. Field names are the converter's record paths (`layers.0.self_attn.q_proj.weight`,
//! norms' `gamma`, Linear weights `[d_in, d_out]`), so `BurnpackStore` fills it as it is;
//! a tied lm_head is stored by the converter as its own tensor.

use std::path::Path;

use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use burn::tensor::activation::{silu, softmax};
use serde::Deserialize;

/// What the model reads of the artifact's config.json (Hugging Face's).
#[derive(Deserialize)]
pub struct Config {
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    eos_token_id: Option<serde_json::Value>,
}

fn default_rope_theta() -> f64 {
    10_000.0
}

impl Config {
    /// Reads `path`, refusing what this small model does not implement.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: Config =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if config.model_type != "llama" {
            return Err(format!(
                "model_type {:?}: only llama is implemented",
                config.model_type
            ));
        }
        if config.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err("rope_scaling is not implemented".into());
        }
        Ok(config)
    }

    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The ids generation stops at (config.json's `eos_token_id`, one or a list).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(id)) => {
                id.as_u64().map(|id| id as u32).into_iter().collect()
            }
            Some(serde_json::Value::Array(ids)) => ids
                .iter()
                .filter_map(|id| id.as_u64())
                .map(|id| id as u32)
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Module, Debug)]
pub struct Llama {
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

#[derive(Module, Debug)]
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

#[derive(Module, Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

#[derive(Module, Debug)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// Each layer's keys and values so far, `[1, kv heads, positions, head_dim]`.
type Cache = Vec<Option<(Tensor<4>, Tensor<4>)>>;

impl Llama {
    pub fn new(config: &Config, device: &Device) -> Self {
        let (hidden, head_dim) = (config.hidden_size, config.head_dim());
        let linear =
            |d_in, d_out, bias| LinearConfig::new(d_in, d_out).with_bias(bias).init(device);
        let norm = || {
            RmsNormConfig::new(hidden)
                .with_epsilon(config.rms_norm_eps)
                .init(device)
        };
        let (q_dim, kv_dim) = (
            config.num_attention_heads * head_dim,
            config.kv_heads() * head_dim,
        );
        let (attention_bias, mlp_bias) = (config.attention_bias, config.mlp_bias);
        let layers = (0..config.num_hidden_layers)
            .map(|_| DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention {
                    q_proj: linear(hidden, q_dim, attention_bias),
                    k_proj: linear(hidden, kv_dim, attention_bias),
                    v_proj: linear(hidden, kv_dim, attention_bias),
                    o_proj: linear(q_dim, hidden, attention_bias),
                    n_heads: config.num_attention_heads,
                    n_kv_heads: config.kv_heads(),
                    head_dim,
                },
                post_attention_layernorm: norm(),
                mlp: Mlp {
                    gate_proj: linear(hidden, config.intermediate_size, mlp_bias),
                    up_proj: linear(hidden, config.intermediate_size, mlp_bias),
                    down_proj: linear(config.intermediate_size, hidden, mlp_bias),
                },
            })
            .collect();
        Self {
            embed_tokens: EmbeddingConfig::new(config.vocab_size, hidden).init(device),
            layers,
            norm: norm(),
            lm_head: linear(hidden, config.vocab_size, false),
        }
    }

    /// Greedy decoding: up to `max_new` ids after `prompt`, ending before an end-of-text id.
    pub fn generate(
        &self,
        config: &Config,
        prompt: &[u32],
        max_new: usize,
        device: &Device,
    ) -> Vec<u32> {
        let positions = prompt.len() + max_new;
        let rope = Rope::new(config.rope_theta, config.head_dim(), positions, device);
        let eos = config.eos_token_ids();
        let mut cache: Cache = vec![None; self.layers.len()];
        let (mut input, mut start, mut out) = (prompt.to_vec(), 0, Vec::new());
        while out.len() < max_new {
            let logits = self.forward(&input, start, &rope, &mut cache, device);
            let next = logits.argmax(1).into_scalar::<i64>() as u32;
            if eos.contains(&next) {
                break;
            }
            out.push(next);
            start += input.len();
            input = vec![next];
        }
        out
    }

    /// The logits of the last of `ids`, at positions from `start`: `[1, vocab]`.
    fn forward(
        &self,
        ids: &[u32],
        start: usize,
        rope: &Rope,
        cache: &mut Cache,
        device: &Device,
    ) -> Tensor<2> {
        let n = ids.len();
        let ids: Vec<i64> = ids.iter().map(|&id| id as i64).collect();
        let ids = Tensor::<1, Int>::from_ints(ids.as_slice(), device).reshape([1, n]);
        let mut x = self.embed_tokens.forward(ids);
        for (layer, cache) in self.layers.iter().zip(cache.iter_mut()) {
            let h = layer.input_layernorm.forward(x.clone());
            x = x + layer.self_attn.forward(h, start, rope, cache);
            let h = layer.post_attention_layernorm.forward(x.clone());
            x = x + layer.mlp.forward(h);
        }
        let last = self.norm.forward(x.narrow(1, n - 1, 1));
        let [_, _, hidden] = last.dims();
        self.lm_head.forward(last.reshape([1, hidden]))
    }
}

impl Attention {
    /// `x`: `[1, n, hidden]` at positions `start..start + n`, after the cached ones.
    fn forward(
        &self,
        x: Tensor<3>,
        start: usize,
        rope: &Rope,
        cache: &mut Option<(Tensor<4>, Tensor<4>)>,
    ) -> Tensor<3> {
        let [_, n, _] = x.dims();
        let (heads, kv_heads, head_dim) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let split = |t: Tensor<3>, heads| t.reshape([1, n, heads, head_dim]).swap_dims(1, 2);
        let q = rope.apply(split(self.q_proj.forward(x.clone()), heads), start);
        let k = rope.apply(split(self.k_proj.forward(x.clone()), kv_heads), start);
        let v = split(self.v_proj.forward(x), kv_heads);
        let (k, v) = match cache.take() {
            Some((old_k, old_v)) => (
                Tensor::cat(vec![old_k, k], 2),
                Tensor::cat(vec![old_v, v], 2),
            ),
            None => (k, v),
        };
        *cache = Some((k.clone(), v.clone()));
        // Grouped-query attention: each key/value head serves heads / kv_heads query heads.
        let total = start + n;
        let repeat = |t: Tensor<4>| {
            let t: Tensor<5> = t.unsqueeze_dim(2);
            t.repeat_dim(2, heads / kv_heads)
                .reshape([1, heads, total, head_dim])
        };
        let scores = q.matmul(repeat(k).swap_dims(2, 3)) / (head_dim as f64).sqrt();
        // Causal: position start + i sees positions up to itself.
        let future = Tensor::<2, Bool>::tril_mask([n, total], start as i64, &scores.device());
        let scores = scores.mask_fill(future.unsqueeze::<4>(), f32::NEG_INFINITY);
        let out = softmax(scores, 3).matmul(repeat(v));
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([1, n, heads * head_dim]))
    }
}

impl Mlp {
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let gate = silu(self.gate_proj.forward(x.clone()));
        self.down_proj.forward(gate * self.up_proj.forward(x))
    }
}

/// Rotary position tables, `[positions, head_dim]`: each frequency's cosine and sine twice,
/// for the two halves of a head (transformers' `rotate_half`).
struct Rope {
    cos: Tensor<2>,
    sin: Tensor<2>,
}

impl Rope {
    /// Tables for `positions` positions of heads of `dim` values, at RoPE base `theta`.
    fn new(theta: f64, dim: usize, positions: usize, device: &Device) -> Self {
        let inv_freq: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / dim as f64) as f32)
            .collect();
        let angles: Vec<f32> = (0..positions)
            .flat_map(|p| (0..dim).map(move |j| (p, j)))
            .map(|(p, j)| p as f32 * inv_freq[j % (dim / 2)])
            .collect();
        let angles = Tensor::<1>::from_floats(angles.as_slice(), device).reshape([positions, dim]);
        Self {
            cos: angles.clone().cos(),
            sin: angles.sin(),
        }
    }

    /// `x`, `[1, heads, n, head_dim]` at positions `start..start + n`, rotated.
    fn apply(&self, x: Tensor<4>, start: usize) -> Tensor<4> {
        let [_, _, n, dim] = x.dims();
        let cos = self.cos.clone().narrow(0, start, n).unsqueeze::<4>();
        let sin = self.sin.clone().narrow(0, start, n).unsqueeze::<4>();
        let (x1, x2) = (
            x.clone().narrow(3, 0, dim / 2),
            x.clone().narrow(3, dim / 2, dim / 2),
        );
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * cos + rotated * sin
    }
}
