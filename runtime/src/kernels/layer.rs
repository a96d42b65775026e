//! One decoder layer for one token, over slices: what llama2.c's `forward()` does for a layer.
//!
//! Why fused: a decoded token streams each layer's weights through the caches, which evicts
//! everything else, so every small operation between two products (the norms, RoPE, the
//! KV append, the residual adds, SiLU) starts cold, and a Burn op's set-up (tensor handles,
//! layouts, allocations) is a chain of cache misses longer than its few hundred
//! multiply-adds. Here those operations are plain loops over buffers. The arithmetic is the
//! same kernels in the same order as the composed layer (`model.rs`), so the output is
//! bit-identical to it.

use super::attention::{CausalAttention, Heads, Matrix};
use super::matvec::matvecs;
use super::simd;

/// A decoder layer's tensors under their Hugging Face names (transformers'
/// `LlamaDecoderLayer`): `N` a norm's weight, `P` a projection's.
#[derive(Debug, Clone)]
pub struct LayerWeights<N, P> {
    pub input_layernorm: N,
    pub q_proj: P,
    pub k_proj: P,
    pub v_proj: P,
    pub o_proj: P,
    pub post_attention_layernorm: N,
    pub gate_proj: P,
    pub up_proj: P,
    pub down_proj: P,
}

impl<N, P> LayerWeights<N, P> {
    /// The same layer with every norm weight through `norm` and every projection through
    /// `projection`; `None` if either gives `None` for any of them.
    pub fn try_map<'a, M, Q>(
        &'a self,
        norm: impl Fn(&'a N) -> Option<M>,
        projection: impl Fn(&'a P) -> Option<Q>,
    ) -> Option<LayerWeights<M, Q>> {
        Some(LayerWeights {
            input_layernorm: norm(&self.input_layernorm)?,
            q_proj: projection(&self.q_proj)?,
            k_proj: projection(&self.k_proj)?,
            v_proj: projection(&self.v_proj)?,
            o_proj: projection(&self.o_proj)?,
            post_attention_layernorm: norm(&self.post_attention_layernorm)?,
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
    /// RMSNorm's epsilon.
    pub epsilon: f32,
}

/// One layer's KV cache for one sequence: `keys` and `values` hold `capacity` positions of
/// `n_kv_heads * head_dim` each; the token is written at `position`.
pub struct KvSlot<'a> {
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
    pub position: usize,
}

/// The layer's forward pass for one token: `x` (`[hidden]`, the residual stream) is updated
/// in place, and the token's key and value are written into `cache`.
///
/// Projections are `d_out` contiguous rows of `d_in` (a `[d_in, d_out]` weight stored
/// column-major); `cos` and `sin` are the rotary tables' rows for the position, `[head_dim]`.
pub fn decode_layer(
    x: &mut [f32],
    weights: &LayerWeights<&[f32], &[f32]>,
    shape: LayerShape,
    cache: KvSlot<'_>,
    cos: &[f32],
    sin: &[f32],
) {
    let LayerShape { heads, epsilon } = shape;
    let w = weights;
    let mut normed = vec![0.0f32; x.len()];

    // Attention: pre-norm, q/k/v, RoPE (the score scale goes on q, as in the composed path).
    simd::rms_norm_rows(x, w.input_layernorm, epsilon, &mut normed);
    let [mut q, mut k, v] = outputs(matvecs(&[w.q_proj, w.k_proj, w.v_proj], &normed));
    simd::rotary_heads(&mut q, cos, sin, heads.score_scale());
    simd::rotary_heads(&mut k, cos, sin, 1.0);
    // The token's key and value join the cache; it attends to every position so far.
    let KvSlot {
        keys,
        values,
        position,
    } = cache;
    let width = k.len();
    keys[position * width..][..width].copy_from_slice(&k);
    values[position * width..][..width].copy_from_slice(&v);
    let attended = CausalAttention {
        queries: Matrix::rows_of(&q, q.len()),
        keys: Matrix::rows_of(keys, width),
        values: Matrix::rows_of(values, width),
        batch: 1,
        seq: 1,
        start: position,
        heads,
    }
    .run();
    // Output projection, back into the residual stream.
    let [o] = outputs(matvecs(&[w.o_proj], &attended));
    add(x, &o);

    // MLP: pre-norm, gate and up, SwiGLU, down, residual.
    simd::rms_norm_rows(x, w.post_attention_layernorm, epsilon, &mut normed);
    let [mut gate, up] = outputs(matvecs(&[w.gate_proj, w.up_proj], &normed));
    simd::silu_mul(&mut gate, &up);
    let [down] = outputs(matvecs(&[w.down_proj], &gate));
    add(x, &down);
}

fn outputs<const N: usize>(outs: Vec<Vec<f32>>) -> [Vec<f32>; N] {
    outs.try_into().expect("one output per weight")
}

fn add(residual: &mut [f32], x: &[f32]) {
    for (r, x) in residual.iter_mut().zip(x) {
        *r += x;
    }
}
