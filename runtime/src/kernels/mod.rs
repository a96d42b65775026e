//! Fused CPU kernels, added to Burn backends the way Burn extends a backend with custom
//! kernels: a trait on the backend whose default methods compose ordinary tensor ops, and
//! an override for a backend whose buffers the kernel can read directly.
//!
//! Why: a 512-token prefill on burn-flex spent about 45% of its time outside the matrix
//! products. Attention composed from tensor ops materialised every head's full score
//! matrix (half of it masked), exponentiated all of it with scalar libm calls on one
//! thread, and copied queries, keys, values and the output between token-major and
//! head-major layouts; SiLU was another scalar single-threaded pass. Decoding, a
//! matrix-vector product per weight, ran each product on one thread through gemm. The
//! burn-flex overrides below do each in one parallel, vectorized pass. burn-ndarray, kept for
//! comparison, uses the defaults, which also serve as the reference the tests hold the
//! fused kernels to.

mod attention;
mod decode;
mod matvec;
mod simd;
mod team;

use burn::nn::RmsNorm;
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use crate::cache::LayerCache;
use crate::model::DecoderLayer;
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

impl Heads {
    /// Attention's score scale, `1/sqrt(head_dim)`, which RoPE applies to the queries.
    pub fn score_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
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

    /// `norm.forward(x)` for `x: [batch, seq, hidden]`.
    fn rms_norm(norm: &RmsNorm<Self>, x: Tensor<Self, 3>) -> Tensor<Self, 3> {
        norm.forward(x)
    }

    /// Bias-free linear layers of one input: `x: [batch, seq, d_in]` times each
    /// `weights[i]: [d_in, d_out_i]`. Taking the layers that share an input together (q, k,
    /// v; gate, up) lets a backend split all their work across threads in one go.
    fn linear_forward<const N: usize>(
        x: Tensor<Self, 3>,
        weights: [Tensor<Self, 2>; N],
    ) -> [Tensor<Self, 3>; N] {
        weights.map(|weight| reference_linear(x.clone(), weight))
    }

    /// Rotary position embedding in transformers' `rotate_half` layout, then a scale:
    /// `(x * cos + rotate_half(x) * sin) * scale` for every head of
    /// `x: [batch, seq, heads * head_dim]`, with `cos`, `sin`: `[seq, head_dim]`, the tables'
    /// rows for these positions. Queries take attention's `1/sqrt(head_dim)` here.
    fn rotary(
        x: Tensor<Self, 3>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        scale: f32,
    ) -> Tensor<Self, 3> {
        reference_rotary(x, cos, sin, scale)
    }

    /// `buffer: [batch, capacity, width]` with `rows: [batch, seq, width]` written over its
    /// positions `start..start + seq`: how the KV cache appends.
    fn write_rows(buffer: Tensor<Self, 3>, start: usize, rows: Tensor<Self, 3>) -> Tensor<Self, 3> {
        reference_write_rows(buffer, start, rows)
    }

    /// `layer`'s forward pass for one token, `x: [1, 1, hidden]`, as one fused kernel if the
    /// backend has one for these inputs; `None` runs the composed ops. `cos`, `sin` are the
    /// rotary tables' rows for the token's position, `[1, head_dim]`.
    fn decode_layer(
        _layer: &DecoderLayer<Self>,
        _x: &Tensor<Self, 3>,
        _cache: &mut LayerCache<Self>,
        _cos: &Tensor<Self, 2>,
        _sin: &Tensor<Self, 2>,
    ) -> Option<Tensor<Self, 3>> {
        None
    }

    /// Runs `work`, the forward pass of one decoded token: a burst of small parallel
    /// regions that a backend may want to run on threads kept ready.
    fn decode_step<R>(work: impl FnOnce() -> R) -> R {
        work()
    }
}

impl Kernels for NdArrayBackend {}

