//! Fused CPU kernels, added to Burn backends the way Burn extends a backend with custom
//! kernels: a trait on the backend whose default methods compose ordinary tensor ops, and
//! an override for a backend whose buffers the kernel can read directly.
//!
//! Why: a 512-token prefill on burn-flex spent about 45% of its time outside the matrix
//! products. Attention composed from tensor ops materialised every head's full score
//! matrix (half of it masked), exponentiated all of it with scalar libm calls on one
//! thread, and copied queries, keys, values and the output between token-major and
//! head-major layouts; SiLU was another scalar single-threaded pass. The burn-flex
//! overrides below do each in one parallel, vectorized pass. burn-ndarray, kept for
//! comparison, uses the defaults, which also serve as the reference the tests hold the
//! fused kernels to.

mod attention;
mod simd;

use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use crate::{FlexBackend, NdArrayBackend};
use attention::{CausalAttention, Rows};

/// How attention's heads are laid out: query head `h` reads key/value head
/// `h / (n_heads / n_kv_heads)`, as in transformers' `repeat_kv`.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The model's fused operations, per backend.
pub trait Kernels: Backend {
    /// Causal grouped-query attention.
    ///
    /// # Shapes
    /// - queries: `[batch, seq, n_heads * head_dim]`, rotated and scaled by `1/sqrt(head_dim)`
    /// - keys, values: `[batch, start + seq, n_kv_heads * head_dim]`, positions `0..start`
    ///   from the cache followed by this call's
    /// - output: `[batch, seq, n_heads * head_dim]`; query `i` attends to keys `0..=start + i`
    fn causal_attention(
        queries: Tensor<Self, 3>,
        keys: Tensor<Self, 3>,
        values: Tensor<Self, 3>,
        heads: Heads,
    ) -> Tensor<Self, 3> {
        reference_attention(queries, keys, values, heads)
    }

    /// SwiGLU's gating: `silu(gate) * up`, element-wise.
    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Tensor<Self, 3> {
        silu(gate) * up
    }
}

impl Kernels for NdArrayBackend {}

impl Kernels for FlexBackend {
    fn causal_attention(
        queries: Tensor<Self, 3>,
        keys: Tensor<Self, 3>,
        values: Tensor<Self, 3>,
        heads: Heads,
    ) -> Tensor<Self, 3> {
        let [batch, seq, width] = queries.dims();
        let total = keys.dims()[1];
        let (queries, keys, values) = (row_major(queries), row_major(keys), row_major(values));
        let view = |t| rows(t).expect("row_major returns a row-major layout");
        let out = CausalAttention {
            queries: view(&queries),
            keys: view(&keys),
            values: view(&values),
            batch,
            seq,
            start: total - seq,
            heads,
        }
        .run();
        from_flex(FlexTensor::from_data(TensorData::new(
            out,
            [batch, seq, width],
        )))
    }

    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let up = flex(up).to_contiguous();
        let up: &[f32] = up.storage();
        // In place when the gate projection's output is not shared (it never is here).
        let mut gate = flex(gate).to_contiguous();
        let out: &mut [f32] = gate.storage_mut();
        const CHUNK: usize = 1 << 14;
        if out.len() <= CHUNK {
            simd::vectorized(|| simd::silu_mul(out, up));
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(up.par_chunks(CHUNK))
                .for_each(|(g, u)| simd::vectorized(|| simd::silu_mul(g, u)));
        }
        from_flex(gate)
    }
}

fn flex(tensor: Tensor<FlexBackend, 3>) -> FlexTensor {
    tensor.into_primitive().tensor()
}

fn from_flex(tensor: FlexTensor) -> Tensor<FlexBackend, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor))
}

/// `tensor` as a burn-flex tensor whose rows are contiguous: as it is when they already are
/// (a slice of the KV cache's buffer is), else a contiguous copy.
fn row_major(tensor: Tensor<FlexBackend, 3>) -> FlexTensor {
    let tensor = flex(tensor);
    if rows(&tensor).is_some() {
        tensor
    } else {
        tensor.to_contiguous()
    }
}

