//! The Llama forward pass in Burn, top to bottom, for a prompt (many positions at once)
//! and for a decoded token (one position, through the backend's fused layer if it has one).
//!
//! Field names follow the Hugging Face checkpoint (`q_proj`, `input_layernorm`, ...) so the
//! converter's name rules list only real differences: the `model.` prefix, Burn's `gamma`
//! for norm weights, and Linear weights stored as `[d_in, d_out]`.

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor};
use kernels::attention::Heads;
use kernels::int8::Matmul;
use kernels::layer::Activation;
use kernels::layer::{LayerShape, Projection};
use rayon::prelude::*;

use crate::model::backend::{KernelBackend, LayerTensors};
use crate::model::cache::{CacheError, KvCache, LayerCache};
use crate::model::config::{LlamaConfig, Rotation};
use crate::model::rope::{RopeRows, Rotations};

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
    /// What the embedding's rows are multiplied by, if anything (Gemma); from the config.
    #[module(skip)]
    pub embedding_scale: Option<f32>,
}

/// One transformer block: pre-norm attention and pre-norm gated MLP, each with a residual.
///
/// With sandwich norms (Gemma), `post_attention_layernorm` normalizes the attention's output
/// and `pre_feedforward_layernorm` the MLP's input, and `post_feedforward_layernorm` the
/// MLP's output; without them (Llama), `post_attention_layernorm` is the MLP's pre-norm.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    /// `gamma: [hidden]`
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    /// `gamma: [hidden]`
    pub post_attention_layernorm: RmsNorm<B>,
    /// `gamma: [hidden]`, both or neither.
    pub pre_feedforward_layernorm: Option<RmsNorm<B>>,
    pub post_feedforward_layernorm: Option<RmsNorm<B>>,
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
    /// `gamma: [head_dim]`: each query head RMS-normalized before RoPE (Qwen3), and each
    /// key head.
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    /// Which rotary table turns queries and keys (none in SmolLM3's NoPE layers); from the
    /// config, not the record, as the score scale is.
    #[module(skip)]
    pub rotation: Rotation,
    #[module(skip)]
    pub score_scale: f32,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Gated MLP: `down(act(gate(x)) * up(x))`, SwiGLU with SiLU.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[hidden, intermediate]`
    pub gate_proj: Linear<B>,
    /// `[hidden, intermediate]`
    pub up_proj: Linear<B>,
    /// `[intermediate, hidden]`
    pub down_proj: Linear<B>,
    /// From the config, not the record.
    #[module(skip)]
    pub activation: Activation,
}

impl LlamaConfig {
    /// Builds the module with lazily initialised parameters: nothing is allocated until a
    /// record is loaded into it (or a parameter is read).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Llama<B> {
        let linear =
            |d_in, d_out, bias| LinearConfig::new(d_in, d_out).with_bias(bias).init(device);
        let biases = self.biases;
        let norm = || {
            RmsNormConfig::new(self.hidden_size)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let head_norm = || {
            RmsNormConfig::new(self.head_dim)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let (hidden, q_dim, kv_dim) = (
            self.hidden_size,
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        let heads = Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        };
        let score_scale = self.score_scale.unwrap_or(heads.score_scale());
        let layers = (0..self.num_layers)
            .map(|layer| DecoderLayer {
                input_layernorm: norm(),
                self_attn: Attention {
                    q_proj: linear(hidden, q_dim, biases.qkv),
                    k_proj: linear(hidden, kv_dim, biases.qkv),
                    v_proj: linear(hidden, kv_dim, biases.qkv),
                    o_proj: linear(q_dim, hidden, biases.o),
                    q_norm: self.qk_norm.then(head_norm),
                    k_norm: self.qk_norm.then(head_norm),
                    rotation: self.rotation(layer),
                    score_scale,
                    n_heads: self.n_heads,
                    n_kv_heads: self.n_kv_heads,
                    head_dim: self.head_dim,
                },
                post_attention_layernorm: norm(),
                pre_feedforward_layernorm: self.sandwich_norms.then(norm),
                post_feedforward_layernorm: self.sandwich_norms.then(norm),
                mlp: Mlp {
                    gate_proj: linear(hidden, self.intermediate_size, biases.mlp),
                    up_proj: linear(hidden, self.intermediate_size, biases.mlp),
                    down_proj: linear(self.intermediate_size, hidden, biases.mlp),
                    activation: self.activation,
                },
            })
            .collect();
        Llama {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, hidden).init(device),
            layers,
            norm: norm(),
            lm_head: linear(hidden, self.vocab_size, false),
            embedding_scale: self.embedding_scale,
        }
    }
}

impl LlamaConfig {
    /// How many parameters the record of this config holds (what [`LlamaConfig::init`]
    /// builds, lm_head included even when tied), without building anything: a loader checks
    /// it against the record's size before a config claiming a huge model allocates.
    pub fn parameter_count(&self) -> u128 {
        let [hidden, intermediate, vocab, layers] = [
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.num_layers,
        ]
        .map(|n| n as u128);
        let q = (self.n_heads * self.head_dim) as u128;
        let kv = (self.n_kv_heads * self.head_dim) as u128;
        let biases = self.biases;
        let bias = |on: bool, n: u128| if on { n } else { 0 };
        let layer = 2 * hidden
            + 2 * hidden * q
            + 2 * hidden * kv
            + 3 * hidden * intermediate
            + bias(biases.qkv, q + 2 * kv)
            + bias(biases.o, hidden)
            + bias(biases.mlp, 2 * intermediate + hidden)
            + bias(self.qk_norm, 2 * self.head_dim as u128)
            + bias(self.sandwich_norms, 2 * hidden);
        2 * vocab * hidden + layers * layer + hidden
    }
}

impl<B: KernelBackend> Llama<B> {
    /// Runs `tokens` through the model after what `cache` holds, appending their keys and
    /// values to it, and returns the final-norm hidden states. Call [`Llama::logits`] on the
    /// positions you need: generation needs only the last one, perplexity all of them.
    /// `matmul` says how products over quantized weights take their inputs
    /// ([`Matmul::Exact`]: the products of the decoded values, to the bit).
    ///
    /// # Shapes
    /// - tokens: `[batch, seq]`
    /// - output: `[batch, seq, hidden]`
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        let [batch, seq] = tokens.dims();
        cache.check_room(batch, seq)?;
        let rotations = cache.rope_rows(seq);
        let mut x = self.embed(tokens);
        for (layer, cache) in self.layers.iter().zip(cache.layers_mut()) {
            let rope = rotations.of(layer.self_attn.rotation);
            x = layer.forward(x, cache, rope, matmul)?;
        }
        cache.advance(seq);
        Ok(rms_norm(&self.norm, x))
    }

    /// Decodes one token per sequence: its logits, `[batch, 1, vocab]`.
    ///
    /// A decoded token is a burst of short parallel regions (every product, attention), with
    /// small single-threaded work between them; the backend may keep its threads spinning
    /// for the whole token ([`KernelBackend::decode_token`]).
    ///
    /// # Shapes
    /// - tokens: `[batch, 1]`
    pub fn decode(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        B::decode_token(|| Ok(self.logits(self.forward(tokens, cache, matmul)?, matmul)))
    }

    /// Decodes one token of each of several sequences, each with its own cache (its own
    /// length): their logits, `[n, 1, vocab]`, row `b` for `tokens[b]` after `caches[b]`.
    /// One pass over the weights serves every sequence (continuous batching), and each
    /// row is, bit for bit, what [`Llama::decode`] gives that sequence alone: a sequence's
    /// output does not depend on what else runs.
    ///
    /// Fails, having run nothing, if any cache is full or holds a batch of sequences.
    ///
    /// # Shapes
    /// - tokens: `[n, 1]`
    pub fn decode_each(
        &self,
        tokens: Tensor<B, 2, Int>,
        caches: &mut [&mut KvCache<B>],
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        let rows = vec![1; caches.len()];
        self.decode_rows(tokens, caches, &rows, matmul)
    }

    /// [`Self::decode_each`] for several tokens of a sequence: `rows[b]` consecutive tokens
    /// after `caches[b]` (`tokens` holds each sequence's in order). Each token's logits are,
    /// bit for bit, what decoding the tokens one at a time gives, for up to
    /// [`KernelBackend::DECODE_BATCH`] rows in all: checking `k` drafted tokens reads the
    /// weights once and changes nothing (speculative decoding).
    ///
    /// Fails, having run nothing, if any cache has no room for its rows or holds a batch of
    /// sequences.
    ///
    /// # Shapes
    /// - tokens: `[rows.iter().sum(), 1]`
    pub fn decode_rows(
        &self,
        tokens: Tensor<B, 2, Int>,
        caches: &mut [&mut KvCache<B>],
        rows: &[usize],
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        B::decode_token(|| {
            let hidden = self.rows_hidden(tokens, caches, rows, matmul)?;
            Ok(self.logits(hidden, matmul))
        })
    }

    /// [`Self::decode_rows`] up to the final norm: each row's hidden state, `[n, 1, hidden]`,
    /// the bits one-token steps give, for any number of rows (the products take each row
    /// on its own; only lm_head's changes kernel past [`KernelBackend::DECODE_BATCH`] rows,
    /// so take [`Self::logits`] of at most that many rows at a time). A prompt runs here when
    /// its positions must be the same bits however they are reached
    /// ([`crate::generate::Prefill::Invariant`]).
    ///
    /// # Shapes
    /// - tokens: `[rows.iter().sum(), 1]`
    pub fn decode_rows_hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        caches: &mut [&mut KvCache<B>],
        rows: &[usize],
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        B::decode_token(|| self.rows_hidden(tokens, caches, rows, matmul))
    }

    fn rows_hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        caches: &mut [&mut KvCache<B>],
        rows: &[usize],
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        assert_eq!(caches.len(), rows.len(), "a row count per cache");
        assert_eq!(
            tokens.dims()[0],
            rows.iter().sum::<usize>(),
            "a token per row"
        );
        for (cache, &rows) in caches.iter().zip(rows) {
            cache.check_room(1, rows)?;
        }
        let rotations: Vec<Rotations<B>> = (caches.iter().zip(rows))
            .map(|(cache, &rows)| cache.rope_rows(rows))
            .collect();
        let mut x = self.embed(tokens);
        let mut layers: Vec<_> = caches.iter_mut().map(|c| c.layers_mut()).collect();
        for layer in &self.layers {
            let mut caches: Vec<&mut LayerCache<B>> = (layers.iter_mut())
                .map(|layers| layers.next().expect("a cache per layer"))
                .collect();
            let ropes: Vec<RopeRows<B>> = (rotations.iter())
                .map(|r| r.of(layer.self_attn.rotation).clone())
                .collect();
            x = layer.decode_each(x, &mut caches, rows, &ropes, matmul)?;
        }
        drop(layers);
        (caches.iter_mut().zip(rows)).for_each(|(cache, &rows)| cache.advance(rows));
        Ok(rms_norm(&self.norm, x))
    }

    /// The embedding's rows for `tokens: [batch, seq]`, f32 (rows of a bf16 embedding widen
    /// exactly), scaled if the model scales them: `[batch, seq, hidden]`.
    fn embed(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = B::embed(self.embed_tokens.weight.val(), tokens).cast(FloatDType::F32);
        match self.embedding_scale {
            Some(scale) => x.mul_scalar(scale),
            None => x,
        }
    }

    /// `[batch, seq, hidden]` → `[batch, seq, vocab]`
    pub fn logits(&self, hidden: Tensor<B, 3>, matmul: Matmul) -> Tensor<B, 3> {
        project(&self.lm_head, hidden, matmul)
    }

    /// Re-lays every projection weight out in memory as `[d_out, d_in]` (each output's
    /// weights contiguous) while its logical shape stays `[d_in, d_out]`, as a transposed view.
    ///
    /// Decoding is nothing but matrix-vector products, and a weight stored that way streams as
    /// one dot product per output: burn-flex's decode kernel reads only this layout, and gemm's
    /// own matrix-vector path is faster on it than on the row-major one. Prefill is
    /// unaffected: gemm packs either layout.
    ///
    /// With `tied` embeddings (config.json's `tie_word_embeddings`, for which the converter
    /// wrote lm_head as a copy of the embedding), lm_head becomes a transposed view of the
    /// embedding, which is already that layout: no copy, and a vocabulary-sized matrix less
    /// in memory.
    ///
    /// A loaded artifact is already in this layout (`load::load_into` writes each weight
    /// straight into it); this is for a model built otherwise (tests' random models).
    pub fn with_matvec_layout(self, tied: bool) -> Self {
        let lm_head = if tied {
            let embedding = self.embed_tokens.weight.val(); // [vocab, hidden]
            Linear {
                weight: self.lm_head.weight.map(|_| embedding.transpose()),
                ..self.lm_head
            }
        } else {
            self.lm_head.map(&mut ColumnMajor)
        };
        // Each weight needs one temporary copy of itself; layers are re-laid in parallel.
        let layers = (self.layers.into_par_iter())
            .map(|layer| layer.map(&mut ColumnMajor))
            .collect();
        Self {
            layers,
            lm_head,
            ..self
        }
    }
}

impl<B: KernelBackend> DecoderLayer<B> {
    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - output: `[batch, seq, hidden]`
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &RopeRows<B>,
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        let [_, seq, _] = x.dims();
        if seq == 1 {
            let shape = self.shape(cache.window(), matmul);
            let fused = LayerCache::append_each(&mut [cache], &[1], |caches| {
                B::decode_layer(
                    &x,
                    &self.weights(),
                    shape,
                    caches,
                    std::slice::from_ref(rope),
                )
            })?;
            if let Some(out) = fused {
                return Ok(out);
            }
        }
        self.forward_composed(x, cache, rope, matmul)
    }

    /// The next tokens of each of several sequences, `x: [n, 1, hidden]`: sequence `b`'s
    /// `rows[b]` rows in order after `caches[b]` (one layer of sequence `b`'s cache), at its
    /// rotary rows `ropes[b]` (`rows[b]` of them): the backend's fused batch, else each row
    /// through [`Self::forward`] on its own, in order.
    fn decode_each(
        &self,
        x: Tensor<B, 3>,
        caches: &mut [&mut LayerCache<B>],
        rows: &[usize],
        ropes: &[RopeRows<B>],
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        let window = caches.first().and_then(|cache| cache.window());
        let shape = self.shape(window, matmul);
        let weights = self.weights();
        let fused = LayerCache::append_each(caches, rows, |buffers| {
            B::decode_layer(&x, &weights, shape, buffers, ropes)
        })?;
        if let Some(out) = fused {
            return Ok(out);
        }
        let [n, _, hidden] = x.dims();
        let mut outs = Vec::with_capacity(n);
        let mut row = 0;
        for ((cache, rope), &count) in caches.iter_mut().zip(ropes).zip(rows) {
            for j in 0..count {
                let rope = RopeRows {
                    cos: rope.cos.clone().narrow(0, j, 1),
                    sin: rope.sin.clone().narrow(0, j, 1),
                };
                let x = x.clone().slice([row..row + 1, 0..1, 0..hidden]);
                outs.push(self.forward(x, cache, &rope, matmul)?);
                row += 1;
            }
        }
        debug_assert_eq!(row, n);
        Ok(Tensor::cat(outs, 0))
    }

    /// The layer as Burn ops (through the backend's [`KernelBackend`] operations): what a
    /// prompt runs, and what a backend's fused [`KernelBackend::decode_layer`] must equal.
    fn forward_composed(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &RopeRows<B>,
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        let normed = rms_norm(&self.input_layernorm, x.clone());
        let attended = self.self_attn.forward(normed, cache, rope, matmul)?;
        let (h, mlp_norm) = match &self.pre_feedforward_layernorm {
            Some(pre_feedforward) => (
                x + rms_norm(&self.post_attention_layernorm, attended),
                pre_feedforward,
            ),
            None => (x + attended, &self.post_attention_layernorm),
        };
        let out = self.mlp.forward(rms_norm(mlp_norm, h.clone()), matmul);
        Ok(h + match &self.post_feedforward_layernorm {
            Some(norm) => rms_norm(norm, out),
            None => out,
        })
    }

    /// The layer's tensors as the backend's fused layer takes them.
    fn weights(&self) -> LayerTensors<B> {
        let (attention, mlp) = (&self.self_attn, &self.mlp);
        let projection = |linear: &Linear<B>| Projection {
            weight: linear.weight.val(),
            bias: linear.bias.as_ref().map(Param::val),
        };
        LayerTensors {
            input_layernorm: self.input_layernorm.gamma.val(),
            q_proj: projection(&attention.q_proj),
            k_proj: projection(&attention.k_proj),
            v_proj: projection(&attention.v_proj),
            o_proj: projection(&attention.o_proj),
            q_norm: attention.q_norm.as_ref().map(|norm| norm.gamma.val()),
            k_norm: attention.k_norm.as_ref().map(|norm| norm.gamma.val()),
            post_attention_layernorm: self.post_attention_layernorm.gamma.val(),
            pre_feedforward_layernorm: (self.pre_feedforward_layernorm.as_ref())
                .map(|norm| norm.gamma.val()),
            post_feedforward_layernorm: (self.post_feedforward_layernorm.as_ref())
                .map(|norm| norm.gamma.val()),
            gate_proj: projection(&mlp.gate_proj),
            up_proj: projection(&mlp.up_proj),
            down_proj: projection(&mlp.down_proj),
        }
    }

    /// What the fused layer needs besides weights; the sliding window is the cache's.
    fn shape(&self, window: Option<usize>, matmul: Matmul) -> LayerShape {
        LayerShape {
            heads: self.self_attn.heads(),
            rope: self.self_attn.rotation != Rotation::None,
            score_scale: self.self_attn.score_scale,
            activation: self.mlp.activation,
            epsilon: self.input_layernorm.epsilon as f32,
            window,
            matmul,
        }
    }
}

impl<B: KernelBackend> Attention<B> {
    /// The head layout attention kernels take.
    fn heads(&self) -> Heads {
        Heads {
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, hidden]`
    /// - output: `[batch, seq, hidden]`
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &RopeRows<B>,
        matmul: Matmul,
    ) -> Result<Tensor<B, 3>, CacheError> {
        // Rotate while each projection is still one contiguous [batch, seq, heads * hd] block.
        // The score scale goes on q (1/8 for hd = 64, a power of two, so this is exact).
        let heads = self.heads();
        let [q, k, v] = linears(x, [&self.q_proj, &self.k_proj, &self.v_proj], matmul);
        let (q, k) = (head_norm(&self.q_norm, q), head_norm(&self.k_norm, k));
        let (q, k) = match self.rotation {
            Rotation::None => (q.mul_scalar(self.score_scale), k),
            _ => (
                B::rotary(q, rope, self.score_scale),
                B::rotary(k, rope, 1.0),
            ),
        };
        let (k, v) = cache.append(k, v)?; // [batch, start + seq, n_kv * hd]
        let attended = B::causal_attention(q, k, v, heads, cache.window());
        Ok(project(&self.o_proj, attended, matmul))
    }
}