impl Kernels for FlexBackend {
    /// Keeps the pool's other threads spinning for the step: see `team`.
    fn decode_step<R>(work: impl FnOnce() -> R) -> R {
        team::with_team(work)
    }

    /// See `decode`: the layer's small steps between its products without Burn ops' set-up.
    fn decode_layer(
        layer: &DecoderLayer<Self>,
        x: &Tensor<Self, 3>,
        cache: &mut LayerCache<Self>,
        cos: &Tensor<Self, 2>,
        sin: &Tensor<Self, 2>,
    ) -> Option<Tensor<Self, 3>> {
        decode::decode_layer(layer, x, cache, cos, sin)
    }

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
        from_values(out, [batch, seq, width])
    }

    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Tensor<Self, 3> {
        assert_eq!(
            gate.dims(),
            up.dims(),
            "silu_mul: gate and up shapes differ"
        );
        let up = flex(up).to_contiguous();
        let up: &[f32] = up.storage();
        // In place when the gate projection's output is not shared (it never is here).
        let mut gate = flex(gate).to_contiguous();
        let out: &mut [f32] = gate.storage_mut();
        const CHUNK: usize = 1 << 14;
        if out.len() <= CHUNK {
            simd::silu_mul(out, up);
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(up.par_chunks(CHUNK))
                .for_each(|(g, u)| simd::silu_mul(g, u));
        }
        from_flex(gate)
    }

    /// One pass per row instead of Burn's six tensor ops (square, mean, add, sqrt, divide,
    /// scale), 61 times per decoded token.
    fn rms_norm(norm: &RmsNorm<Self>, x: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let [batch, seq, width] = x.dims();
        let gamma = norm.gamma.val().into_primitive().tensor().to_contiguous();
        let gamma: &[f32] = gamma.storage();
        assert_eq!(
            gamma.len(),
            width,
            "rms_norm: gamma and rows differ in width"
        );
        let x = flex(x).to_contiguous();
        let x: &[f32] = x.storage();
        let mut out = vec![0.0f32; x.len()];
        let epsilon = norm.epsilon as f32;
        const ROWS: usize = 32;
        if batch * seq <= ROWS {
            simd::rms_norm_rows(x, gamma, epsilon, &mut out);
        } else {
            out.par_chunks_mut(ROWS * width)
                .zip(x.par_chunks(ROWS * width))
                .for_each(|(out, x)| simd::rms_norm_rows(x, gamma, epsilon, out));
        }
        from_values(out, [batch, seq, width])
    }

    /// One pass instead of Burn's five ops (a ±1 matmul for `rotate_half`, two products, a
    /// sum, the scale), twice per layer.
    fn rotary(
        x: Tensor<Self, 3>,
        cos: Tensor<Self, 2>,
        sin: Tensor<Self, 2>,
        scale: f32,
    ) -> Tensor<Self, 3> {
        let [_, seq, width] = x.dims();
        let [_, head_dim] = cos.dims();
        assert_eq!(
            cos.dims(),
            [seq, head_dim],
            "rotary: cos is not [seq, head_dim]"
        );
        assert_eq!(
            sin.dims(),
            [seq, head_dim],
            "rotary: sin is not [seq, head_dim]"
        );
        assert!(
            head_dim % 2 == 0 && width % head_dim == 0,
            "rotary: {width} columns are not whole heads of {head_dim}"
        );
        let table = |t: Tensor<Self, 2>| t.into_primitive().tensor().to_contiguous();
        let (cos, sin) = (table(cos), table(sin));
        let (cos, sin): (&[f32], &[f32]) = (cos.storage(), sin.storage());
        // In place when the projection's output is not shared (it never is here).
        let mut x = flex(x).to_contiguous();
        let rows: &mut [f32] = x.storage_mut();
        // Row i of x is position i % seq: the tables' rows repeat for every batch entry.
        let tables = cos
            .chunks_exact(head_dim)
            .zip(sin.chunks_exact(head_dim))
            .cycle();
        for (row, (cos, sin)) in rows.chunks_exact_mut(width).zip(tables) {
            simd::rotary_heads(row, cos, sin, scale);
        }
        from_flex(x)
    }

    /// In place, when this is the buffer's only handle (the KV cache's is). burn-flex 0.21's
    /// `slice_assign` copies the whole destination on every call even then
    /// (tracel-ai/burn#5575, fixed after 0.21): every layer's whole cache, every token.
    fn write_rows(buffer: Tensor<Self, 3>, start: usize, rows: Tensor<Self, 3>) -> Tensor<Self, 3> {
        let [batch, capacity, width] = buffer.dims();
        let [_, seq, _] = rows.dims();
        assert_eq!(
            rows.dims(),
            [batch, seq, width],
            "write_rows: rows and buffer differ"
        );
        assert!(
            start + seq <= capacity,
            "write_rows: {} rows past {capacity}",
            start + seq
        );
        let mut buffer = flex(buffer);
        if !buffer.is_contiguous() || buffer.layout().start_offset() != 0 {
            return reference_write_rows(from_flex(buffer), start, rows);
        }
        let rows = flex(rows).to_contiguous();
        let rows: &[f32] = rows.storage();
        let dst: &mut [f32] = buffer.storage_mut(); // copies only if the storage is shared
        for (b, rows) in rows.chunks_exact(seq * width).enumerate() {
            let at = (b * capacity + start) * width;
            dst[at..at + rows.len()].copy_from_slice(rows);
        }
        from_flex(buffer)
    }

    fn linear_forward<const N: usize>(
        x: Tensor<Self, 3>,
        weights: [Tensor<Self, 2>; N],
    ) -> [Tensor<Self, 3>; N] {
        let [batch, seq, _] = x.dims();
        let weights = weights.map(|weight| weight.into_primitive().tensor());
        let rows: Option<Vec<&[f32]>> = weights.iter().map(weight_rows).collect();
        if let (1, Some(rows)) = (batch * seq, rows) {
            let x = flex(x).to_contiguous();
            let mut outs = matvec::matvecs(&rows, x.storage()).into_iter().map(|out| {
                let d_out = out.len();
                from_values(out, [1, 1, d_out])
            });
            return std::array::from_fn(|_| outs.next().expect("one output per weight"));
        }
        weights.map(|weight| {
            reference_linear(
                x.clone(),
                Tensor::from_primitive(TensorPrimitive::Float(weight)),
            )
        })
    }
}