/// A `[batch, rows, width]` burn-flex tensor as rows of its buffer, if its rows are contiguous.
fn rows(tensor: &FlexTensor) -> Option<Rows<'_>> {
    let layout = tensor.layout();
    match *layout.strides() {
        [batch_stride, row_stride, 1] if batch_stride >= 0 && row_stride >= 0 => Some(Rows {
            data: tensor.storage(),
            offset: layout.start_offset(),
            batch_stride: batch_stride as usize,
            row_stride: row_stride as usize,
        }),
        _ => None,
    }
}

/// [`Kernels::causal_attention`] from tensor ops: each group of query heads folded into
/// the rows of its key/value head, full score matrices, an additive causal mask, softmax.
pub fn reference_attention<B: Backend>(
    queries: Tensor<B, 3>,
    keys: Tensor<B, 3>,
    values: Tensor<B, 3>,
    heads: Heads,
) -> Tensor<B, 3> {
    let Heads {
        n_heads,
        n_kv_heads: n_kv,
        head_dim: hd,
    } = heads;
    let [batch, seq, _] = queries.dims();
    let total = keys.dims()[1];
    let group = n_heads / n_kv;
    let device = queries.device();
    // [batch, rows, n * hd] → [batch, n, rows, hd]
    let split = |t: Tensor<B, 3>, rows, n| t.reshape([batch, rows, n, hd]).swap_dims(1, 2);
    let queries = split(queries, seq, n_heads).reshape([batch, n_kv, group * seq, hd]);
    let scores = queries.matmul(split(keys, total, n_kv).swap_dims(2, 3));
    let scores = if seq > 1 {
        scores + causal_mask(seq, total - seq, n_kv, group, &device)
    } else {
        scores
    };
    softmax(scores, 3)
        .matmul(split(values, total, n_kv))
        .reshape([batch, n_heads, seq, hd])
        .swap_dims(1, 2)
        .reshape([batch, seq, n_heads * hd])
}

/// Additive causal mask `[1, n_kv, group * seq, start + seq]` for the grouped score rows:
/// row `g * seq + i` is query `i` (at position `start + i`) of any head in a group, and
/// sees keys `0..=start + i`.
fn causal_mask<B: Backend>(
    seq: usize,
    start: usize,
    n_kv: usize,
    group: usize,
    device: &B::Device,
) -> Tensor<B, 4> {
    let total = start + seq;
    let one_kv_head: Vec<f32> = (0..group * seq)
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
    Tensor::from_data(
        TensorData::new(one_kv_head.repeat(n_kv), [1, n_kv, group * seq, total]),
        device,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn random(shape: [usize; 3]) -> Tensor<FlexBackend, 3> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
    }

    fn assert_close(fused: Tensor<FlexBackend, 3>, reference: Tensor<FlexBackend, 3>) {
        assert_eq!(fused.dims(), reference.dims());
        let diff: f32 = (fused - reference.clone()).abs().max().into_scalar();
        let scale: f32 = reference.abs().max().into_scalar();
        assert!(diff <= 1e-5 * scale.max(1.0), "max difference {diff}");
    }

    /// The fused kernel against the tensor-op definition: prefill from empty, a chunk after
    /// cached positions (the mask's offset), a single decoded token, batch 2, rows not a
    /// multiple of the block, and keys/values that are a prefix view of a larger buffer.
    #[test]
    fn fused_attention_matches_the_reference() {
        let heads = Heads {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 16,
        };
        for (batch, start, seq) in [(1, 0, 150), (1, 37, 70), (1, 200, 1), (2, 5, 66)] {
            let total = start + seq;
            let queries = random([batch, seq, 6 * 16]) * 0.25;
            let cache = |t: Tensor<FlexBackend, 3>| t.narrow(1, 0, total);
            let keys = cache(random([batch, total + 9, 2 * 16]));
            let values = cache(random([batch, total + 9, 2 * 16]));
            let reference =
                reference_attention(queries.clone(), keys.clone(), values.clone(), heads);
            let fused = FlexBackend::causal_attention(queries, keys, values, heads);
            assert_close(fused, reference);
        }
    }

    #[test]
    fn fused_silu_mul_matches_the_reference() {
        for len in [10, 1 << 15] {
            let (gate, up) = (random([1, 2, len]) * 4.0, random([1, 2, len]));
            let reference = silu(gate.clone()) * up.clone();
            assert_close(FlexBackend::silu_mul(gate, up), reference);
        }
    }
}
