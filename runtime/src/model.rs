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

/// Rotary position embedding tables, in Hugging Face's `rotate_half` layout: each head's
/// first half of dimensions pairs with its second half (not adjacent pairs, as Burn's
/// `RotaryEncoding` assumes), so checkpoints are used with their q/k rows as published.
/// See transformers' `modeling_llama.apply_rotary_pos_emb`: `x * cos + rotate_half(x) * sin`,
/// done by [`Kernels::rotary`].
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    /// `[positions, head_dim]`: `cos(pos * inv_freq)`, the half repeated.
    cos: Tensor<B, 2>,
    /// `[positions, head_dim]`: `sin(pos * inv_freq)`, the half repeated.
    sin: Tensor<B, 2>,
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
        let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [positions, dim]), device);
        Self {
            cos: table(cos),
            sin: table(sin),
        }
    }

    /// The tables' rows for positions `start..start + seq`: `(cos, sin)`, `[seq, head_dim]` each.
    fn rows(&self, start: usize, seq: usize) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let rows = |t: &Tensor<B, 2>| t.clone().narrow(0, start, seq);
        (rows(&self.cos), rows(&self.sin))
    }
}

/// What every layer of one forward call shares: the rotation tables' rows for its positions.
struct Step<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
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
        let (rope, layer_caches) = cache.rope_and_layers();
        let (cos, sin) = rope.rows(start, seq);
        let step = Step { cos, sin };
        for (layer, layer_cache) in self.layers.iter().zip(layer_caches) {
            x = layer.forward(x, layer_cache, &step);
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
    fn forward(&self, x: Tensor<B, 3>, cache: &mut LayerCache<B>, step: &Step<B>) -> Tensor<B, 3> {
        match B::decode_layer(self, &x, cache, &step.cos, &step.sin) {
            Some(out) => out,
            None => self.forward_composed(x, cache, step),
        }
    }

    /// The layer as Burn ops (through the backend's [`Kernels`]): what prefill runs, and what
    /// a backend's fused [`Kernels::decode_layer`] must equal.
    fn forward_composed(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        step: &Step<B>,
    ) -> Tensor<B, 3> {
        let h = x.clone()
            + self
                .self_attn
                .forward(B::rms_norm(&self.input_layernorm, x), cache, step);
        h.clone()
            + self
                .mlp
                .forward(B::rms_norm(&self.post_attention_layernorm, h))
    }
}

impl<B: Kernels> Attention<B> {
    /// The head layout attention kernels take.
    pub(crate) fn heads(&self) -> Heads {
        Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - output: `[batch, seq, hidden]`
    fn forward(&self, x: Tensor<B, 3>, cache: &mut LayerCache<B>, step: &Step<B>) -> Tensor<B, 3> {
        // Rotate while each projection is still one contiguous [batch, seq, heads * hd] block.
        // The score scale goes on q (1/8 for hd = 64, a power of two, so this is exact).
        let heads = self.heads();
        let [q, k, v] = B::linear_forward(
            x,
            [&self.q_proj, &self.k_proj, &self.v_proj].map(|linear| linear.weight.val()),
        );
        let q = B::rotary(q, step.cos.clone(), step.sin.clone(), heads.score_scale());
        let k = B::rotary(k, step.cos.clone(), step.sin.clone(), 1.0);
        let (k, v) = cache.append(k, v); // [batch, start + seq, n_kv * hd]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FlexBackend;
    use burn::tensor::Distribution;

    /// burn-flex's fused single-token layer (`Kernels::decode_layer`) gives exactly what the
    /// layer's ops give, token after token, with keys split across threads once there are
    /// enough of them and projections both split and not.
    #[test]
    fn fused_decode_layer_equals_the_composed_ops() {
        let config = LlamaConfig {
            hidden_size: 64,
            intermediate_size: 160,
            num_layers: 1,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            vocab_size: 10,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            max_position_embeddings: 64,
            tie_word_embeddings: false,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
        };
        let device = Default::default();
        let random_gamma = |norm: RmsNorm<FlexBackend>| RmsNorm {
            gamma: norm
                .gamma
                .map(|g| Tensor::random(g.dims(), Distribution::Uniform(0.5, 1.5), &device)),
            ..norm
        };
        let model = config
            .init::<FlexBackend>(&device)
            .with_matvec_layout(false);
        let layer = model.layers.into_iter().next().expect("one layer");
        let layer = DecoderLayer {
            input_layernorm: random_gamma(layer.input_layernorm),
            post_attention_layernorm: random_gamma(layer.post_attention_layernorm),
            ..layer
        };
        let positions = 40;
        let mut caches = [(); 2].map(|_| KvCache::new(&config, 1, positions, &device));
        for position in 0..positions {
            let x = Tensor::<FlexBackend, 3>::random(
                [1, 1, 64],
                Distribution::Normal(0.0, 1.0),
                &device,
            );
            let [fused, composed] = caches.each_mut().map(|cache| {
                let (rope, mut layer_caches) = cache.rope_and_layers();
                let (cos, sin) = rope.rows(position, 1);
                let layer_cache = layer_caches.next().expect("one layer");
                let step = Step { cos, sin };
                (layer_cache, step)
            });
            let (fused_cache, step) = fused;
            let fused = FlexBackend::decode_layer(&layer, &x, fused_cache, &step.cos, &step.sin)
                .expect("burn-flex fuses a single-token layer");
            let (composed_cache, step) = composed;
            let composed = layer.forward_composed(x, composed_cache, &step);
            for cache in &mut caches {
                cache.advance(1);
            }
            let (fused, composed) = (fused.into_data(), composed.into_data());
            assert_eq!(fused, composed, "position {position}");
        }
    }
}
