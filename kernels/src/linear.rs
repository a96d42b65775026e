//! Products of many rows (a prompt) with a weight stored as [`Rows`]: on AVX-512,
//! [`super::panels`], which reads the weight where it lies; elsewhere gemm on f32, a bf16
//! weight widened a block of outputs at a time into a scratch buffer that is reused. Also
//! the kernels' one call into gemm ([`product`], which attention's blocks use too).
//!
//! f32 and bf16 weights take the same path, block by block with the same gemm calls, so a
//! bf16 weight's products are those of its f32 values to the bit. Widening a whole weight
//! per call instead (a fresh f32 copy for Burn's matmul) made prefill on a 1B model two
//! times slower: page faults on every fresh 67 MB copy.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::matvec::Rows;
use crate::stored::Stored;

/// Most weight values widened at once: 32 MB of f32, whatever the model's size.
const BLOCK_VALUES: usize = 8 << 20;

/// Below this many multiply-adds gemm runs on the calling thread.
const PARALLEL_WORK: usize = 1 << 21;

/// `x` (`rows` rows of `d_in`) times the weight whose `d_out` rows of `d_in` are `weight`
/// (a `[d_in, d_out]` weight stored column-major): `rows` rows of `d_out`.
pub fn linear_rows(x: &[f32], weight: Rows<'_>, d_in: usize) -> Vec<f32> {
    if super::panels::available() {
        return super::panels::linear_rows(x, weight, d_in);
    }
    in_blocks(x, weight, d_in, BLOCK_VALUES)
}

/// [`linear_rows`], widening at most `block_values` weight values at a time.
fn in_blocks(x: &[f32], weight: Rows<'_>, d_in: usize, block_values: usize) -> Vec<f32> {
    assert!(d_in > 0 && x.len().is_multiple_of(d_in) && weight.len().is_multiple_of(d_in));
    let (rows, d_out) = (x.len() / d_in, weight.len() / d_in);
    let mut out = vec![0.0f32; rows * d_out];
    let block = (block_values / d_in).max(1);
    for first in (0..d_out).step_by(block) {
        let n = block.min(d_out - first);
        let values = first * d_in..(first + n) * d_in;
        match weight {
            Rows::F32(w) => rows_product(x, &w[values], &mut out, [rows, n, d_in], first, d_out),
            Rows::Bf16(w) => SCRATCH.with_borrow_mut(|scratch| {
                scratch.resize(values.len(), 0.0);
                (scratch.par_chunks_mut(1 << 16))
                    .zip(w[values].par_chunks(1 << 16))
                    .for_each(|(out, w)| {
                        for (o, w) in out.iter_mut().zip(w) {
                            *o = w.widen();
                        }
                    });
                rows_product(x, scratch, &mut out, [rows, n, d_in], first, d_out)
            }),
            Rows::Blocks(ty, w) => SCRATCH.with_borrow_mut(|scratch| {
                let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
                scratch.resize(values.len(), 0.0);
                (scratch.par_chunks_mut(d_in))
                    .zip(w[first * row_bytes..(first + n) * row_bytes].par_chunks(row_bytes))
                    .for_each(|(out, w)| crate::bundles::decode_blocks(ty, w, out));
                rows_product(x, scratch, &mut out, [rows, n, d_in], first, d_out)
            }),
        }
    }
    out
}

/// `out[r, first + j] = x[r] · w[j]` for the `n` rows of `k` in `w`; `out` rows are
/// `out_width` wide.
fn rows_product(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    [m, n, k]: [usize; 3],
    first: usize,
    out_width: usize,
) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= (m - 1) * out_width + first + n);
    let parallelism = if m * n * k >= PARALLEL_WORK {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the assert above keeps every element the strides below reach inside the
    // three slices; `out` is a distinct, exclusively borrowed buffer. `w` holds row j of
    // the weight contiguously: the rhs (k × n) has row stride 1 and column stride k.
    unsafe {
        product(
            [m, n, k],
            (out[first..].as_mut_ptr(), out_width),
            (x.as_ptr(), k, 1),
            (w.as_ptr(), 1, k),
            parallelism,
        );
    }
}

/// `dst = lhs · rhs` through gemm, for `[m, n, k]`: an `m × k` lhs and a `k × n` rhs, each
/// given as (pointer, row stride, column stride), into a row-major `dst` given as (pointer,
/// row stride), split across threads as `parallelism` says.
///
/// # Safety
/// Every element of the three matrices those pointers and strides describe must lie inside
/// one live allocation, and `dst` must not overlap the others.
pub(super) unsafe fn product(
    [m, n, k]: [usize; 3],
    (dst, dst_row_stride): (*mut f32, usize),
    (lhs, lhs_row_stride, lhs_column_stride): (*const f32, usize, usize),
    (rhs, rhs_row_stride, rhs_column_stride): (*const f32, usize, usize),
    parallelism: gemm::Parallelism,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_row_stride as isize,
            false, // dst is overwritten, not read
            lhs,
            lhs_column_stride as isize,
            lhs_row_stride as isize,
            rhs,
            rhs_column_stride as isize,
            rhs_row_stride as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

thread_local! {
    /// The calling thread's widened block of a bf16 weight, reused across calls.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition on small integers (exact in any order), with several blocks; and a
    /// bf16 weight gives what its f32 values give, bit for bit, on random values.
    #[test]
    fn rows_times_weight() {
        let (rows, d_in, d_out) = (5, 48, 70);
        let x: Vec<f32> = (0..rows * d_in).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..d_out * d_in).map(|i| (i % 11) as f32 - 5.0).collect();
        // Blocks of 16 outputs: 4 whole blocks and a partial one.
        let out = in_blocks(&x, Rows::F32(&w), d_in, 16 * d_in);
        assert!(out == linear_rows(&x, Rows::F32(&w), d_in));
        for r in 0..rows {
            for j in 0..d_out {
                let want: f32 = (0..d_in).map(|i| x[r * d_in + i] * w[j * d_in + i]).sum();
                assert_eq!(out[r * d_out + j], want);
            }
        }
        let mut state = 7u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let (rows, d_in, d_out) = (37, 576, 300);
        let x: Vec<f32> = (0..rows * d_in).map(|_| next()).collect();
        let bf16: Vec<half::bf16> = (0..d_out * d_in)
            .map(|_| half::bf16::from_f32(next()))
            .collect();
        let f32s: Vec<f32> = bf16.iter().map(|w| w.to_f32()).collect();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        for block in [100 * d_in, BLOCK_VALUES] {
            assert!(
                bits(in_blocks(&x, Rows::Bf16(&bf16), d_in, block))
                    == bits(in_blocks(&x, Rows::F32(&f32s), d_in, block))
            );
        }
    }
}
