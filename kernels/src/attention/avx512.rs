//! A decoding span's attention on AVX-512: each key and value row is read into registers
//! once for all the query heads that share it.
//!
//! Why: the portable span computes each query head apart, so a key/value head's rows are
//! loaded once per query head of its group (three times for SmolLM2), and each score is
//! a 16-row block's worth of loads and shuffles. Here a key row's registers serve every
//! head of the group, and a value row's every head's weighted sum, with one multiply-add
//! per product. Each score and each head's sum is computed in one fixed order whatever the
//! span's length or where a row falls in it, so a position's output depends only on the
//! keys it sees and how the decoding splits them across threads, as before.

use std::arch::x86_64::*;

use super::Heads;
use crate::simd::avx512::load;
use crate::stored::Stored;

/// Key rows whose scores one block computes.
const ROWS: usize = 8;

/// Query heads per block of scores: 8 accumulators per head, the heads' query registers
/// and a key's, 28 of the 32 registers for three heads.
const SCORE_HEADS: usize = 3;

/// Columns per weighted sum, and query heads per sum: four value registers and four
/// accumulators per head, 28 of the 32 registers for six heads.
const SUM_COLUMNS: usize = 64;
const SUM_HEADS: usize = 6;

/// Key rows ahead of the block being scored whose lines are fetched.
const PREFETCH_ROWS: usize = 2 * ROWS;

/// Value rows per tile of the weighted sums: a tile of every key/value head's rows (24 KB
/// for SmolLM2's f32 cache) stays in L1 while each head's sum reads its columns.
const SUM_TILE: usize = 32;

/// Whether [`span`] takes heads of `head_dim` on this CPU.
pub(super) fn runs(head_dim: usize) -> bool {
    head_dim > 0
        && head_dim.is_multiple_of(SUM_COLUMNS)
        && crate::cpu::tier() >= crate::cpu::Tier::Avx512
}

