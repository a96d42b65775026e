//! Products of many rows (a prompt) with a weight, on AVX-512, reading the weight where it
//! lies: a panel of 32 outputs' weights for 256 inputs at a time is widened (bf16) and
//! transposed into a 32 KB buffer that stays in L1 while every row of the prompt passes
//! over it, twelve rows at a time, each output summed by FMAs in input order.
//!
//! Why not gemm on f32: gemm needs f32 weights, so a bf16 weight was first widened into an
//! f32 copy, all of it on every call, to be read once more by gemm's own packing. At 1B
//! that is about 5 GB written and read again per forward pass whatever the prompt length. Here a
//! weight value is read once per call and widened in cache.
//!
//! Every output is one chain of fused multiply-adds over its inputs in order, from zero:
//! `out[r][j] = fma(x[r][d_in-1], w[j][d_in-1], ... fma(x[r][0], w[j][0], 0))`. So a result
//! depends on nothing but its row and the weight's values: not on the weight's storage
//! (bf16 or f32), the rows beside it, the prompt's length or how it was split into pieces,
//! nor the thread count; the tests hold it to that definition bit for bit.

use std::cell::{Cell, RefCell};
use std::ops::Range;

use rayon::prelude::*;

use crate::matvec::Rows;
use crate::stored::Stored;
use crate::team::OutPtr;

/// Outputs per panel: two AVX-512 registers of f32.
const NR: usize = 32;
/// Rows per tile: 12 × 2 accumulators in registers, beside the two weight registers and a
/// broadcast: each weight load then feeds 12 FMAs (with 8 rows the kernel ran ~10% slower).
const MR: usize = 12;
/// Inputs per packed panel: NR × KC f32 is 32 KB, in L1 beside the rows of x read with it.
const KC: usize = 256;

/// Whether this CPU runs [`linear_rows`] (AVX-512F; FMA comes with it).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::tier() >= crate::cpu::Tier::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x` (`rows` rows of `d_in`) times the weight whose `d_out` rows of `d_in` are `weight`:
/// `rows` rows of `d_out`. Panics unless [`available`].
pub fn linear_rows(x: &[f32], weight: Rows<'_>, d_in: usize) -> Vec<f32> {
    assert!(available(), "panels::linear_rows needs AVX-512");
    assert!(d_in > 0 && x.len().is_multiple_of(d_in) && weight.len().is_multiple_of(d_in));
    let (rows, d_out) = (x.len() / d_in, weight.len() / d_in);
    let mut out = vec![0.0f32; rows * d_out];
    if rows == 0 || d_out == 0 {
        return out;
    }
    // Reused across calls (taken, so a call nested in this one's wait gets its own).
    let mut x_blocks = BLOCKED.take();
    blocked(x, rows, d_in, &mut x_blocks);
    let x = &x_blocks;
    let panels = d_out.div_ceil(NR);
    // Several tasks per thread, so that a core slowed for a while (a shared machine) hands
    // its last ones to the other instead of holding it up.
    let per_task = panels.div_ceil(4 * rayon::current_num_threads()).max(1);
    let tasks = panels.div_ceil(per_task);
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..tasks).into_par_iter().for_each(|task| {
        let panels = task * per_task..((task + 1) * per_task).min(panels);
        PACKED.with_borrow_mut(|buffer| {
            let packed = aligned(buffer, NR * KC);
            for first_input in (0..d_in).step_by(KC) {
                let inputs = first_input..(first_input + KC).min(d_in);
                // This block of every row, rows contiguous (see `blocked`).
                let x_block = &x[first_input * rows..][..inputs.len() * rows];
                for panel in panels.clone() {
                    let columns = panel * NR..((panel + 1) * NR).min(d_out);
                    match weight {
                        Rows::F32(w) => pack(w, d_in, columns.clone(), inputs.clone(), packed),
                        Rows::Bf16(w) => pack(w, d_in, columns.clone(), inputs.clone(), packed),
                        Rows::Blocks(ty, w) => DECODED.with_borrow_mut(|decoded| {
                            // The panel's pieces of rows decoded (exactly), then packed as f32.
                            let (n, kc) = (columns.len(), inputs.len());
                            decoded.resize(NR * KC, 0.0);
                            let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
                            let from = inputs.start / ty.values() * ty.bytes();
                            let piece = kc / ty.values() * ty.bytes();
                            for (j, out) in decoded.chunks_exact_mut(kc).take(n).enumerate() {
                                let row = (columns.start + j) * row_bytes + from;
                                crate::bundles::decode_blocks(ty, &w[row..row + piece], out);
                            }
                            pack(&decoded[..n * kc], kc, 0..n, 0..kc, packed)
                        }),
                    }
                    // The next panel's weights, fetched into L2 a few lines per tile while
                    // this one computes: its 32 short pieces of rows far apart are not
                    // streams the hardware prefetcher follows, and the packing would
                    // otherwise wait on memory for each (a model's weights are not in cache).
                    let next = if panel + 1 < panels.end {
                        Some((
                            (panel + 1) * NR..((panel + 2) * NR).min(d_out),
                            inputs.clone(),
                        ))
                    } else if inputs.end < d_in {
                        let first = panels.start * NR;
                        Some((
                            first..(first + NR).min(d_out),
                            inputs.end..(inputs.end + KC).min(d_in),
                        ))
                    } else {
                        None
                    };
                    let ahead =
                        next.map(|(columns, inputs)| Ahead::new(weight, d_in, columns, inputs));
                    let tiles = rows.div_ceil(MR);
                    for (t, first_row) in (0..rows).step_by(MR).enumerate() {
                        if let Some(ahead) = &ahead {
                            ahead.fetch(t * ahead.lines / tiles..(t + 1) * ahead.lines / tiles);
                        }
                        let tile = Tile {
                            rows: first_row..(first_row + MR).min(rows),
                            columns: columns.clone(),
                            inputs: inputs.clone(),
                        };
                        // SAFETY: `available()` was checked; `tile` lies inside x_block
                        // (rows of its inputs) and out (rows of d_out); tasks own disjoint
                        // columns of out.
                        unsafe { tile.run(x_block, packed, out_ptr, d_out) };
                    }
                }
            }
        });
    });
    BLOCKED.set(x_blocks);
    out
}

