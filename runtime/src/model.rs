//! The Llama forward pass in Burn, top to bottom.
//!
//! Field names follow the Hugging Face checkpoint (`q_proj`, `input_layernorm`, ...) so the
//! converter's name table lists only real differences: the `model.` prefix, Burn's `gamma`
//! for norm weights, and Linear weights stored as `[d_in, d_out]`.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::cache::{KvCache, LayerCache};
use crate::config::LlamaConfig;

/// Decoder-only Llama: token embedding, `num_layers` blocks, final norm, lm_head.
#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    /// `[vocab, hidden]`
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<DecoderLayer<B>>,
    /// `gamma: [hidden]`
    pub norm: RmsNorm<B>,
    /// `weight: [hidden, vocab]`; a copy of `embed_tokens` for tied checkpoints.
    pub lm_head: Linear<B>,
}

/// One transformer block: pre-norm attention and pre-norm SwiGLU MLP, each with a residual.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
}

/// Grouped-query self-attention: `n_heads` query heads share `n_kv_heads` key/value heads.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// `[hidden, n_heads * head_dim]`
    pub q_proj: Linear<B>,
    /// `[hidden, n_kv_heads * head_dim]`
    pub k_proj: Linear<B>,
    /// `[hidden, n_kv_heads * head_dim]`
    pub v_proj: Linear<B>,
    /// `[n_heads * head_dim, hidden]`
    pub o_proj: Linear<B>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[hidden, intermediate]`
    pub gate_proj: Linear<B>,
    /// `[hidden, intermediate]`
    pub up_proj: Linear<B>,
    /// `[intermediate, hidden]`
    pub down_proj: Linear<B>,
}

impl LlamaConfig {
    /// Builds the module with lazily initialised parameters: nothing is allocated until a
    /// record is loaded into it (or a parameter is read).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Llama<B> {
        let linear = |d_in, d_out| LinearConfig::new(d_in, d_out).with_bias(false).init(device);
        let norm = || {
            RmsNormConfig::new(self.hidden_size)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let (hidden, q_dim, kv_dim) = (
            self.hidden_size,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        let layers = (0..self.num_layers)
            .map(|_| DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention {
                    q_proj: linear(hidden, q_dim),
                    k_proj: linear(hidden, kv_dim),
                    v_proj: linear(hidden, kv_dim),
                    o_proj: linear(q_dim, hidden),
                    n_heads: self.n_heads,
                    n_kv_heads: self.n_kv_heads,
                    head_dim: self.head_dim,
                },
                post_attention_layernorm: norm(),
                mlp: Mlp {
                    gate_proj: linear(hidden, self.intermediate_size),
                    up_proj: linear(hidden, self.intermediate_size),
                    down_proj: linear(self.intermediate_size, hidden),
                },
            })
            .collect();
        Llama {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, hidden).init(device),
            layers,
            norm: norm(),
            lm_head: linear(hidden, self.vocab_size),
        }
    }
}

/// Rotary position embedding tables, in Hugging Face's `rotate_half` layout: each head's
/// first half of dimensions pairs with its second half (not adjacent pairs, as Burn's
/// `RotaryEncoding` assumes), so checkpoints are used with their q/k rows as published.
/// See transformers' `modeling_llama.apply_rotary_pos_emb`.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    /// `[max_positions, head_dim]`: `cos(pos * inv_freq)`, the half repeated.
    cos: Tensor<B, 2>,
    /// `[max_positions, head_dim]`: `sin(pos * inv_freq)` with the first half negated, so
    /// that `rotate_half(x) * sin == swap_halves(x) * signed_sin`.
    signed_sin: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
    pub fn new(config: &LlamaConfig, max_positions: usize, device: &B::Device) -> Self {
        let dim = config.head_dim;
        let half = dim / 2;
        // Computed in f32 in the same order as transformers, so angles round the same way.
        let theta = config.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(max_positions * dim);
        let mut signed_sin = Vec::with_capacity(max_positions * dim);
        for pos in 0..max_positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| pos as f32 * f).collect();
            cos.extend(angles.iter().chain(&angles).map(|a| a.cos()));
            signed_sin.extend(angles.iter().map(|a| -a.sin()));
            signed_sin.extend(angles.iter().map(|a| a.sin()));
        }
        let table =
            |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [max_positions, dim]), device);
        Self {
            cos: table(cos),
            signed_sin: table(signed_sin),
        }
    }

    /// Rotates `x: [batch, heads, seq, head_dim]` whose first position is `start`.
    fn apply(&self, x: Tensor<B, 4>, start: usize) -> Tensor<B, 4> {
        let [_, _, seq, dim] = x.dims();
        let half = dim / 2;
        let cos = self.cos.clone().narrow(0, start, seq).unsqueeze::<4>(); // [1, 1, seq, dim]
        let sin = self
            .signed_sin
            .clone()
            .narrow(0, start, seq)
            .unsqueeze::<4>();
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * cos + swapped * sin
    }
}

impl<B: Backend> Llama<B> {
    /// Runs `tokens` through the model, appending their keys and values to `cache`, and
    /// returns the final-norm hidden states. Call [`Llama::logits`] on the rows you need:
    /// generation needs only the last one, perplexity all of them.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
        rope: &Rope<B>,
    ) -> Tensor<B, 3> {
        let [_, seq] = tokens.dims();
        let start = cache.len();
        let mut x = self.embed_tokens.forward(tokens); // [batch, seq, hidden]
        // Every layer has the same head grouping, so the mask is built once per call.
        let group = self
            .layers
            .first()
            .map_or(1, |l| l.self_attn.n_heads / l.self_attn.n_kv_heads);
        let mask = (seq > 1).then(|| causal_mask(seq, start, group, &x.device()));
        for (layer, layer_cache) in self.layers.iter().zip(cache.layers_mut()) {
            x = layer.forward(x, layer_cache, rope, start, mask.as_ref());
        }
        cache.advance(seq);
        self.norm.forward(x)
    }

    /// `[batch, seq, hidden]` → `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.lm_head.forward(hidden)
    }
}

