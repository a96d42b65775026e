//! One decoder layer for one token, over slices: what llama2.c's `forward()` does for a layer.
//!
//! Why fused: a decoded token streams each layer's weights through the caches, which evicts
//! everything else, so every small operation between two products (the norms, RoPE, the
//! KV append, the residual adds, SiLU) starts cold, and a Burn op's set-up (tensor handles,
//! layouts, allocations) is a chain of cache misses longer than its few hundred
//! multiply-adds. Here those operations are plain loops over buffers. The arithmetic is the
//! same kernels in the same order as the composed layer (the runtime's `model/llama.rs`),
//! so the output is bit-identical to it.

use crate::attention::{CausalAttention, Heads, Matrix};
use crate::int8::Matmul;
use crate::matvec::{Rows, matvecs};
use crate::simd;
use crate::stored::Stored;

/// The MLP's gate activation: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (`silu`).
    #[default]
    Silu,
    /// GELU's tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
    /// (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// A linear layer's tensors: `M` its weight, `V` its bias, if it has one.
#[derive(Debug, Clone)]
pub struct Projection<V, M> {
    pub weight: M,
    pub bias: Option<V>,
}

/// A decoder layer's tensors under their Hugging Face names (transformers'
/// `LlamaDecoderLayer`, `Gemma3DecoderLayer` with the feedforward norms): `V` a vector's (a
/// norm's weight, a bias), `M` a matrix's.
#[derive(Debug, Clone)]
pub struct LayerWeights<V, M> {
    pub input_layernorm: V,
    pub q_proj: Projection<V, M>,
    pub k_proj: Projection<V, M>,
    pub v_proj: Projection<V, M>,
    pub o_proj: Projection<V, M>,
    /// Each query head's and key head's RMSNorm weights (`head_dim` wide), if the model
    /// normalizes them before RoPE (Qwen3).
    pub q_norm: Option<V>,
    pub k_norm: Option<V>,
    pub post_attention_layernorm: V,
    /// Gemma's sandwich norms (both or neither): with them `post_attention_layernorm`
    /// normalizes the attention's output, as `model::DecoderLayer` says.
    pub pre_feedforward_layernorm: Option<V>,
    pub post_feedforward_layernorm: Option<V>,
    pub gate_proj: Projection<V, M>,
    pub up_proj: Projection<V, M>,
    pub down_proj: Projection<V, M>,
}

impl<V, M> LayerWeights<V, M> {
    /// The same layer with every vector through `vector` and every matrix through
    /// `matrix`; `None` if either gives `None` for any of them.
    pub fn try_map<'a, W, N>(
        &'a self,
        vector: impl Fn(&'a V) -> Option<W>,
        matrix: impl Fn(&'a M) -> Option<N>,
    ) -> Option<LayerWeights<W, N>> {
        let optional = |v: &'a Option<V>| match v {
            Some(v) => vector(v).map(Some),
            None => Some(None),
        };
        let projection = |p: &'a Projection<V, M>| {
            Some(Projection {
                weight: matrix(&p.weight)?,
                bias: match &p.bias {
                    Some(bias) => Some(vector(bias)?),
                    None => None,
                },
            })
        };
        Some(LayerWeights {
            input_layernorm: vector(&self.input_layernorm)?,
            q_proj: projection(&self.q_proj)?,
            k_proj: projection(&self.k_proj)?,
            v_proj: projection(&self.v_proj)?,
            o_proj: projection(&self.o_proj)?,
            q_norm: optional(&self.q_norm)?,
            k_norm: optional(&self.k_norm)?,
            post_attention_layernorm: vector(&self.post_attention_layernorm)?,
            pre_feedforward_layernorm: optional(&self.pre_feedforward_layernorm)?,
            post_feedforward_layernorm: optional(&self.post_feedforward_layernorm)?,
            gate_proj: projection(&self.gate_proj)?,
            up_proj: projection(&self.up_proj)?,
            down_proj: projection(&self.down_proj)?,
        })
    }
}

/// What a layer's pass needs besides its weights.
#[derive(Debug, Clone, Copy)]
pub struct LayerShape {
    pub heads: Heads,
    /// Whether queries and keys are rotated (not in SmolLM3's NoPE layers).
    pub rope: bool,
    /// What queries are multiplied by (attention's score scale).
    pub score_scale: f32,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// RMSNorm's epsilon.
    pub epsilon: f32,
    /// Attention's sliding window, if it has one (see [`CausalAttention::window`]).
    pub window: Option<usize>,
    /// How the products over quantized weights take their inputs.
    pub matmul: Matmul,
}

/// One layer's KV cache for one sequence: `keys` and `values` hold `capacity` positions of
/// `n_kv_heads * head_dim` each, stored as `S`; its `rows` tokens are written at `position`,
/// `position + 1`, ...
pub struct KvSlot<'a, S> {
    pub keys: &'a mut [S],
    pub values: &'a mut [S],
    pub position: usize,
    pub rows: usize,
}

