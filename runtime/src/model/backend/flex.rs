//! burn-flex's overrides: each operation on the tensors' own buffers, through the slice
//! kernels of [`kernels`].
//!
//! Why: composed from Burn ops, a prefill spent much of its time outside the matrix
//! products. Attention materialised every head's full score matrix (half of it masked),
//! exponentiated all of it with scalar libm calls on one thread, and copied queries, keys,
//! values and the output between token-major and head-major layouts; SiLU and RMSNorm were
//! chains of scalar single-threaded passes. Decoding, a matrix-vector product per weight,
//! ran each product on one thread through gemm. docs/BENCHMARKS.md has what each bought.

use std::sync::Arc;

use burn::tensor::{Bytes, DType, Int, Shape, Tensor, TensorData, TensorPrimitive, bf16};
use burn_flex::{FlexTensor, Layout};
use kernels::attention::{CausalAttention, Heads, Matrix};
use kernels::int8::Matmul;
use kernels::layer::{self, Activation, KvSlot, LayerShape};
use kernels::matvec::{self, Rows};
use kernels::quant::BlockType;
use kernels::simd;
use kernels::stored::Stored;
use kernels::team;
use kernels::{dpbf16, int8, linear};
use rayon::prelude::*;

use super::{KernelBackend, KvBuffers, KvDtype, LayerTensors, aligned, reference, take};
use crate::FlexBackend;
use crate::model::rope::RopeRows;

/// Runs `$body` with `$stored` the element type of a KV cache buffer of dtype `$dtype`
/// (see [`FlexBackend::kv_buffer`]).
macro_rules! with_stored {
    ($dtype:expr, $stored:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $stored = f32;
                $body
            }
            DType::F16 => {
                type $stored = half::f16;
                $body
            }
            DType::BF16 => {
                type $stored = half::bf16;
                $body
            }
            other => panic!("a KV cache buffer of {other:?}"),
        }
    };
}

/// Input rows up to which a product runs on the matrix-vector kernels (one pass over the
/// weight for all the rows, each row summed as alone) rather than gemm: decoding that many
/// sequences together (`Llama::decode_each`), or a short prompt, which gemm would first
/// need every bf16 weight widened to f32 for (a copy of all the weights per call).
pub const MATVEC_ROWS: usize = 16;

impl KernelBackend for FlexBackend {
    /// The matrix-vector kernels read bf16 rows and widen them in registers; products of
    /// more rows widen a bf16 weight into an f32 copy for gemm (`linear_forward`).
    const BF16_WEIGHTS: bool = true;

    const DECODE_BATCH: usize = MATVEC_ROWS;

    /// Every kernel over weights reads blocks where they lie (`matvec_rows`).
    const BLOCK_WEIGHTS: bool = true;

    fn blocks_matrix(
        ty: BlockType,
        bytes: Bytes,
        [d_in, d_out]: [usize; 2],
        _device: &Self::Device,
    ) -> Tensor<Self, 2> {
        Tensor::from_primitive(TensorPrimitive::Float(blocks_tensor(
            ty, bytes, d_in, d_out,
        )))
    }

    /// An embedding kept as blocks (its transpose a [`blocks_tensor`]: the tied lm_head's
    /// orientation) has its rows decoded; any other takes Burn's row lookup.
    fn embed(weight: Tensor<Self, 2>, tokens: Tensor<Self, 2, Int>) -> Tensor<Self, 3> {
        let [batch, seq] = tokens.dims();
        let table = flex(weight.clone().transpose());
        let Some(Rows::Blocks(ty, bytes)) = matvec_rows(&table) else {
            return burn::tensor::module::embedding(weight, tokens);
        };
        let [vocab, hidden] = weight.dims();
        let row_bytes = bytes.len() / vocab.max(1);
        let ids = tokens.into_data().convert::<i64>();
        let ids = ids.as_slice::<i64>().expect("converted to i64");
        let mut out = vec![0.0f32; ids.len() * hidden];
        for (row, &id) in out.chunks_exact_mut(hidden).zip(ids) {
            let id = usize::try_from(id).ok().filter(|&id| id < vocab);
            // Burn's lookup would panic on an id past the table: so does this, naming it.
            let id = id.unwrap_or_else(|| panic!("token id outside the vocabulary of {vocab}"));
            kernels::bundles::decode_blocks(ty, &bytes[id * row_bytes..][..row_bytes], row);
        }
        from_values(out, [batch, seq, hidden])
    }