/// The weight `[d_in, d_out]` as `d_out` contiguous rows of `d_in`, if it is stored
/// column-major (as `Llama::with_matvec_layout` lays projections out).
fn weight_rows(weight: &FlexTensor) -> Option<&[f32]> {
    let layout = weight.layout();
    let shape = layout.shape();
    if shape.num_dims() != 2 {
        return None;
    }
    let (d_in, d_out) = (shape[0], shape[1]);
    if *layout.strides() != [1, d_in as isize] {
        return None;
    }
    let start = layout.start_offset();
    weight.storage().get(start..start + d_in * d_out)
}

fn flex(tensor: Tensor<FlexBackend, 3>) -> FlexTensor {
    tensor.into_primitive().tensor()
}

fn from_flex(tensor: FlexTensor) -> Tensor<FlexBackend, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor))
}

/// A kernel's output buffer as a burn-flex tensor, without copying it.
fn from_values(values: Vec<f32>, shape: [usize; 3]) -> Tensor<FlexBackend, 3> {
    from_flex(FlexTensor::from_data(TensorData::new(values, shape)))
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

/// [`Kernels::linear_forward`] as one 2-D matrix product (burn-flex's batched path handles a
/// column-major weight poorly).
pub fn reference_linear<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>) -> Tensor<B, 3> {
    let [batch, seq, d_in] = x.dims();
    let d_out = weight.dims()[1];
    x.reshape([batch * seq, d_in])
        .matmul(weight)
        .reshape([batch, seq, d_out])
}