impl<B: KernelBackend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 3>, matmul: Matmul) -> Tensor<B, 3> {
        let [gate, up] = linears(x, [&self.gate_proj, &self.up_proj], matmul);
        project(&self.down_proj, B::glu(gate, up, self.activation), matmul)
    }
}

/// Each `head_dim`-wide head of `x` (`[batch, seq, heads * head_dim]`) through `norm`, if
/// there is one.
fn head_norm<B: KernelBackend>(norm: &Option<RmsNorm<B>>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let Some(norm) = norm else {
        return x;
    };
    let [batch, seq, width] = x.dims();
    let [head_dim] = norm.gamma.dims();
    let heads = x.reshape([batch, seq * width / head_dim, head_dim]);
    rms_norm(norm, heads).reshape([batch, seq, width])
}

/// `norm.forward(x)` through the backend's kernel.
fn rms_norm<B: KernelBackend>(norm: &RmsNorm<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    B::rms_norm(x, norm.gamma.val(), norm.epsilon)
}

/// `linear.forward(x)` through the backend's kernel (burn-flex: a threaded
/// matrix-vector product for a single row).
fn project<B: KernelBackend>(linear: &Linear<B>, x: Tensor<B, 3>, matmul: Matmul) -> Tensor<B, 3> {
    let [out] = linears(x, [linear], matmul);
    out
}