/// Every query head of one query row (`queries`, `n_heads * head_dim`) against the `n`
/// positions whose keys and values start at `keys` and `values` (rows `key_stride` and
/// `value_stride` apart, each every key/value head's `head_dim` columns side by side): for
/// each head, `partials` gets `Σ e^(s_j - max) v_j`, then `max` and `Σ e^(s_j - max)`
/// (`head_dim + 2` values per head), as the portable span does. `scores` holds `n` per head.
///
/// # Safety
/// [`runs`]`(heads.head_dim)`; `keys` and `values` hold `n` rows as described, `n > 0`;
/// `queries`, `scores` and `partials` as long as said.
pub(super) unsafe fn span<S: Stored>(
    queries: &[f32],
    (keys, key_stride): (&[S], usize),
    (values, value_stride): (&[S], usize),
    n: usize,
    heads: Heads,
    scores: &mut [f32],
    partials: &mut [f32],
) {
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim,
    } = heads;
    let group = n_heads / n_kv_heads;
    let partial_len = head_dim + 2;
    let kv_width = n_kv_heads * head_dim;
    debug_assert!(runs(head_dim) && n > 0);
    debug_assert!(queries.len() >= n_heads * head_dim && scores.len() >= n_heads * n);
    debug_assert!(partials.len() >= n_heads * partial_len);
    debug_assert!(keys.len() >= (n - 1) * key_stride + kv_width);
    debug_assert!(values.len() >= (n - 1) * value_stride + kv_width);
    let (queries, keys, values) = (queries.as_ptr(), keys.as_ptr(), values.as_ptr());
    let (scores, partials) = (scores.as_mut_ptr(), partials.as_mut_ptr());
    // SAFETY (all below): every row read is one of the `n` the caller vouches for, at a
    // column inside its key/value head; every score and partial written is inside the
    // buffers, as `heads` and `n` lay them out.
    unsafe {
        // Every head's scores, a block of rows at a time, the block's rows read whole.
        for first in (0..n).step_by(ROWS) {
            let rows = ROWS.min(n - first);
            let ahead = (first + PREFETCH_ROWS).min(n);
            fetch::<S>(keys, key_stride, kv_width, ahead..(ahead + ROWS).min(n));
            for kv_head in 0..n_kv_heads {
                let keys = keys.add(first * key_stride + kv_head * head_dim);
                for (head, count) in chunks(kv_head * group, group, SCORE_HEADS) {
                    let queries = queries.add(head * head_dim);
                    let out = scores.add(head * n + first);
                    let block = (queries, head_dim, keys, key_stride, rows, out, n);
                    match count {
                        1 => score_block::<S, 1>(block),
                        2 => score_block::<S, 2>(block),
                        _ => score_block::<S, 3>(block),
                    }
                }
            }
        }
        for head in 0..n_heads {
            let row = std::slice::from_raw_parts_mut(scores.add(head * n), n);
            let stats = partials.add(head * partial_len + head_dim);
            crate::simd::softmax_numerators(row, std::slice::from_raw_parts_mut(stats, 2));
        }
        // Each head's weighted sum of the value rows, a tile of rows at a time.
        for first in (0..n).step_by(SUM_TILE) {
            let rows = SUM_TILE.min(n - first);
            let next = first + SUM_TILE;
            fetch::<S>(
                values,
                value_stride,
                kv_width,
                next.min(n)..(next + SUM_TILE).min(n),
            );
            for kv_head in 0..n_kv_heads {
                for column in (0..head_dim).step_by(SUM_COLUMNS) {
                    let values = values.add(first * value_stride + kv_head * head_dim + column);
                    for (head, count) in chunks(kv_head * group, group, SUM_HEADS) {
                        let weights = scores.add(head * n + first).cast_const();
                        let out = partials.add(head * partial_len + column);
                        let tile = (weights, n, values, value_stride, rows, out, partial_len);
                        match count {
                            1 => sum_tile::<S, 1>(tile),
                            2 => sum_tile::<S, 2>(tile),
                            3 => sum_tile::<S, 3>(tile),
                            4 => sum_tile::<S, 4>(tile),
                            5 => sum_tile::<S, 5>(tile),
                            _ => sum_tile::<S, 6>(tile),
                        }
                    }
                }
            }
        }
    }
}

/// Hints into L1 the rows `rows` (`stride` apart from `at`, `width` values each): the
/// next rows' lines are asked for while the current ones are worked on, which a long
/// context read from memory needs to keep enough reads in flight.
#[inline(always)]
fn fetch<S>(at: *const S, stride: usize, width: usize, rows: std::ops::Range<usize>) {
    let bytes = width * size_of::<S>();
    for row in rows {
        let row = at.wrapping_add(row * stride).cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line)) };
        }
    }
}

/// The heads `first..first + count` in runs of at most `most`: (first head, heads).
fn chunks(first: usize, count: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..count)
        .step_by(most)
        .map(move |at| (first + at, most.min(count - at)))
}

/// `G` query heads (`head_dim` apart from `queries`) against `rows` key rows (`stride`
/// apart from `keys`, this key/value head's columns), at most [`ROWS`]: head `h`'s score
/// of row `j` goes to `out[h * n + j]`. Each score is its row's products summed in sixteen
/// lanes over the columns, then the lanes added as [`sums8`] adds them.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,f16c")]
unsafe fn score_block<S: Stored, const G: usize>(
    (queries, head_dim, keys, stride, rows, out, n): (
        *const f32,
        usize,
        *const S,
        usize,
        usize,
        *mut f32,
        usize,
    ),
) {
    // SAFETY: the caller's (see `span`); rows past `rows` read the last row again, and
    // their scores are not stored.
    unsafe {
        let row: [*const S; ROWS] = std::array::from_fn(|j| keys.add(j.min(rows - 1) * stride));
        let mut sums = [[_mm512_setzero_ps(); ROWS]; G];
        for column in (0..head_dim).step_by(16) {
            let q: [__m512; G] =
                std::array::from_fn(|h| _mm512_loadu_ps(queries.add(h * head_dim + column)));
            for j in 0..ROWS {
                let k = load(row[j].add(column));
                for h in 0..G {
                    sums[h][j] = _mm512_fmadd_ps(k, q[h], sums[h][j]);
                }
            }
        }
        let mask = u8::MAX >> (ROWS - rows);
        for (h, sums) in sums.into_iter().enumerate() {
            _mm256_mask_storeu_ps(out.add(h * n), mask, sums8(sums));
        }
    }
}