/// [`Kernels::rotary`] from tensor ops, as transformers writes it.
pub fn reference_rotary<B: Backend>(
    x: Tensor<B, 3>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    scale: f32,
) -> Tensor<B, 3> {
    let [batch, seq, width] = x.dims();
    let [_, head_dim] = cos.dims();
    let half = head_dim / 2;
    let heads = x.reshape([batch, seq, width / head_dim, head_dim]);
    // rotate_half(x) = cat(-x[half..], x[..half])
    let rotated = Tensor::cat(
        vec![
            -heads.clone().narrow(3, half, half),
            heads.clone().narrow(3, 0, half),
        ],
        3,
    );
    let table = |t: Tensor<B, 2>| t.reshape([1, seq, 1, head_dim]);
    ((heads * table(cos) + rotated * table(sin)) * scale).reshape([batch, seq, width])
}

/// [`Kernels::write_rows`] as Burn's `slice_assign`.
pub fn reference_write_rows<B: Backend>(
    buffer: Tensor<B, 3>,
    start: usize,
    rows: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let [batch, seq, width] = rows.dims();
    buffer.slice_assign([0..batch, start..start + seq, 0..width], rows)
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
    /// cached positions (the mask's offset), batch 2, rows not a multiple of the block,
    /// keys/values that are a prefix view of a larger buffer, and decoded tokens: the first
    /// (one key), keys split across threads, more keys than one tile, batch 2.
    #[test]
    fn fused_attention_matches_the_reference() {
        let heads = Heads {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 16,
        };
        for (batch, start, seq) in [
            (1, 0, 150),
            (1, 37, 70),
            (2, 5, 66),
            (1, 0, 1),
            (1, 200, 1),
            (1, 300, 1),
            (2, 40, 1),
        ] {
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

    /// Writes what `slice_assign` writes, into the buffer it was given (no copy of it).
    #[test]
    fn write_rows_matches_the_reference_in_place() {
        let buffer = random([2, 10, 8]);
        let rows = random([2, 3, 8]);
        let reference = reference_write_rows(buffer.clone(), 4, rows.clone());
        let address = |t: &Tensor<FlexBackend, 3>| {
            let tensor = flex(t.clone());
            let storage: &[f32] = tensor.storage();
            storage.as_ptr()
        };
        let buffer = buffer + 0.0; // a fresh buffer with one handle, as the cache's is
        let before = address(&buffer);
        let written = FlexBackend::write_rows(buffer, 4, rows);
        assert_eq!(address(&written), before, "the buffer was copied");
        assert_close(written, reference);
    }

    #[test]
    fn fused_rotary_matches_the_reference() {
        let table =
            |shape| Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default());
        for (batch, seq, scale) in [(1, 1, 0.125), (2, 5, 1.0)] {
            let x = random([batch, seq, 3 * 8]);
            let (cos, sin): (Tensor<FlexBackend, 2>, _) = (table([seq, 8]), table([seq, 8]));
            let reference = reference_rotary(x.clone(), cos.clone(), sin.clone(), scale);
            assert_close(FlexBackend::rotary(x, cos, sin, scale), reference);
        }
    }

    #[test]
    fn fused_rms_norm_matches_the_reference() {
        let norm = burn::nn::RmsNormConfig::new(40)
            .with_epsilon(1e-5)
            .init::<FlexBackend>(&Default::default());
        let norm = RmsNorm {
            gamma: norm.gamma.map(|_| random([1, 1, 40]).reshape([40])),
            ..norm
        };
        for rows in [1, 100] {
            let x = random([1, rows, 40]) * 3.0;
            assert_close(FlexBackend::rms_norm(&norm, x.clone()), norm.forward(x));
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
