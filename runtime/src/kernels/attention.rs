//! Causal grouped-query attention on f32 slices, for backends that expose their buffers.
//!
//! Per block of query rows and per head: one gemm for the scores against only the keys the
//! block can see, a softmax over each row's visible keys (vectorized `exp`), one gemm into
//! the output. Blocks run in parallel. Compared with composing Burn tensor ops this skips
//! the masked half of the scores (never computed, never exponentiated), never copies
//! queries, keys or values into a head-major layout, and writes the output straight into
//! the `[seq, heads * head_dim]` layout `o_proj` reads.

use std::cell::RefCell;

use rayon::prelude::*;

use super::Heads;
use super::simd;
use super::team;

/// Query rows per parallel task: the row count of gemm's f32 AVX-512 microkernel.
const BLOCK_ROWS: usize = 64;

/// Below this many multiply-adds a call runs on the calling thread: handing work to
/// another thread costs more than decoding one token's attention at short context.
const MIN_PARALLEL_WORK: usize = 1 << 20;

/// A `[batch, rows, width]` f32 matrix inside a larger buffer, rows `row_stride` apart
/// (the KV cache's visible prefix is such a view of its buffer).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub batch_stride: usize,
    pub row_stride: usize,
}

impl<'a> Rows<'a> {
    /// Index in the buffer of element `column` of row `row` of batch `batch`.
    fn index(&self, batch: usize, row: usize, column: usize) -> usize {
        self.offset + batch * self.batch_stride + row * self.row_stride + column
    }

    /// The part of the buffer from element `column` of row `row` of batch `batch` to the end
    /// of the `width` columns of row `row + n_rows - 1`.
    fn slice(
        &self,
        batch: usize,
        row: usize,
        column: usize,
        n_rows: usize,
        width: usize,
    ) -> &'a [f32] {
        let first = self.index(batch, row, column);
        &self.data[first..first + (n_rows - 1) * self.row_stride + width]
    }

    /// Pointer to element `column` of row `row` of batch `batch`, checked against the buffer.
    fn at(&self, batch: usize, row: usize, column: usize) -> *const f32 {
        self.data[self.index(batch, row, column)..].as_ptr()
    }
}

/// The inputs of one call. `queries` (rotated, pre-scaled by `1/sqrt(head_dim)`) are
/// `[batch, seq, n_heads * head_dim]`; `keys` and `values` are `[batch, start + seq,
/// n_kv_heads * head_dim]`, the cache including this call's positions.
pub struct CausalAttention<'a> {
    pub queries: Rows<'a>,
    pub keys: Rows<'a>,
    pub values: Rows<'a>,
    pub batch: usize,
    pub seq: usize,
    /// Position of the first query: keys `0..=start + i` are visible to query `i`.
    pub start: usize,
    pub heads: Heads,
}

