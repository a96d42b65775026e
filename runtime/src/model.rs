//! The Llama forward pass in Burn, top to bottom.
//!
//! Field names follow the Hugging Face checkpoint (`q_proj`, `input_layernorm`, ...) so the
//! converter's name table lists only real differences: the `model.` prefix, Burn's `gamma`
//! for norm weights, and Linear weights stored as `[d_in, d_out]`.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use rayon::prelude::*;

use crate::cache::{KvCache, LayerCache};
use crate::config::LlamaConfig;
use crate::kernels::{Heads, Kernels};

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

/// Rotary position embedding in Hugging Face's `rotate_half` layout: each head's first half
/// of dimensions pairs with its second half (not adjacent pairs, as Burn's `RotaryEncoding`
/// assumes), so checkpoints are used with their q/k rows as published.
/// See transformers' `modeling_llama.apply_rotary_pos_emb`: `x * cos + rotate_half(x) * sin`.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    /// `[positions, head_dim]`: `cos(pos * inv_freq)`, the half repeated.
    cos: Tensor<B, 2>,
    /// `[positions, head_dim]`: `sin(pos * inv_freq)`, the half repeated.
    sin: Tensor<B, 2>,
    /// `[head_dim, head_dim]`: `x.matmul(rotate_half) == rotate_half(x)`. A ±1 permutation,
    /// so the product is exact; as one matmul on contiguous rows it is far cheaper than
    /// slicing and concatenating strided halves.
    rotate_half: Tensor<B, 2>,
    head_dim: usize,
}

/// The rotation tables of one forward call, laid out like a projection's output
/// (`[1, seq, heads * head_dim]`) so the element-wise products run on contiguous data.
struct RopeRows<B: Backend> {
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
}

impl<B: Backend> Rope<B> {
    /// Tables for positions `0..positions` (a KV cache builds them for its capacity).
    pub fn new(config: &LlamaConfig, positions: usize, device: &B::Device) -> Self {
        let dim = config.head_dim;
        let half = dim / 2;
        // Computed in f32 in the same order as transformers, so angles round the same way.
        let theta = config.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(positions * dim);
        let mut sin = Vec::with_capacity(positions * dim);
        for pos in 0..positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| pos as f32 * f).collect();
            cos.extend(angles.iter().chain(&angles).map(|a| a.cos()));
            sin.extend(angles.iter().chain(&angles).map(|a| a.sin()));
        }
        // rotate_half(x) = cat(-x[half..], x[..half]): output j < half takes -x[j + half],
        // output j >= half takes x[j - half].
        let mut rotate_half = vec![0.0f32; dim * dim];
        for j in 0..half {
            rotate_half[(j + half) * dim + j] = -1.0;
            rotate_half[j * dim + j + half] = 1.0;
        }
        let table = |v: Vec<f32>, rows| Tensor::from_data(TensorData::new(v, [rows, dim]), device);
        Self {
            cos: table(cos, positions),
            sin: table(sin, positions),
            rotate_half: table(rotate_half, dim),
            head_dim: dim,
        }
    }

    /// Tables for positions `start..start + seq`, repeated for `heads` heads.
    fn rows(&self, start: usize, seq: usize, heads: usize) -> RopeRows<B> {
        let rows = |t: &Tensor<B, 2>| {
            t.clone()
                .narrow(0, start, seq)
                .repeat_dim(1, heads)
                .unsqueeze::<3>()
        };
        RopeRows {
            cos: rows(&self.cos),
            sin: rows(&self.sin),
        }
    }

    /// Rotates a projection's output `x: [batch, seq, heads * head_dim]`.
    fn apply(&self, x: Tensor<B, 3>, rows: &RopeRows<B>) -> Tensor<B, 3> {
        let [batch, seq, width] = x.dims();
        let rotated = x
            .clone()
            .reshape([batch * seq * width / self.head_dim, self.head_dim])
            .matmul(self.rotate_half.clone())
            .reshape([batch, seq, width]);
        x * rows.cos.clone() + rotated * rows.sin.clone()
    }
}

/// What every layer of one forward call shares: rotation tables for the query and key
/// projections.
struct Step<B: Backend> {
    q_rope: RopeRows<B>,
    k_rope: RopeRows<B>,
}

