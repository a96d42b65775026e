//! A decoding span's attention with each key and value row read into registers once for
//! every query head that shares it, on the CPUs that have the registers for it
//! ([`avx512`](super::avx512), [`avx2`](super::avx2)).
//!
//! Why: the portable span computes each query head apart, so a key/value head's rows are
//! loaded once per query head of its group (three times for SmolLM2), and each score is
//! a 16-row block's worth of loads and shuffles. Here a key row's registers serve every
//! head of the group, and a value row's every head's weighted sum, with one multiply-add
//! per product. Each score and each head's sum is computed in one fixed order whatever the
//! span's length or where a row falls in it, so a position's output depends only on the
//! keys it sees and how the decoding splits them across threads, as before.

use super::Heads;
use crate::stored::Stored;

/// A block of scores: `heads` query heads (`head_dim` apart from `queries`) against `rows`
/// key rows (`stride` apart from `keys`, at the key/value head's first column), at most
/// [`Grouped::ROWS`]; head `h`'s score of row `j` goes to `out[h * n + j]`.
pub(super) struct ScoreBlock<S> {
    pub queries: *const f32,
    pub head_dim: usize,
    pub keys: *const S,
    pub stride: usize,
    pub rows: usize,
    pub out: *mut f32,
    pub n: usize,
}

/// A tile of weighted sums: `heads` heads' sums over `rows` value rows (`stride` apart from
/// `values`, [`Grouped::SUM_COLUMNS`] columns from there); head `h`'s weight of row `j` at
/// `weights[h * n + j]`, its sum at `out[h * out_stride..]`, added to what is there, row
/// after row.
pub(super) struct SumTile<S> {
    pub weights: *const f32,
    pub n: usize,
    pub values: *const S,
    pub stride: usize,
    pub rows: usize,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// One instruction set's blocks.
pub(super) trait Grouped {
    /// Key rows per block of scores, and query heads per block.
    const ROWS: usize;
    const SCORE_HEADS: usize;
    /// Columns per weighted sum, and query heads per sum.
    const SUM_COLUMNS: usize;
    const SUM_HEADS: usize;

    /// Whether this CPU runs the blocks.
    fn available() -> bool;

    /// The block's scores, for `heads` from 1 to [`Self::SCORE_HEADS`].
    ///
    /// # Safety
    /// [`Self::available`]; the block's rows, queries and outputs lie inside their buffers.
    unsafe fn scores<S: Stored>(heads: usize, block: ScoreBlock<S>);

    /// The tile's sums, for `heads` from 1 to [`Self::SUM_HEADS`].
    ///
    /// # Safety
    /// As for [`Self::scores`].
    unsafe fn sums<S: Stored>(heads: usize, tile: SumTile<S>);
}

/// Value rows per tile of the weighted sums: a tile of every key/value head's rows (24 KB
/// for SmolLM2's f32 cache) stays in L1 while each head's sum reads its columns.
const SUM_TILE: usize = 32;

/// Key rows past the block being scored whose lines are fetched: a long context is read
/// from memory, and the next rows' reads must be in flight while these are worked on.
const PREFETCH_BLOCKS: usize = 2;

/// Whether [`span`] takes heads of `head_dim` on this CPU with `G`'s blocks.
pub(super) fn runs<G: Grouped>(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(G::SUM_COLUMNS) && G::available()
}

/// Every query head of one query row (`queries`, `n_heads * head_dim`) against the `n`
/// positions whose keys and values start at `keys` and `values` (rows `key_stride` and
/// `value_stride` apart, each every key/value head's `head_dim` columns side by side): for
/// each head, `partials` gets `Σ e^(s_j - max) v_j`, then `max` and `Σ e^(s_j - max)`
/// (`head_dim + 2` values per head), as the portable span does. `scores` holds `n` per head.
///
/// # Safety
/// [`runs`]`::<G>(heads.head_dim)`; `keys` and `values` hold `n` rows as described, `n > 0`;
/// `queries`, `scores` and `partials` as long as said.
pub(super) unsafe fn span<S: Stored, G: Grouped>(
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
    let partial_len = super::partial_len(head_dim);
    let kv_width = n_kv_heads * head_dim;
    debug_assert!(runs::<G>(head_dim) && n > 0);
    debug_assert!(queries.len() >= n_heads * head_dim && scores.len() >= n_heads * n);
    debug_assert!(partials.len() >= n_heads * partial_len);
    debug_assert!(keys.len() >= (n - 1) * key_stride + kv_width);
    debug_assert!(values.len() >= (n - 1) * value_stride + kv_width);
    let (queries, keys, values) = (queries.as_ptr(), keys.as_ptr(), values.as_ptr());
    // SAFETY (both blocks below): every row read is one of the `n` the caller vouches for,
    // at a column inside its key/value head; every score and partial written is inside
    // the buffers, as `heads` and `n` lay them out.
    unsafe {
        let scores = scores.as_mut_ptr();
        // Every head's scores, a block of rows at a time, the block's rows read whole.
        for first in (0..n).step_by(G::ROWS) {
            let rows = G::ROWS.min(n - first);
            let ahead = (first + PREFETCH_BLOCKS * G::ROWS).min(n);
            fetch::<S>(keys, key_stride, kv_width, ahead..(ahead + G::ROWS).min(n));
            for kv_head in 0..n_kv_heads {
                for (head, count) in chunks(kv_head * group, group, G::SCORE_HEADS) {
                    let block = ScoreBlock {
                        queries: queries.add(head * head_dim),
                        head_dim,
                        keys: keys.add(first * key_stride + kv_head * head_dim),
                        stride: key_stride,
                        rows,
                        out: scores.add(head * n + first),
                        n,
                    };
                    G::scores(count, block);
                }
            }
        }
    }
    super::numerators(scores, n, partials, head_dim);
    // SAFETY: as above.
    unsafe {
        let (scores, partials) = (scores.as_ptr(), partials.as_mut_ptr());
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
                for column in (0..head_dim).step_by(G::SUM_COLUMNS) {
                    for (head, count) in chunks(kv_head * group, group, G::SUM_HEADS) {
                        let tile = SumTile {
                            weights: scores.add(head * n + first),
                            n,
                            values: values.add(first * value_stride + kv_head * head_dim + column),
                            stride: value_stride,
                            rows,
                            out: partials.add(head * partial_len + column),
                            out_stride: partial_len,
                        };
                        G::sums(count, tile);
                    }
                }
            }
        }
    }
}

/// The heads `first..first + count` in runs of at most `most`: (first head, heads).
fn chunks(first: usize, count: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..count)
        .step_by(most)
        .map(move |at| (first + at, most.min(count - at)))
}

/// Hints into L1 the rows `rows` (`stride` apart from `at`, `width` values each).
#[inline(always)]
fn fetch<S>(at: *const S, stride: usize, width: usize, rows: std::ops::Range<usize>) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let bytes = width * size_of::<S>();
    for row in rows {
        let row = at.wrapping_add(row * stride).cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(line)) };
        }
    }
}