    /// Keeps the pool's other threads spinning for the token: see `kernels::team`.
    fn decode_token<R>(work: impl FnOnce() -> R) -> R {
        team::with_team(work)
    }

    /// See `kernels::layer`: the layer's small operations between its products without Burn
    /// ops' set-up, and one pass over its weights for every sequence of a batch. Needs every
    /// projection stored column-major (`Llama::with_matvec_layout`) and every cache of one
    /// sequence and one type.
    fn decode_layer(
        x: &Tensor<Self, 3>,
        weights: &LayerTensors<Self>,
        shape: LayerShape,
        caches: Vec<KvBuffers<'_, Self>>,
        ropes: &[RopeRows<Self>],
    ) -> Option<Tensor<Self, 3>> {
        let [n, 1, _] = x.dims() else {
            return None;
        };
        let dtype = caches.first()?.keys.dtype();
        let fits = |c: &KvBuffers<'_, Self>| {
            matches!(c.keys.dims(), [1, _, _])
                && c.rows > 0
                && c.keys.dtype() == dtype
                && c.values.dtype() == dtype
        };
        let rows: usize = caches.iter().map(|c| c.rows).sum();
        if n != rows || caches.len() != ropes.len() || !caches.iter().all(fits) {
            return None;
        }
        let weights = weights.try_map(
            |gamma| Some(flex(gamma.clone()).to_contiguous()),
            |weight| {
                let weight = flex(weight.clone());
                matvec_rows(&weight).is_some().then_some(weight)
            },
        )?;
        let slices = weights.try_map(|gamma| Some(gamma.storage()), matvec_rows)?;
        let tables: Vec<(FlexTensor, FlexTensor)> = (ropes.iter())
            .map(|rope| (contiguous(&rope.cos), contiguous(&rope.sin)))
            .collect();
        // A (cos, sin) pair of rows for each row of x: a sequence's table has one per row.
        let rope: Vec<(&[f32], &[f32])> = (tables.iter().zip(&caches))
            .flat_map(|((cos, sin), cache)| {
                let (cos, sin): (&[f32], &[f32]) = (cos.storage(), sin.storage());
                let width = cos.len() / cache.rows;
                cos.chunks_exact(width).zip(sin.chunks_exact(width))
            })
            .collect();
        // Owned, contiguous (the cache allocates them so) and not shared: written in place.
        let mut caches = caches;
        let mut buffers: Vec<(FlexTensor, FlexTensor, usize, usize)> = (caches.iter_mut())
            .map(|c| {
                let (keys, values) = (flex(take(&mut *c.keys)), flex(take(&mut *c.values)));
                (
                    keys.to_contiguous(),
                    values.to_contiguous(),
                    c.position,
                    c.rows,
                )
            })
            .collect();
        let mut out = flex(x.clone()).to_contiguous();
        with_stored!(dtype, S => {
            let slots = buffers
                .iter_mut()
                .map(|(keys, values, position, rows)| KvSlot {
                    keys: keys.storage_mut(),
                    values: values.storage_mut(),
                    position: *position,
                    rows: *rows,
                })
                .collect();
            layer::decode_layer::<S>(out.storage_mut(), &slices, shape, slots, &rope)
        });
        for (cache, (keys, values, ..)) in caches.into_iter().zip(buffers) {
            *cache.keys = from_flex(keys);
            *cache.values = from_flex(values);
        }
        Some(from_flex(out))
    }

    /// A buffer of `dtype` itself (an f16 or bf16 cache is half the bytes to read), starting
    /// on a cache line ([`aligned`]).
    fn kv_buffer(shape: [usize; 3], dtype: KvDtype, _device: &Self::Device) -> Tensor<Self, 3> {
        let dtype = match dtype {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Bf16 => DType::BF16,
        };
        let bytes = aligned::zeroed_bytes(shape.iter().product::<usize>() * dtype.size());
        let layout = Layout::contiguous(Shape::from(shape));
        from_flex(FlexTensor::new(bytes, layout, dtype))
    }

    /// A fresh [`Self::kv_buffer`] and the kept positions' bytes copied into it (a
    /// concatenation would put them in the allocator's memory, off the cache line).
    fn kv_resize(
        buffer: &Tensor<Self, 3>,
        keep: usize,
        rows: usize,
        dtype: KvDtype,
    ) -> Tensor<Self, 3> {
        let [batch, capacity, width] = buffer.dims();
        assert!(keep <= capacity.min(rows), "kv_resize: {keep} rows kept");
        let mut fresh = flex(Self::kv_buffer(
            [batch, rows, width],
            dtype,
            &Default::default(),
        ));
        if keep > 0 {
            let old = contiguous(buffer);
            assert_eq!(old.dtype(), fresh.dtype(), "kv_resize: the cache's dtype");
            with_stored!(old.dtype(), S => {
                let from = old.storage::<S>().chunks_exact(capacity * width);
                let to = fresh.storage_mut::<S>().chunks_exact_mut(rows * width);
                for (from, to) in from.zip(to) {
                    to[..keep * width].copy_from_slice(&from[..keep * width]);
                }
            });
        }
        from_flex(fresh)
    }

    fn causal_attention(
        queries: Tensor<Self, 3>,
        keys: Tensor<Self, 3>,
        values: Tensor<Self, 3>,
        heads: Heads,
        window: Option<usize>,
    ) -> Tensor<Self, 3> {
        let [batch, seq, width] = queries.dims();
        let total = keys.dims()[1];
        let (queries, keys, values) = (row_major(queries), row_major(keys), row_major(values));
        let queries = matrix(&queries).expect("row_major gives contiguous rows");
        let start = total - seq;
        let out = if seq > 1 && keys.dtype() == DType::F32 {
            // An f32 cache's prefix is read where it lies, with no copy.
            let view = |t| matrix::<f32>(t).expect("row_major gives contiguous rows");
            let (keys, values) = (view(&keys), view(&values));
            CausalAttention {
                queries,
                keys,
                values,
                batch,
                seq,
                start,
                heads,
                window,
            }
            .run()
        } else {
            with_stored!(keys.dtype(), S => {
                let view = |t| matrix::<S>(t).expect("row_major gives contiguous rows");
                let (keys, values) = (view(&keys), view(&values));
                if seq == 1 {
                    CausalAttention { queries, keys, values, batch, seq, start, heads, window }.decode()
                } else {
                    // A prompt's blocks go through gemm, on f32: keys and values stored narrower
                    // are widened first, a small copy beside the products over them.
                    let kv_width = heads.n_kv_heads * heads.head_dim;
                    let (keys, values) = (
                        keys.widened(batch, total, kv_width),
                        values.widened(batch, total, kv_width),
                    );
                    let (keys, values) = (
                        Matrix::packed(&keys, total, kv_width),
                        Matrix::packed(&values, total, kv_width),
                    );
                    CausalAttention { queries, keys, values, batch, seq, start, heads, window }.run()
                }
            })
        };
        from_values(out, [batch, seq, width])
    }

    fn glu(gate: Tensor<Self, 3>, up: Tensor<Self, 3>, activation: Activation) -> Tensor<Self, 3> {
        assert_eq!(gate.dims(), up.dims(), "glu: gate and up shapes differ");
        let kernel = match activation {
            Activation::Silu => simd::silu_mul,
            Activation::GeluTanh => simd::gelu_tanh_mul,
        };
        let up = flex(up).to_contiguous();
        let up: &[f32] = up.storage();
        // In place when the gate projection's output is not shared (it never is here).
        let mut gate = flex(gate).to_contiguous();
        let out: &mut [f32] = gate.storage_mut();
        const CHUNK: usize = 1 << 14;
        if out.len() <= CHUNK {
            kernel(out, up);
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(up.par_chunks(CHUNK))
                .for_each(|(g, u)| kernel(g, u));
        }
        from_flex(gate)
    }

    /// One pass per row instead of Burn's six tensor ops (square, mean, add, sqrt, divide,
    /// scale), 61 times per decoded token.
    fn rms_norm(x: Tensor<Self, 3>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 3> {
        let [batch, seq, width] = x.dims();
        let gamma = flex(gamma).to_contiguous();
        let gamma: &[f32] = gamma.storage();
        assert_eq!(
            gamma.len(),
            width,
            "rms_norm: gamma and rows differ in width"
        );
        let x = flex(x).to_contiguous();
        let x: &[f32] = x.storage();
        let mut out = vec![0.0f32; x.len()];
        let epsilon = epsilon as f32;
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
    fn rotary(x: Tensor<Self, 3>, rope: &RopeRows<Self>, scale: f32) -> Tensor<Self, 3> {
        let [_, seq, width] = x.dims();
        let [_, head_dim] = rope.cos.dims();
        for table in [&rope.cos, &rope.sin] {
            assert_eq!(
                table.dims(),
                [seq, head_dim],
                "rotary: a table is not [seq, head_dim]"
            );
        }
        assert!(
            head_dim % 2 == 0 && width % head_dim == 0,
            "rotary: {width} columns are not whole heads of {head_dim}"
        );
        let (cos, sin) = (contiguous(&rope.cos), contiguous(&rope.sin));
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
    fn write_rows(
        buffer: &mut Tensor<Self, 3>,
        start: usize,
        rows: Tensor<Self, 3>,
        _dtype: KvDtype,
    ) {
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
        // The cache's buffers are contiguous and not shared: no copy.
        let mut owned = flex(take(buffer)).to_contiguous();
        let rows = flex(rows).to_contiguous();
        let rows: &[f32] = rows.storage();
        with_stored!(owned.dtype(), S => {
            let dst: &mut [S] = owned.storage_mut();
            for (b, rows) in rows.chunks_exact(seq * width).enumerate() {
                let at = (b * capacity + start) * width;
                for (to, &x) in dst[at..at + rows.len()].iter_mut().zip(rows) {
                    *to = S::narrow(x);
                }
            }
        });
        *buffer = from_flex(owned);
    }

    fn linear_forward<const N: usize>(
        x: Tensor<Self, 3>,
        weights: [Tensor<Self, 2>; N],
        matmul: Matmul,
    ) -> [Tensor<Self, 3>; N] {
        let [batch, seq, _] = x.dims();
        let weights = weights.map(|weight| weight.into_primitive().tensor());
        let rows: Option<Vec<Rows>> = weights.iter().map(matvec_rows).collect();
        if let Some(rows) = rows {
            let x = flex(x).to_contiguous();
            let x: &[f32] = x.storage();
            let d_in = x.len() / (batch * seq).max(1);
            let outs: Vec<Vec<f32>> = if batch * seq <= MATVEC_ROWS {
                matvec::matvecs(&rows, x, d_in, matmul)
            } else {
                // Rounded once for the weights that take the same rounding (q, k, v).
                let prompt = int8::rows::Prompt::new(x, d_in);
                rows.iter()
                    .map(|&w| match w {
                        Rows::Blocks(ty, blocks)
                            if matmul.rounds_inputs() && int8::rows::runs(ty, d_in) =>
                        {
                            prompt.linear(ty, blocks)
                        }
                        Rows::Bf16(weight) if matmul.rounds_to_bf16() && dpbf16::runs() => {
                            dpbf16::linear_rows(x, weight, d_in)
                        }
                        w => linear::linear_rows(x, w, d_in),
                    })
                    .collect()
            };
            let mut outs = outs.into_iter().map(|out| {
                let d_out = out.len() / (batch * seq).max(1);
                from_values(out, [batch, seq, d_out])
            });
            return std::array::from_fn(|_| outs.next().expect("one output per weight"));
        }
        // gemm takes f32: a bf16 weight is widened into an f32 copy of the same layout, so
        // the product is the one its f32 values give.
        weights.map(|weight| {
            reference::linear(
                x.clone(),
                Tensor::from_primitive(TensorPrimitive::Float(widened(weight))),
            )
        })
    }
}

/// `weight` as f32: itself, or a bf16 weight's values widened into a buffer laid out as its
/// own (same strides and offset), so gemm sees what it sees for the f32 weight.
fn widened(weight: FlexTensor) -> FlexTensor {
    if weight.dtype() != DType::BF16 {
        return weight;
    }
    let values: Vec<f32> = (weight.storage::<bf16>().par_iter())
        .map(|w| w.widen())
        .collect();
    FlexTensor::from_arc(
        Arc::new(Bytes::from_elems(values)),
        weight.layout().clone(),
        DType::F32,
    )
}

/// The weight `[d_in, d_out]` as `d_out` contiguous rows of `d_in`, the layout the
/// matrix-vector kernel reads, if it is stored column-major (`Llama::with_matvec_layout`),
/// in f32 or bf16, or as blocks ([`blocks_tensor`]).
fn matvec_rows(weight: &FlexTensor) -> Option<Rows<'_>> {
    let layout = weight.layout();
    let shape = layout.shape();
    if shape.num_dims() != 2 {
        return None;
    }
    let (d_in, d_out) = (shape[0], shape[1]);
    if let [0, row_bytes] = *layout.strides() {
        return blocks_rows(weight, d_in, d_out, row_bytes as usize);
    }
    if *layout.strides() != [1, d_in as isize] {
        return None;
    }
    let range = layout.start_offset()..layout.start_offset() + d_in * d_out;
    match weight.dtype() {
        DType::F32 => weight.storage().get(range).map(Rows::F32),
        DType::BF16 => weight.storage().get(range).map(Rows::Bf16),
        _ => None,
    }
}

/// A `[d_in, d_out]` weight kept as `d_out` rows of `ty` blocks (`bytes`, row after row) as a
/// burn-flex tensor: bytes (u8 for the types of 32-value blocks, i8 for the K-quants' 256)
/// seen as `[d_in, d_out]` with strides `[0, row bytes]`. Its type is the one of its family
/// whose rows of `d_in` take that many bytes (unique within each family), which
/// [`blocks_rows`] reads back. A Burn operation on it would see each row's first byte
/// repeated (never out of bounds); none is run on it, as every product reads
/// [`matvec_rows`].
fn blocks_tensor(ty: BlockType, bytes: Bytes, d_in: usize, d_out: usize) -> FlexTensor {
    let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
    assert_eq!(
        bytes.len(),
        row_bytes * d_out,
        "{ty} blocks of {d_out} rows"
    );
    let dtype = if ty.values() == 32 {
        DType::U8
    } else {
        DType::I8
    };
    let layout = Layout::new(Shape::from([d_in, d_out]), vec![0, row_bytes as isize], 0);
    FlexTensor::new(bytes, layout, dtype)
}

/// The rows of a weight made by [`blocks_tensor`].
fn blocks_rows(
    weight: &FlexTensor,
    d_in: usize,
    d_out: usize,
    row_bytes: usize,
) -> Option<Rows<'_>> {
    let values = match weight.dtype() {
        DType::U8 => 32,
        DType::I8 => 256,
        _ => return None,
    };
    let ty = (BlockType::KEPT.into_iter())
        .find(|ty| ty.values() == values && ty.row_bytes(d_in) == Some(row_bytes))?;
    let bytes = weight.bytes().get(..row_bytes * d_out)?;
    Some(Rows::Blocks(ty, bytes))
}