impl<B: Backend> DecoderLayer<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &Rope<B>,
        start: usize,
        mask: Option<&Tensor<B, 2>>,
    ) -> Tensor<B, 3> {
        let h = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), cache, rope, start, mask);
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

impl<B: Backend> Attention<B> {
    /// # Shapes
    /// - x: `[batch, seq, hidden]`; mask: `[group * seq, start + seq]` (additive, 0 or -inf)
    /// - output: `[batch, seq, hidden]`
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &Rope<B>,
        start: usize,
        mask: Option<&Tensor<B, 2>>,
    ) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let (n_heads, n_kv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let group = n_heads / n_kv;

        let heads = |t: Tensor<B, 3>, n| t.reshape([batch, seq, n, hd]).swap_dims(1, 2);
        let q = rope.apply(heads(self.q_proj.forward(x.clone()), n_heads), start); // [b, h, seq, hd]
        let k = rope.apply(heads(self.k_proj.forward(x.clone()), n_kv), start); // [b, kv, seq, hd]
        let v = heads(self.v_proj.forward(x), n_kv);
        let (k, v) = cache.append(k, v); // [b, kv, start + seq, hd]

        // Query heads h = kv * group + g share key/value head kv (transformers' repeat_kv),
        // so fold each group into the row axis instead of copying keys and values per head.
        let q = q.reshape([batch, n_kv, group * seq, hd]);
        let scores = q.matmul(k.swap_dims(2, 3)) * (1.0 / (hd as f64).sqrt()); // [b, kv, group*seq, total]
        let scores = match mask {
            Some(mask) => scores + mask.clone().unsqueeze::<4>(),
            None => scores,
        };
        let out = softmax(scores, 3).matmul(v); // [b, kv, group*seq, hd]
        let out = out
            .reshape([batch, n_heads, seq, hd])
            .swap_dims(1, 2)
            .reshape([batch, seq, n_heads * hd]);
        self.o_proj.forward(out)
    }
}

impl<B: Backend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gate = silu(self.gate_proj.forward(x.clone()));
        self.down_proj.forward(gate * self.up_proj.forward(x))
    }
}

/// Additive causal mask `[group * seq, start + seq]` for the grouped score rows: row
/// `g * seq + i` is query `i` (at position `start + i`) of any head in a group, and sees
/// keys `0..=start + i`.
fn causal_mask<B: Backend>(
    seq: usize,
    start: usize,
    group: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let total = start + seq;
    let values: Vec<f32> = (0..group * seq)
        .flat_map(|row| {
            let i = row % seq;
            (0..total).map(move |j| {
                if j > start + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_data(TensorData::new(values, [group * seq, total]), device)
}