/// `x` (`rows` rows of `d_in`) regrouped by blocks of KC inputs: block `b` holds inputs
/// `b * KC..` of every row, each row's contiguous, at `b * KC * rows`. A block of rows read
/// where they lie in x is `d_in` apart, a power of two in most models, and those rows all
/// fall in the same few cache sets, where at 512 rows they evict each other from L2.
fn blocked(x: &[f32], rows: usize, d_in: usize, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    let blocks: Vec<(usize, &mut [f32])> = (0..d_in)
        .step_by(KC)
        .zip(out.chunks_mut(KC * rows))
        .collect();
    blocks.into_par_iter().for_each(|(first, block)| {
        let width = KC.min(d_in - first);
        for (row, dest) in block.chunks_exact_mut(width).enumerate() {
            dest.copy_from_slice(&x[row * d_in + first..][..width]);
        }
    });
}

/// `len` values of `buffer` starting at a 64-byte boundary, so that each register the
/// kernel loads from a packed panel is one cache line, not parts of two (which costs two
/// loads).
fn aligned(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.resize(len + 16, 0.0);
    let skip = buffer.as_ptr().align_offset(64).min(16);
    &mut buffer[skip..skip + len]
}

/// The cache lines of a panel's weights (columns × inputs), to be fetched ahead.
struct Ahead {
    /// The first column's first input.
    start: *const u8,
    /// Bytes from one column's weights to the next's.
    column_bytes: usize,
    /// Lines per column, and in all.
    per_column: usize,
    lines: usize,
}

impl Ahead {
    fn new(weight: Rows<'_>, d_in: usize, columns: Range<usize>, inputs: Range<usize>) -> Self {
        // The first byte, the bytes of a column (a row of the weight), of the inputs.
        let (start, column_bytes, bytes): (*const u8, _, _) = match weight {
            Rows::F32(w) => (
                w[columns.start * d_in + inputs.start..].as_ptr().cast(),
                d_in * 4,
                inputs.len() * 4,
            ),
            Rows::Bf16(w) => (
                w[columns.start * d_in + inputs.start..].as_ptr().cast(),
                d_in * 2,
                inputs.len() * 2,
            ),
            Rows::Blocks(ty, w) => {
                let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
                let from = inputs.start / ty.values() * ty.bytes();
                (
                    w[columns.start * row_bytes + from..].as_ptr(),
                    row_bytes,
                    inputs.len().div_ceil(ty.values()) * ty.bytes(),
                )
            }
        };
        let per_column = bytes.div_ceil(64);
        Self {
            start,
            column_bytes,
            per_column,
            lines: per_column * columns.len(),
        }
    }