fn flex<const D: usize>(tensor: Tensor<FlexBackend, D>) -> FlexTensor {
    tensor.into_primitive().tensor()
}

fn contiguous<const D: usize>(tensor: &Tensor<FlexBackend, D>) -> FlexTensor {
    flex(tensor.clone()).to_contiguous()
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
    if matches!(*tensor.layout().strides(), [b, r, 1] if b >= 0 && r >= 0) {
        tensor
    } else {
        tensor.to_contiguous()
    }
}

/// A `[batch, rows, width]` burn-flex tensor of `S` values as a view of its buffer, if its
/// rows are contiguous.
fn matrix<S: Stored + burn::tensor::Element + bytemuck::Pod>(
    tensor: &FlexTensor,
) -> Option<Matrix<'_, S>> {
    let layout = tensor.layout();
    match *layout.strides() {
        [batch_stride, row_stride, 1] if batch_stride >= 0 && row_stride >= 0 => Some(Matrix {
            data: tensor.storage(),
            offset: layout.start_offset(),
            batch_stride: batch_stride as usize,
            row_stride: row_stride as usize,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::normal;

    /// The thread counts every kernel is checked at: one, the machine's two, and more
    /// threads than cores (more attention spans, shares of a product).
    const THREADS: [usize; 4] = [1, 2, 3, 5];

    /// Runs `check` in pools of each of `THREADS`, outside and inside a thread team.
    fn at_every_thread_count(check: impl Fn() + Sync) {
        for threads in THREADS {
            crate::in_thread_pool(Some(threads), || {
                check();
                team::with_team(&check);
            })
            .expect("a thread pool");
        }
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
        at_every_thread_count(attention_matches_the_reference);
    }

    fn attention_matches_the_reference() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
            attention_matches_the_reference_with(dtype);
        }
    }

    /// Keys and values of `dtype`, written by `write_rows` into a cache buffer: the fused
    /// kernel reads the buffer's prefix, the reference the same values rounded in f32.
    fn attention_matches_the_reference_with(dtype: KvDtype) {
        let heads = Heads {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 16,
        };
        // Sliding windows: shorter than a block of rows, longer than one, wider than the
        // cache; a decoded token's window crossing span boundaries.
        for (batch, start, seq, window) in [
            (1, 0, 150, None),
            (1, 37, 70, None),
            (2, 5, 66, None),
            (1, 0, 1, None),
            (1, 200, 1, None),
            (1, 300, 1, None),
            (2, 40, 1, None),
            (1, 0, 150, Some(24)),
            (1, 37, 70, Some(90)),
            (2, 5, 66, Some(500)),
            (1, 0, 1, Some(1)),
            (1, 200, 1, Some(70)),
            (2, 300, 1, Some(150)),
        ] {
            let total = start + seq;
            let seed = (batch * 1000 + start + seq) as u64;
            let queries = normal([batch, seq, 6 * 16], seed) * 0.25;
            let cache = |seed| {
                let rows = normal([batch, total, 2 * 16], seed);
                let shape = [batch, total + 9, 2 * 16];
                let mut buffer = FlexBackend::kv_buffer(shape, dtype, &Default::default());
                FlexBackend::write_rows(&mut buffer, 0, rows.clone(), dtype);
                (buffer.narrow(1, 0, total), reference::round(rows, dtype))
            };
            let ((keys, rounded_keys), (values, rounded_values)) =
                (cache(seed + 1), cache(seed + 2));
            let q = queries.clone();
            let reference = reference::attention(q, rounded_keys, rounded_values, heads, window);
            let fused = FlexBackend::causal_attention(queries, keys, values, heads, window);
            assert_close(fused, reference);
        }
    }

    /// Writes what `slice_assign` writes, into the buffer it was given (no copy of it).
    #[test]
    fn write_rows_matches_the_reference_in_place() {
        let buffer = normal([2, 10, 8], 1);
        let rows = normal([2, 3, 8], 2);
        let reference = reference::write_rows(buffer.clone(), 4, rows.clone());
        let address = |t: &Tensor<FlexBackend, 3>| {
            let tensor = flex(t.clone());
            let storage: &[f32] = tensor.storage();
            storage.as_ptr()
        };
        let mut buffer = buffer + 0.0; // a fresh buffer with one handle, as the cache's is
        let before = address(&buffer);
        FlexBackend::write_rows(&mut buffer, 4, rows, KvDtype::F32);
        assert_eq!(address(&buffer), before, "the buffer was copied");
        assert_close(buffer, reference);
    }

    #[test]
    fn fused_rotary_matches_the_reference() {
        for (batch, seq, scale) in [(1, 1, 0.125), (2, 5, 1.0)] {
            let x = normal([batch, seq, 3 * 8], seq as u64);
            let rope = RopeRows {
                cos: normal([seq, 8], 10 + seq as u64),
                sin: normal([seq, 8], 20 + seq as u64),
            };
            let reference = reference::rotary(x.clone(), &rope, scale);
            assert_close(FlexBackend::rotary(x, &rope, scale), reference);
        }
    }

    /// The fused norm against burn-nn's `RmsNorm`, and the reference (ndarray's path) equal
    /// to it to the bit.
    #[test]
    fn fused_rms_norm_matches_the_reference() {
        at_every_thread_count(rms_norm_matches_the_reference);
    }

    fn rms_norm_matches_the_reference() {
        let norm = burn::nn::RmsNormConfig::new(40)
            .with_epsilon(1e-5)
            .init::<FlexBackend>(&Default::default());
        let norm = burn::nn::RmsNorm {
            gamma: norm.gamma.map(|_| normal([40], 3)),
            ..norm
        };
        for rows in [1, 100] {
            let x = normal([1, rows, 40], rows as u64) * 3.0;
            let burn_nn = norm.forward(x.clone());
            let reference = reference::rms_norm(x.clone(), norm.gamma.val(), norm.epsilon);
            assert_eq!(reference.into_data(), burn_nn.clone().into_data());
            let fused = FlexBackend::rms_norm(x, norm.gamma.val(), norm.epsilon);
            assert_close(fused, burn_nn);
        }
    }

    #[test]
    fn fused_glu_matches_the_reference() {
        at_every_thread_count(glu_matches_the_reference);
    }

    fn glu_matches_the_reference() {
        for activation in [Activation::Silu, Activation::GeluTanh] {
            for len in [10, 1 << 15] {
                let seed = len as u64;
                let (gate, up) = (
                    normal([1, 2, len], seed) * 4.0,
                    normal([1, 2, len], seed + 1),
                );
                let reference = reference::glu(gate.clone(), up.clone(), activation);
                assert_close(FlexBackend::glu(gate, up, activation), reference);
            }
        }
    }
}