/// `linear.forward(x)` for linear layers that share their input, their products in one
/// call to the backend, then each one's bias added (after the product, as the fused layer
/// adds it, so both round alike).
fn linears<B: KernelBackend, const N: usize>(
    x: Tensor<B, 3>,
    linears: [&Linear<B>; N],
    matmul: Matmul,
) -> [Tensor<B, 3>; N] {
    let products = B::linear_forward(x, linears.map(|linear| linear.weight.val()), matmul);
    let mut outs = products
        .into_iter()
        .zip(linears)
        .map(|(out, linear)| match &linear.bias {
            Some(bias) => out + bias.val().unsqueeze(),
            None => out,
        });
    std::array::from_fn(|_| outs.next().expect("one output per linear layer"))
}

/// Stores every 2-D parameter (a Linear weight, `[d_in, d_out]`) as `[d_out, d_in]` in
/// memory, seen as `[d_in, d_out]`.
struct ColumnMajor;

impl<B: Backend> ModuleMapper<B> for ColumnMajor {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if D != 2 {
            return param;
        }
        param.map(|w| {
            // Reshaping the transposed view forces a (tiled) copy into the new order.
            let transposed = w.transpose(); // [d_out, d_in]
            let shape = transposed.shape();
            transposed
                .reshape([shape.num_elements()])
                .reshape(shape)
                .transpose()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FlexBackend;
    use crate::model::cache::KvDtype;
    use crate::model::config::Biases;
    use crate::model::testing::{Randomize, normal};
    use kernels::team;

    /// burn-flex's fused single-token layer (`KernelBackend::decode_layer`) gives exactly
    /// what the layer's ops give, token after token, with keys split across threads once
    /// there are enough of them and projections both split and not: at 1, 2, 3 and 5
    /// threads, inside a thread team as `Llama::decode` runs it. Plain, and with every bias,
    /// a sliding window shorter than the sequence and Qwen3's head norms, without RoPE
    /// (SmolLM3's NoPE layers), and with Gemma 3's switches (its own RoPE table for a
    /// sliding layer, sandwich norms, GELU-tanh, another score scale); with each KV cache
    /// type.
    #[test]
    fn fused_decode_layer_equals_the_composed_ops() {
        let plain = LlamaConfig::plain([64, 160, 1], [4, 2, 16], 10, 96);
        let all = Biases {
            qkv: true,
            o: true,
            mlp: true,
        };
        for config in [
            plain.clone(),
            LlamaConfig {
                biases: all,
                sliding_window: Some(40),
                qk_norm: true,
                ..plain.clone()
            },
            LlamaConfig {
                layers_without_rope: vec![0],
                ..plain.clone()
            },
            LlamaConfig {
                sliding_window: Some(40),
                sliding_rope_theta: Some(500.0),
                qk_norm: true,
                activation: Activation::GeluTanh,
                score_scale: Some(0.125),
                sandwich_norms: true,
                ..plain
            },
        ] {
            for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
                fused_layer_equals_composed(&config, dtype);
            }
        }
    }

    fn fused_layer_equals_composed(config: &LlamaConfig, dtype: KvDtype) {
        let device = Default::default();
        let model = config
            .init::<FlexBackend>(&device)
            .map(&mut Randomize(7))
            .with_matvec_layout(false);
        let layer = model.layers.into_iter().next().expect("one layer");
        let positions = 90;
        for threads in [1, 2, 3, 5] {
            let [mut fused_cache, mut composed_cache] = [(); 2].map(|_| {
                KvCache::new(config, 1, positions, dtype, &device).expect("a small cache")
            });
            for position in 0..positions {
                let x = normal::<FlexBackend, 3>([1, 1, 64], position as u64);
                let rotations = fused_cache.rope_rows(1);
                let rope = rotations.of(layer.self_attn.rotation).clone();
                let fused_layer_cache = fused_cache.layers_mut().next().expect("one layer");
                let composed_layer_cache = composed_cache.layers_mut().next().expect("one layer");
                let shape = layer.shape(config.sliding_window, Matmul::Exact);
                // Both in the same pool: decode attention splits keys by the thread count.
                let (fused, composed) = crate::in_thread_pool(Some(threads), || {
                    team::with_team(|| {
                        let fused =
                            LayerCache::append_each(&mut [fused_layer_cache], &[1], |caches| {
                                let ropes = std::slice::from_ref(&rope);
                                FlexBackend::decode_layer(
                                    &x,
                                    &layer.weights(),
                                    shape,
                                    caches,
                                    ropes,
                                )
                            });
                        let composed =
                            layer.forward_composed(x, composed_layer_cache, &rope, Matmul::Exact);
                        (fused, composed)
                    })
                })
                .expect("a thread pool");
                let fused = fused
                    .expect("room in the cache")
                    .expect("burn-flex fuses a single-token layer");
                let composed = composed.expect("room in the cache");
                for cache in [&mut fused_cache, &mut composed_cache] {
                    cache.advance(1);
                }
                let (fused, composed) = (fused.into_data(), composed.into_data());
                assert_eq!(
                    fused, composed,
                    "{dtype}, {threads} threads, position {position}"
                );
            }
        }
    }
}

#[cfg(test)]
mod batch_tests {
    use burn::tensor::TensorData;