/// The layer's forward pass for the next tokens of each of a batch of sequences: `x` (`[n,
/// hidden]`, their residual streams, each sequence's `rows` in order) is updated in place,
/// and each token's key and value are written into its sequence's cache (`caches[b]`,
/// positions may differ). `rope[r]` is the rotary tables' rows (`cos`, `sin`, `[head_dim]`
/// each) for row `r`'s position.
///
/// The weights are read once for the whole batch (`matvecs`), and every row's arithmetic is
/// what it is alone, so a sequence's output is the same, bit for bit, in any batch; and a
/// sequence's `k` rows give, row by row, the bits `k` passes of one row each give (each row
/// attends to the positions up to its own, as if the rows after it were not there yet):
/// checking several drafted tokens costs one read of the weights and changes no bit.
/// Projections are `d_out` contiguous rows of `d_in` (a `[d_in, d_out]` weight stored
/// column-major), f32 or bf16.
pub fn decode_layer<S: Stored>(
    x: &mut [f32],
    weights: &LayerWeights<&[f32], Rows<'_>>,
    shape: LayerShape,
    caches: Vec<KvSlot<'_, S>>,
    rope: &[(&[f32], &[f32])],
) {
    let LayerShape {
        heads,
        rope: rotated,
        score_scale,
        activation,
        epsilon,
        window,
        matmul,
    } = shape;
    let w = weights;
    let hidden = w.input_layernorm.len();
    let mut normed = vec![0.0f32; x.len()];

    // Attention: pre-norm, q/k/v, each head's norm if any, RoPE (the score scale goes on q,
    // as in the composed path).
    simd::rms_norm_rows(x, w.input_layernorm, epsilon, &mut normed);
    let [mut q, mut k, v] = project([&w.q_proj, &w.k_proj, &w.v_proj], &normed, hidden, matmul);
    let rows: usize = caches.iter().map(|cache| cache.rows).sum();
    assert_eq!(rows, rope.len(), "a rotary row for each row");
    let (q_width, kv_width) = (q.len() / rows, k.len() / rows);
    let mut attended = Vec::with_capacity(q.len());
    let mut tokens = (q.chunks_exact_mut(q_width))
        .zip(k.chunks_exact_mut(kv_width))
        .zip(v.chunks_exact(kv_width))
        .zip(rope);
    for cache in caches {
        let KvSlot {
            keys,
            values,
            position: first,
            rows: count,
        } = cache;
        for (position, (((q, k), v), &(cos, sin))) in (first..).zip(tokens.by_ref().take(count)) {
            for (rows, norm) in [(&mut *q, w.q_norm), (&mut *k, w.k_norm)] {
                if let Some(gamma) = norm {
                    normalize(rows, gamma, epsilon);
                }
            }
            if rotated {
                simd::rotary_heads(q, cos, sin, score_scale);
                simd::rotary_heads(k, cos, sin, 1.0);
            } else {
                q.iter_mut().for_each(|x| *x *= score_scale);
            }
            // The token's key and value join the cache; it attends to every position up to
            // its own (the sequence's later rows are written after).
            let store = |to: &mut [S], from: &[f32]| {
                for (to, &x) in to[position * kv_width..][..kv_width].iter_mut().zip(from) {
                    *to = S::narrow(x);
                }
            };
            store(keys, k);
            store(values, v);
            let out = CausalAttention {
                queries: Matrix::rows_of(q, q_width),
                keys: Matrix::rows_of(keys, kv_width),
                values: Matrix::rows_of(values, kv_width),
                batch: 1,
                seq: 1,
                start: position,
                heads,
                window,
            }
            .decode();
            attended.extend(out);
        }
    }
    // Output projection (normalized with sandwich norms), back into the residual stream.
    let [mut o] = project([&w.o_proj], &attended, q_width, matmul);
    let mlp_norm = match w.pre_feedforward_layernorm {
        Some(pre_feedforward) => {
            normalize(&mut o, w.post_attention_layernorm, epsilon);
            pre_feedforward
        }
        None => w.post_attention_layernorm,
    };
    add(x, &o);

    // MLP: pre-norm, gate and up, the gated activation, down (normalized with sandwich
    // norms), residual.
    simd::rms_norm_rows(x, mlp_norm, epsilon, &mut normed);
    let [mut gate, up] = project([&w.gate_proj, &w.up_proj], &normed, hidden, matmul);
    match activation {
        Activation::Silu => simd::silu_mul(&mut gate, &up),
        Activation::GeluTanh => simd::gelu_tanh_mul(&mut gate, &up),
    }
    let [mut down] = project(
        [&w.down_proj],
        &gate,
        gate.len() / (x.len() / hidden),
        matmul,
    );
    if let Some(post_feedforward) = w.post_feedforward_layernorm {
        normalize(&mut down, post_feedforward, epsilon);
    }
    add(x, &down);
}

/// Each row of `x` RMS-normalized in place.
fn normalize(x: &mut [f32], gamma: &[f32], epsilon: f32) {
    let unnormed = x.to_vec();
    simd::rms_norm_rows(&unnormed, gamma, epsilon, x);
}

/// The rows of `xs` (each `d_in` wide) through projections that share them as input: their
/// matrix products in one parallel pass, then each one's bias added to every row.
fn project<const N: usize>(
    projections: [&Projection<&[f32], Rows<'_>>; N],
    xs: &[f32],
    d_in: usize,
    matmul: Matmul,
) -> [Vec<f32>; N] {
    let weights = projections.map(|p| p.weight);
    let mut outs: [Vec<f32>; N] = matvecs(&weights, xs, d_in, matmul)
        .try_into()
        .expect("one output per weight");
    for (out, projection) in outs.iter_mut().zip(projections) {
        if let Some(bias) = projection.bias {
            for row in out.chunks_exact_mut(bias.len()) {
                add(row, bias);
            }
        }
    }
    outs
}

fn add(residual: &mut [f32], x: &[f32]) {
    for (r, x) in residual.iter_mut().zip(x) {
        *r += x;
    }
}