impl CausalAttention<'_> {
    /// The output, `[batch, seq, n_heads * head_dim]`.
    pub fn run(&self) -> Vec<f32> {
        let width = self.heads.n_heads * self.heads.head_dim;
        let mut out = vec![0.0f32; self.batch * self.seq * width];
        self.check_bounds();
        // Work of the whole call in multiply-adds: two products over the visible keys.
        let work = self.batch * self.seq * (self.start + self.seq) * width * 2;
        let entry_len = self.seq * width;
        if self.seq == 1 {
            // Decoding: each head's row is a task, for the team kept spinning per token.
            let head_dim = self.heads.head_dim;
            let heads = out.chunks_mut(width).enumerate().flat_map(|(batch, row)| {
                let heads = row.chunks_mut(head_dim).enumerate();
                heads.map(move |(head, out)| (batch, head, out))
            });
            team::for_each_part(heads.collect(), |(batch, head, out)| {
                SCORES.with_borrow_mut(|scores| {
                    scores.resize(self.start + 1, 0.0);
                    self.one_row(batch, 0, head, scores, out);
                })
            });
        } else if work < MIN_PARALLEL_WORK {
            for (batch, entry) in out.chunks_mut(entry_len).enumerate() {
                for (i, block) in entry.chunks_mut(BLOCK_ROWS * width).enumerate() {
                    self.block(batch, i * BLOCK_ROWS, block);
                }
            }
        } else {
            out.par_chunks_mut(entry_len)
                .enumerate()
                .flat_map(|(batch, entry)| {
                    entry
                        .par_chunks_mut(BLOCK_ROWS * width)
                        .enumerate()
                        .map(move |(i, block)| (batch, i * BLOCK_ROWS, block))
                })
                .for_each(|(batch, first, block)| self.block(batch, first, block));
        }
        out
    }

    /// Query rows `first..` of one batch entry, every head: `out` is those rows of the
    /// output (at most `BLOCK_ROWS` rows of `n_heads * head_dim`).
    fn block(&self, batch: usize, first: usize, out: &mut [f32]) {
        let Heads {
            n_heads, head_dim, ..
        } = self.heads;
        let width = n_heads * head_dim;
        let rows = out.len() / width;
        // The block's last row sees the most keys; earlier rows mask the rest of theirs.
        let visible = self.start + first + rows;
        SCORES.with_borrow_mut(|scores| {
            scores.resize(rows * visible, 0.0);
            for head in 0..n_heads {
                let out_head = &mut out[head * head_dim..];
                if rows == 1 {
                    self.one_row(batch, first, head, scores, out_head);
                } else {
                    self.rows(batch, first, head, scores, out_head);
                }
            }
        });
    }

    /// One query row and one head (decoding): dot products and a weighted sum of rows, on
    /// the calling thread. gemm's setup costs more than the work at this size (two calls per
    /// head and layer, 540 per token).
    fn one_row(&self, batch: usize, row: usize, head: usize, scores: &mut [f32], out: &mut [f32]) {
        let head_dim = self.heads.head_dim;
        let kv_column = self.kv_column(head);
        let visible = scores.len();
        let query = self.queries.slice(batch, row, head * head_dim, 1, head_dim);
        let keys = self.keys.slice(batch, 0, kv_column, visible, head_dim);
        let values = self.values.slice(batch, 0, kv_column, visible, head_dim);
        simd::dot_rows(query, keys, self.keys.row_stride, scores);
        let mut inverse_sum = [0.0f32];
        simd::causal_softmax_rows(scores, visible, visible, &mut inverse_sum);
        let out = &mut out[..head_dim];
        simd::weighted_row_sum(scores, values, self.values.row_stride, out);
        out.iter_mut().for_each(|x| *x *= inverse_sum[0]);
    }

    /// First column of the key/value head that query head `head` reads.
    fn kv_column(&self, head: usize) -> usize {
        let group = self.heads.n_heads / self.heads.n_kv_heads;
        head / group * self.heads.head_dim
    }

    /// The block of query rows from `first` and one head, through gemm.
    fn rows(
        &self,
        batch: usize,
        first: usize,
        head: usize,
        scores: &mut [f32],
        out_head: &mut [f32],
    ) {
        let head_dim = self.heads.head_dim;
        let width = self.heads.n_heads * head_dim;
        let kv_column = self.kv_column(head);
        let rows = (self.seq - first).min(BLOCK_ROWS);
        let visible = scores.len() / rows;
        // scores[r, j] = q[first + r, head] · k[j, kv]
        // SAFETY: `check_bounds` verified every row and column read here is inside
        // the buffers; `scores` holds rows * visible elements.
        unsafe {
            product(
                [rows, visible, head_dim],
                (scores.as_mut_ptr(), visible),
                (
                    self.queries.at(batch, first, head * head_dim),
                    self.queries.row_stride,
                    1,
                ),
                (self.keys.at(batch, 0, kv_column), 1, self.keys.row_stride),
            );
        }
        let mut inverse_sums = [0.0f32; BLOCK_ROWS];
        let first_seen = self.start + first + 1;
        simd::causal_softmax_rows(scores, visible, first_seen, &mut inverse_sums);
        // out[r, head] = softmax(scores)[r] · v[.., kv]
        // SAFETY: as above; `out_head` starts at this head's first column of the block's first
        // row, and the block's `rows` rows of `width` lie within the output.
        unsafe {
            product(
                [rows, head_dim, visible],
                (out_head.as_mut_ptr(), width),
                (scores.as_ptr(), visible, 1),
                (
                    self.values.at(batch, 0, kv_column),
                    self.values.row_stride,
                    1,
                ),
            );
        }
        for (r, inverse_sum) in inverse_sums[..rows].iter().enumerate() {
            for x in &mut out_head[r * width..][..head_dim] {
                *x *= inverse_sum;
            }
        }
    }

    /// Panics unless the last element every gemm reads lies inside its buffer (the first
    /// is checked by [`Rows::at`]), so the unchecked reads above stay in bounds.
    fn check_bounds(&self) {
        let Heads {
            n_heads,
            n_kv_heads,
            head_dim,
        } = self.heads;
        assert!(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
        if self.batch == 0 || self.seq == 0 {
            return;
        }
        let last = |rows: &Rows, n_rows: usize, width: usize| {
            assert!(rows.row_stride >= width);
            let end = rows.offset
                + (self.batch - 1) * rows.batch_stride
                + (n_rows - 1) * rows.row_stride
                + width;
            assert!(end <= rows.data.len(), "attention input out of bounds");
        };
        last(&self.queries, self.seq, n_heads * head_dim);
        last(&self.keys, self.start + self.seq, n_kv_heads * head_dim);
        last(&self.values, self.start + self.seq, n_kv_heads * head_dim);
    }
}

/// `dst = lhs · rhs` on the calling thread, for `[m, n, k]`: an `m × k` lhs and a `k × n`
/// rhs, each given as (pointer, row stride, column stride), into a row-major `dst` given as
/// (pointer, row stride).
///
/// # Safety
/// Every element of the three matrices those pointers and strides describe must lie inside
/// one live allocation, and `dst` must not overlap the others.
unsafe fn product(
    [m, n, k]: [usize; 3],
    (dst, dst_row_stride): (*mut f32, usize),
    (lhs, lhs_row_stride, lhs_column_stride): (*const f32, usize, usize),
    (rhs, rhs_row_stride, rhs_column_stride): (*const f32, usize, usize),
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
            gemm::Parallelism::None,
        );
    }
}

thread_local! {
    /// Each thread's score rows, reused across blocks, heads and layers.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}