    use super::*;
    use crate::FlexBackend;
    use crate::model::cache::KvDtype;
    use crate::model::config::Biases;
    use crate::model::testing::Randomize;

    /// `tokens` as a `[n, 1]` batch of ids.
    fn ids<B: Backend>(tokens: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        Tensor::from_data(TensorData::new(ids, [tokens.len(), 1]), device)
    }

    /// A cache per prompt length, each prompt (ids `(s * 13 + t * salt) % 50` for sequence
    /// `s`, token `t`) decoded one token at a time.
    fn prefilled(
        model: &Llama<FlexBackend>,
        config: &LlamaConfig,
        lengths: &[usize],
        dtype: KvDtype,
        salt: usize,
    ) -> Vec<KvCache<FlexBackend>> {
        let device = Default::default();
        (lengths.iter().enumerate())
            .map(|(s, &len)| {
                let mut cache = KvCache::new(config, 1, 100, dtype, &device).expect("a cache");
                for t in 0..len {
                    let token = ((s * 13 + t * salt) % 50) as u32;
                    (model.decode(ids(&[token], &device), &mut cache, Matmul::Exact))
                        .expect("room");
                }
                cache
            })
            .collect()
    }

    /// Several sequences of different lengths decoded together (`decode_each`) get, bit for
    /// bit, the logits each gets decoded alone, step after step, as sequences finish and
    /// the batch shrinks: two layers with every bias, at 1, 2 and 3 threads. A difference
    /// in any row's order of summation, or a row reading another's cache, would show.
    #[test]
    fn sequences_decoded_together_equal_each_alone() {
        let config = LlamaConfig {
            biases: Biases {
                qkv: true,
                o: true,
                mlp: true,
            },
            ..LlamaConfig::plain([64, 160, 2], [4, 2, 16], 50, 200)
        };
        let device = Default::default();
        let model = config
            .init::<FlexBackend>(&device)
            .map(&mut Randomize(11))
            .with_matvec_layout(false);
        let ids = |tokens: &[u32]| ids(tokens, &device);
        for threads in [1, 2, 3] {
            crate::in_thread_pool(Some(threads), || {
                // Prompts of 1, 7, 20, 33 and 60 tokens, prefilled one token at a time.
                let lengths = [1usize, 7, 20, 33, 60];
                let new_caches = || prefilled(&model, &config, &lengths, KvDtype::F32, 7);
                let (mut together, mut alone) = (new_caches(), new_caches());
                for step in 0..12 {
                    // Sequence s runs 12 - 2s steps: the batch shrinks from 5 to 1.
                    let running: Vec<usize> = (0..lengths.len())
                        .filter(|&s| step < 12 - 2 * s.min(5))
                        .collect();
                    let tokens: Vec<u32> = running
                        .iter()
                        .map(|&s| ((s * 5 + step * 3) % 50) as u32)
                        .collect();
                    let mut caches: Vec<&mut KvCache<FlexBackend>> = together
                        .iter_mut()
                        .enumerate()
                        .filter(|(s, _)| running.contains(s))
                        .map(|(_, c)| c)
                        .collect();
                    let batched = model
                        .decode_each(ids(&tokens), &mut caches, Matmul::Exact)
                        .expect("room");
                    let batched = batched.into_data().into_vec::<f32>().expect("f32 logits");
                    let rows = batched.chunks_exact(50);
                    for ((&s, &token), row) in running.iter().zip(&tokens).zip(rows) {
                        let single = model
                            .decode(ids(&[token]), &mut alone[s], Matmul::Exact)
                            .expect("room");
                        let single = single.into_data().into_vec::<f32>().expect("f32 logits");
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(row),
                            bits(&single),
                            "sequence {s}, step {step}, {threads} threads"
                        );
                    }
                }
            })
            .expect("a thread pool");
        }
    }