/// Lane `j`: the sixteen lanes of `v[j]` added, pairs of registers at a time (8 -> 4 -> 2
/// -> 1), about three shuffles and adds per sum where reducing each register alone takes
/// eight.
#[inline]
#[target_feature(enable = "avx512f")]
fn sums8(v: [__m512; ROWS]) -> __m256 {
    // Registers j and j + 4: their 128-bit quarters 0 + 2 and 1 + 3, row j's eight partial
    // sums in the low half, row j + 4's in the high.
    let halves: [__m512; 4] = std::array::from_fn(|j| {
        let (a, b) = (v[j], v[j + 4]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    });
    // Registers i and i + 2: each quarter four partial sums of one row, rows i, i + 4,
    // i + 2, i + 6 in quarters 0..4.
    let quarters: [__m512; 2] = std::array::from_fn(|i| {
        let (a, b) = (halves[i], halves[i + 2]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    });
    // Within each quarter, lanes 0 + 2 and 1 + 3 of each register: quarter q holds two
    // partial sums of a row of the first register, then two of the second's same row.
    let (a, b) = (quarters[0], quarters[1]);
    let pairs = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
        _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
    );
    // Each pair added: the sums in lanes 0, 2 of each quarter, rows
    // [0, 1], [4, 5], [2, 3], [6, 7].
    let sums = _mm512_add_ps(pairs, _mm512_shuffle_ps::<0b10_11_00_01>(pairs, pairs));
    const ORDER: [i32; 16] = [0, 2, 8, 10, 4, 6, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: ORDER is sixteen i32s.
    let order = unsafe { _mm512_loadu_si512(ORDER.as_ptr().cast()) };
    _mm512_castps512_ps256(_mm512_permutexvar_ps(order, sums))
}

/// `G` heads' sums over `rows` value rows (`stride` apart from `values`, [`SUM_COLUMNS`]
/// columns): head `h`'s weight of row `j` at `weights[h * n + j]`, its sum at
/// `out[h * out_stride..]`, added to what is there. Each column's sum runs over the rows in
/// order, one multiply-add a row.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,f16c")]
unsafe fn sum_tile<S: Stored, const G: usize>(
    (weights, n, values, stride, rows, out, out_stride): (
        *const f32,
        usize,
        *const S,
        usize,
        usize,
        *mut f32,
        usize,
    ),
) {
    const REGISTERS: usize = SUM_COLUMNS / 16;
    // SAFETY: the caller's (see `span`).
    unsafe {
        let mut sums: [[__m512; REGISTERS]; G] = std::array::from_fn(|h| {
            std::array::from_fn(|c| _mm512_loadu_ps(out.add(h * out_stride + 16 * c)))
        });
        for j in 0..rows {
            let row = values.add(j * stride);
            let v: [__m512; REGISTERS] = std::array::from_fn(|c| load(row.add(16 * c)));
            for (h, sums) in sums.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*weights.add(h * n + j));
                for (sum, &v) in sums.iter_mut().zip(&v) {
                    *sum = _mm512_fmadd_ps(w, v, *sum);
                }
            }
        }
        for (h, sums) in sums.iter().enumerate() {
            for (c, &sum) in sums.iter().enumerate() {
                _mm512_storeu_ps(out.add(h * out_stride + 16 * c), sum);
            }
        }
    }
}