impl<B: Kernels> Llama<B> {
    /// Runs `tokens` through the model, appending their keys and values to `cache`, and
    /// returns the final-norm hidden states. Call [`Llama::logits`] on the rows you need:
    /// generation needs only the last one, perplexity all of them.
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        let [_, seq] = tokens.dims();
        let start = cache.len();
        let mut x = self.embed_tokens.forward(tokens); // [batch, seq, hidden]
        // Every layer has the same head layout, so the tables are built once per call.
        let (n_heads, n_kv) = self
            .layers
            .first()
            .map_or((1, 1), |l| (l.self_attn.n_heads, l.self_attn.n_kv_heads));
        let (rope, layer_caches) = cache.rope_and_layers();
        let step = Step {
            q_rope: rope.rows(start, seq, n_heads),
            k_rope: rope.rows(start, seq, n_kv),
        };
        for (layer, layer_cache) in self.layers.iter().zip(layer_caches) {
            x = layer.forward(x, layer_cache, rope, &step);
        }
        cache.advance(seq);
        B::rms_norm(&self.norm, x)
    }

    /// Re-lays every projection weight out in memory as `[d_out, d_in]` (each output's
    /// weights contiguous) while its logical shape stays `[d_in, d_out]`, as a transposed view.
    ///
    /// Decoding is nothing but matrix-vector products, and a weight stored that way streams as
    /// one dot product per output: burn-flex's decode kernel (`Kernels::linear_forward`) reads
    /// only this layout, and gemm's own matrix-vector path is 30% faster on it than on the
    /// row-major one. Prefill is unaffected: gemm packs either layout.
    /// Layers are re-laid in parallel; each weight needs one temporary copy of itself.
    ///
    /// With `tied` embeddings (config.json's `tie_word_embeddings`, for which the converter
    /// wrote lm_head as a copy of the embedding), lm_head becomes a transposed view of the
    /// embedding, which is already that layout: 113 MB less memory for SmolLM2, no copy.
    pub fn with_matvec_layout(self, tied: bool) -> Self {
        let layers = self
            .layers
            .into_par_iter()
            .map(|layer| DecoderLayer {
                self_attn: Attention {
                    q_proj: column_major(layer.self_attn.q_proj),
                    k_proj: column_major(layer.self_attn.k_proj),
                    v_proj: column_major(layer.self_attn.v_proj),
                    o_proj: column_major(layer.self_attn.o_proj),
                    ..layer.self_attn
                },
                mlp: Mlp {
                    gate_proj: column_major(layer.mlp.gate_proj),
                    up_proj: column_major(layer.mlp.up_proj),
                    down_proj: column_major(layer.mlp.down_proj),
                },
                ..layer
            })
            .collect();
        let lm_head = if tied {
            let embedding = self.embed_tokens.weight.val(); // [vocab, hidden]
            Linear {
                weight: self.lm_head.weight.map(|_| embedding.transpose()),
                ..self.lm_head
            }
        } else {
            column_major(self.lm_head)
        };
        Self {
            layers,
            lm_head,
            ..self
        }
    }

    /// `[batch, seq, hidden]` → `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        project(&self.lm_head, hidden)
    }
}

impl<B: Kernels> DecoderLayer<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &Rope<B>,
        step: &Step<B>,
    ) -> Tensor<B, 3> {
        let h = x.clone()
            + self
                .self_attn
                .forward(B::rms_norm(&self.input_layernorm, x), cache, rope, step);
        h.clone()
            + self
                .mlp
                .forward(B::rms_norm(&self.post_attention_layernorm, h))
    }
}

impl<B: Kernels> Attention<B> {
    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - output: `[batch, seq, hidden]`
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &Rope<B>,
        step: &Step<B>,
    ) -> Tensor<B, 3> {
        // Rotate while each projection is still one contiguous [batch, seq, heads * hd] block.
        // The score scale goes on q (1/8 for hd = 64, a power of two, so this is exact).
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let [q, k, v] = B::linear_forward(
            x,
            [&self.q_proj, &self.k_proj, &self.v_proj].map(|linear| linear.weight.val()),
        );
        let q = rope.apply(q, &step.q_rope) * scale;
        let k = rope.apply(k, &step.k_rope);
        let (k, v) = cache.append(k, v); // [batch, start + seq, n_kv * hd]
        let heads = Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        };
        project(&self.o_proj, B::causal_attention(q, k, v, heads))
    }
}

impl<B: Kernels> Mlp<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let weights = [&self.gate_proj, &self.up_proj].map(|linear| linear.weight.val());
        let [gate, up] = B::linear_forward(x, weights);
        project(&self.down_proj, B::silu_mul(gate, up))
    }
}

/// `linear.forward(x)` (no bias), through the backend's kernel (burn-flex: a threaded
/// matrix-vector product for a single row).
fn project<B: Kernels>(linear: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let [out] = B::linear_forward(x, [linear.weight.val()]);
    out
}

/// `linear` with its weight stored `[d_out, d_in]` in memory, seen as `[d_in, d_out]`.
fn column_major<B: Backend>(linear: Linear<B>) -> Linear<B> {
    let weight = linear.weight.map(|w| {
        let [d_in, d_out] = w.dims();
        // Reshaping the transposed view forces a (tiled) copy into the new order.
        w.transpose()
            .reshape([d_out * d_in])
            .reshape([d_out, d_in])
            .transpose()
    });
    Linear { weight, ..linear }
}