    /// Hints the lines numbered `lines` (of `self.lines`) into L2.
    fn fetch(&self, lines: Range<usize>) {
        for line in lines {
            let (column, at) = (line / self.per_column, line % self.per_column);
            let address = self
                .start
                .wrapping_add(column * self.column_bytes + at * 64);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    address.cast(),
                )
            };
        }
    }
}

thread_local! {
    /// The calling thread's packed panel, reused across calls.
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's last `blocked` input, its buffer reused by the next call.
    static BLOCKED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's decoded pieces of a quantized weight's rows, for `pack`.
    static DECODED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Weights `w[j][k]` for `j` in `columns` (at most NR) and `k` in `inputs` (at most KC) into
/// `packed[k][j]` (rows of NR, zeros past the last column), widened to f32.
fn pack<W: Stored>(
    w: &[W],
    d_in: usize,
    columns: std::ops::Range<usize>,
    inputs: std::ops::Range<usize>,
    packed: &mut [f32],
) {
    let (n, kc) = (columns.len(), inputs.len());
    #[cfg(target_arch = "x86_64")]
    if n == NR && kc.is_multiple_of(16) {
        for half in 0..2 {
            let first = columns.start + 16 * half;
            for k in (0..kc).step_by(16) {
                let source = &w[first * d_in + inputs.start + k..];
                let dest = &mut packed[k * NR + 16 * half..];
                // SAFETY: `available()` (avx512f) was checked by the only caller; the 16
                // rows of 16 values read lie in `w` (columns and inputs are in range) and the
                // 16 rows of 16 written, NR apart, in `packed` (NR × KC).
                unsafe { avx512::transpose16(source, d_in, dest, NR) };
            }
        }
        return;
    }
    for k in 0..kc {
        let row = &mut packed[k * NR..(k + 1) * NR];
        for (j, value) in row.iter_mut().enumerate() {
            *value = if j < n {
                w[(columns.start + j) * d_in + inputs.start + k].widen()
            } else {
                0.0
            };
        }
    }
}

/// Rows × columns of the output over a block of inputs: the unit of work of the kernel.
struct Tile {
    rows: std::ops::Range<usize>,
    columns: std::ops::Range<usize>,
    inputs: std::ops::Range<usize>,
}

impl Tile {
    /// Continues each output's chain over `inputs` (from zero for the first block).
    ///
    /// # Safety
    /// AVX-512F present; `x` holds rows of `inputs.len()`, the tile's among them, `out` points at rows of
    /// `d_out` holding its rows and columns, which no other thread touches meanwhile;
    /// `packed` is `pack`'s panel for these columns and inputs.
    unsafe fn run(&self, x: &[f32], packed: &[f32], out: OutPtr, d_out: usize) {
        assert!(self.rows.end * self.inputs.len() <= x.len());
        assert!(packed.len() >= self.inputs.len() * NR);
        // SAFETY: forwarded; the assert keeps the kernel's reads inside x and packed.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx512::tile(self, x, packed, out.0, d_out)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MR, NR, Tile};
    use crate::simd::avx512::{load, transpose};
    use crate::stored::Stored;

    /// The 16 × 16 block `source[j * stride + k]` (j, k < 16) widened and written
    /// transposed, `dest[k * dest_stride + j]`.
    ///
    /// # Safety
    /// AVX-512F present; the block lies inside both slices.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose16<W: Stored>(
        source: &[W],
        stride: usize,
        dest: &mut [f32],
        dest_stride: usize,
    ) {
        assert!(source.len() > 15 * stride + 15 && dest.len() > 15 * dest_stride + 15);
        // SAFETY: the assert keeps every read and write inside the slices.
        unsafe {
            let rows = std::array::from_fn(|j| load(source.as_ptr().add(j * stride)));
            for (k, column) in transpose(rows).into_iter().enumerate() {
                _mm512_storeu_ps(dest.as_mut_ptr().add(k * dest_stride), column);
            }
        }
    }

    /// See [`Tile::run`]: up to MR rows × NR columns, accumulators in registers.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn tile(tile: &Tile, x: &[f32], packed: &[f32], out: *mut f32, d_out: usize) {
        let rows = tile.rows.len();
        let n = tile.columns.len();
        // Columns past the weight's last are computed (on zero weights) but not stored.
        let low: __mmask16 = if n >= 16 { !0 } else { (1u16 << n) - 1 };
        let high: __mmask16 = if n >= NR {
            !0
        } else if n > 16 {
            (1u16 << (n - 16)) - 1
        } else {
            0
        };
        // Rows past the last read the last again and are not stored.
        let row = |r: usize| tile.rows.start + r.min(rows - 1);
        // SAFETY (whole body): the caller's promises; every pointer below is inside x,
        // packed or out's tile.
        unsafe {
            let xs: [*const f32; MR] =
                std::array::from_fn(|r| x.as_ptr().add(row(r) * tile.inputs.len()));
            let outs: [*mut f32; MR] =
                std::array::from_fn(|r| out.add(row(r) * d_out + tile.columns.start));
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            if tile.inputs.start > 0 {
                for r in 0..MR {
                    acc[r][0] = _mm512_maskz_loadu_ps(low, outs[r]);
                    acc[r][1] = _mm512_maskz_loadu_ps(high, outs[r].add(16));
                }
            }
            let p = packed.as_ptr();
            let kc = tile.inputs.len();
            let step = |acc: &mut [[__m512; 2]; MR], k: usize| {
                let w0 = _mm512_loadu_ps(p.add(k * NR));
                let w1 = _mm512_loadu_ps(p.add(k * NR + 16));
                for r in 0..MR {
                    let v = _mm512_set1_ps(*xs[r].add(k));
                    acc[r][0] = _mm512_fmadd_ps(v, w0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(v, w1, acc[r][1]);
                }
            };
            let mut k = 0;
            while k + 2 <= kc {
                step(&mut acc, k);
                step(&mut acc, k + 1);
                k += 2;
            }
            if k < kc {
                step(&mut acc, k);
            }
            for r in 0..rows {
                _mm512_mask_storeu_ps(outs[r], low, acc[r][0]);
                _mm512_mask_storeu_ps(outs[r].add(16), high, acc[r][1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every output against its definition, one fused multiply-add after another in input
    /// order, bit for bit: shapes with partial panels, tiles and input blocks; bf16 and f32
    /// weights; at 1, 2 and 3 threads. The kernel is AVX-512's (below that tier `linear`
    /// takes gemm, tested in `linear` and tests/quant.rs at each tier `just test-tiers` runs).
    #[test]
    fn each_output_is_its_chain_of_fmas() {
        use crate::cpu::Tier;
        use crate::cpu::testing::{Needs, runs};
        if !runs(Needs::Tier(Tier::Avx512)) {
            return;
        }
        assert!(available());
        let mut state = 11u32;
        let mut next = move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        for (rows, d_in, d_out) in [
            (1, 16, 32),
            (13, 576, 70),
            (9, 300, 64),
            (20, 48, 5),
            (17, 1040, 96),
        ] {
            let x: Vec<f32> = (0..rows * d_in).map(|_| next()).collect();
            let bf16: Vec<half::bf16> = (0..d_out * d_in)
                .map(|_| half::bf16::from_f32(next()))
                .collect();
            let f32s: Vec<f32> = bf16.iter().map(|w| w.widen()).collect();
            let mut want = vec![0.0f32; rows * d_out];
            for r in 0..rows {
                for j in 0..d_out {
                    let mut acc = 0.0f32;
                    for k in 0..d_in {
                        acc = x[r * d_in + k].mul_add(f32s[j * d_in + k], acc);
                    }
                    want[r * d_out + j] = acc;
                }
            }
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for threads in [1, 2, 3] {
                crate::testing::in_pool(threads, || {
                    for weight in [Rows::Bf16(&bf16), Rows::F32(&f32s)] {
                        let got = linear_rows(&x, weight, d_in);
                        assert!(
                            bits(&got) == bits(&want),
                            "{rows}x{d_in}x{d_out} at {threads} threads"
                        );
                    }
                });
            }
        }
    }
}