    /// Several tokens of each of several sequences in one pass (`decode_rows`, a
    /// speculative draft's check) get, row by row, bit for bit, the logits of decoding the
    /// tokens one at a time; and the cache holds what the one-token steps wrote (the steps
    /// after agree too). Plain Llama with every bias, and a Gemma-like layer with a sliding
    /// window crossed by the rows, q/k norms and sandwich norms; 1 and 3 threads; f32 and
    /// bf16 caches.
    #[test]
    fn rows_of_a_sequence_equal_its_one_token_steps() {
        let plain = LlamaConfig {
            biases: Biases {
                qkv: true,
                o: true,
                mlp: true,
            },
            ..LlamaConfig::plain([64, 160, 2], [4, 2, 16], 50, 200)
        };
        let gemma_like = LlamaConfig {
            sliding_window: Some(9),
            qk_norm: true,
            sandwich_norms: true,
            ..plain.clone()
        };
        let device = Default::default();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (c, config) in [plain, gemma_like].iter().enumerate() {
            let model = config
                .init::<FlexBackend>(&device)
                .map(&mut Randomize(5 + c as u64))
                .with_matvec_layout(false);
            let ids = |tokens: &[u32]| ids(tokens, &device);
            for (threads, dtype) in [(1, KvDtype::F32), (3, KvDtype::F32), (3, KvDtype::Bf16)] {
                crate::in_thread_pool(Some(threads), || {
                    // Three sequences after prompts of 1, 6 and 17 tokens; rows of 1 to 7.
                    let lengths = [1usize, 6, 17];
                    let new_caches = || prefilled(&model, config, &lengths, dtype, 5);
                    let (mut together, mut alone) = (new_caches(), new_caches());
                    for (pass, rows) in [[3, 1, 7], [1, 5, 2], [6, 1, 1]].iter().enumerate() {
                        let tokens: Vec<u32> = (0..rows.iter().sum::<usize>())
                            .map(|r| ((pass * 17 + r * 7) % 50) as u32)
                            .collect();
                        let mut caches: Vec<&mut KvCache<FlexBackend>> =
                            together.iter_mut().collect();
                        let checked = model
                            .decode_rows(ids(&tokens), &mut caches, rows, Matmul::Exact)
                            .expect("room");
                        let checked = checked.into_data().into_vec::<f32>().expect("f32 logits");
                        let mut checked = checked.chunks_exact(50);
                        let mut tokens = tokens.iter();
                        for (s, &count) in rows.iter().enumerate() {
                            for row in 0..count {
                                let token = *tokens.next().expect("a token per row");
                                let single = model
                                    .decode(ids(&[token]), &mut alone[s], Matmul::Exact)
                                    .expect("room");
                                let single =
                                    single.into_data().into_vec::<f32>().expect("f32 logits");
                                assert_eq!(
                                    bits(checked.next().expect("a row")),
                                    bits(&single),
                                    "config {c}, sequence {s}, pass {pass}, row {row}, \
                                     {threads} threads, {dtype}"
                                );
                            }
                        }
                    }
                })
                .expect("a thread pool");
            }
        }
    }
}
