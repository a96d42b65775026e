//! Causal grouped-query attention on f32 slices, for backends that expose their buffers.
//!
//! Per block of query rows and per head: one gemm for the scores against only the keys the
//! block can see, a softmax over each row's visible keys (vectorized `exp`), one gemm into
//! the output. Blocks run in parallel. Compared with composing Burn tensor ops this skips
//! the masked half of the scores (never computed, never exponentiated), never copies
//! queries, keys or values into a head-major layout, and writes the output straight into
//! the `[seq, heads * head_dim]` layout `o_proj` reads. Decoding a token (one query row)
//! splits the keys across threads instead: see `CausalAttention::decode`.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::linear::product;
use crate::simd;
use crate::stored::Stored;
use crate::team;

/// Query rows per parallel task: the row count of gemm's f32 AVX-512 microkernel.
const BLOCK_ROWS: usize = 64;

/// Keys per thread below which decoding a token's attention stays on one thread.
const MIN_KEYS_PER_SPAN: usize = 16;

/// Positions per tile of each of a decoding span's four streams: a tile's keys (every
/// key/value head's, 4 x 24 KB for SmolLM2's f32 cache) stay in L2 while every query head
/// reads them.
const STREAM_TILE: usize = 32;

/// Below this many multiply-adds a call runs on the calling thread: handing work to
/// another thread costs more than decoding one token's attention at short context.
const MIN_PARALLEL_WORK: usize = 1 << 20;

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

/// A `[batch, rows, width]` matrix inside a larger buffer, rows `row_stride` apart (the KV
/// cache's visible prefix is such a view of its buffer), its values stored as `S`.
pub struct Matrix<'a, S = f32> {
    pub data: &'a [S],
    pub offset: usize,
    pub batch_stride: usize,
    pub row_stride: usize,
}

impl<S> Clone for Matrix<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Matrix<'_, S> {}

impl<'a, S: Stored> Matrix<'a, S> {
    /// `data` as one batch entry of rows of `width`.
    pub fn rows_of(data: &'a [S], width: usize) -> Self {
        Self {
            data,
            offset: 0,
            batch_stride: data.len(),
            row_stride: width,
        }
    }

    /// `data` as `[batch, n_rows, width]`, packed.
    pub fn packed(data: &'a [S], n_rows: usize, width: usize) -> Self {
        Self {
            data,
            offset: 0,
            batch_stride: n_rows * width,
            row_stride: width,
        }
    }

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
    ) -> &'a [S] {
        let first = self.index(batch, row, column);
        &self.data[first..first + (n_rows - 1) * self.row_stride + width]
    }

    /// Pointer to element `column` of row `row` of batch `batch`, checked against the buffer.
    fn at(&self, batch: usize, row: usize, column: usize) -> *const S {
        self.data[self.index(batch, row, column)..].as_ptr()
    }

    /// Panics unless the last of `width` columns of row `n_rows - 1` of entry `batch - 1`
    /// lies inside the buffer.
    fn check_last(&self, batch: usize, n_rows: usize, width: usize) {
        assert!(self.row_stride >= width);
        let end =
            self.offset + (batch - 1) * self.batch_stride + (n_rows - 1) * self.row_stride + width;
        assert!(end <= self.data.len(), "attention input out of bounds");
    }

    /// Rows `0..n_rows` of every batch entry, `width` columns each, widened to f32 and packed
    /// (`[batch, n_rows, width]`).
    pub fn widened(&self, batch: usize, n_rows: usize, width: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(batch * n_rows * width);
        for b in 0..batch {
            for row in 0..n_rows {
                let values = &self.data[self.index(b, row, 0)..][..width];
                out.extend(values.iter().map(|v| v.widen()));
            }
        }
        out
    }
}

/// The inputs of one call. `queries` (rotated, pre-scaled by `1/sqrt(head_dim)`) are
/// `[batch, seq, n_heads * head_dim]`; `keys` and `values` are `[batch, start + seq,
/// n_kv_heads * head_dim]`, the cache including this call's positions, stored as `S`:
/// decoding reads any [`Stored`] type, prompts' blocks (gemm) only f32.
pub struct CausalAttention<'a, S = f32> {
    pub queries: Matrix<'a>,
    pub keys: Matrix<'a, S>,
    pub values: Matrix<'a, S>,
    pub batch: usize,
    pub seq: usize,
    /// Position of the first query: keys `0..=start + i` are visible to query `i`.
    pub start: usize,
    pub heads: Heads,
    /// A sliding window (Mistral's): query `i` sees only the last `window` of its keys,
    /// `start + i + 1 - window..=start + i`.
    pub window: Option<usize>,
}

impl CausalAttention<'_> {
    /// The output, `[batch, seq, n_heads * head_dim]`.
    pub fn run(&self) -> Vec<f32> {
        if self.seq == 1 {
            return self.decode();
        }
        let width = self.heads.n_heads * self.heads.head_dim;
        let mut out = vec![0.0f32; self.batch * self.seq * width];
        self.check_bounds();
        // Work of the whole call in multiply-adds: two products over the visible keys.
        let work = self.batch * self.seq * (self.start + self.seq) * width * 2;
        let entry_len = self.seq * width;
        if work < MIN_PARALLEL_WORK {
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
        // The block's keys: from the first row's earliest to the last row's latest; each
        // row masks the ones it doesn't see.
        let keys = self.first_key(self.start + first)..self.start + first + rows;
        SCORES.with_borrow_mut(|scores| {
            scores.resize(rows * keys.len(), 0.0);
            for head in 0..n_heads {
                let out = &mut out[head * head_dim..];
                self.block_head(batch, first, head, keys.clone(), scores, out);
            }
        });
    }

    /// First column of the key/value head that query head `head` reads.
    fn kv_column(&self, head: usize) -> usize {
        let group = self.heads.n_heads / self.heads.n_kv_heads;
        head / group * self.heads.head_dim
    }

    /// The block of query rows from `first` and one head against `keys`, through gemm.
    fn block_head(
        &self,
        batch: usize,
        first: usize,
        head: usize,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        out_head: &mut [f32],
    ) {
        let head_dim = self.heads.head_dim;
        let width = self.heads.n_heads * head_dim;
        let kv_column = self.kv_column(head);
        let rows = (self.seq - first).min(BLOCK_ROWS);
        let visible = keys.len();
        // scores[r, j] = q[first + r, head] · k[keys.start + j, kv]
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
                (
                    self.keys.at(batch, keys.start, kv_column),
                    1,
                    self.keys.row_stride,
                ),
                gemm::Parallelism::None,
            );
        }
        let mut inverse_sums = [0.0f32; BLOCK_ROWS];
        // Row 0 (position start + first) sees up to column start + first - keys.start.
        let first_seen = self.start + first + 1 - keys.start;
        let window = self.window.unwrap_or(usize::MAX);
        simd::causal_softmax_rows(scores, visible, first_seen, window, &mut inverse_sums);
        // out[r, head] = softmax(scores)[r] · v[.., kv]
        // SAFETY: as above; `out_head` starts at this head's first column of the block's first
        // row, and the block's `rows` rows of `width` lie within the output.
        unsafe {
            product(
                [rows, head_dim, visible],
                (out_head.as_mut_ptr(), width),
                (scores.as_ptr(), visible, 1),
                (
                    self.values.at(batch, keys.start, kv_column),
                    self.values.row_stride,
                    1,
                ),
                gemm::Parallelism::None,
            );
        }
        for (r, inverse_sum) in inverse_sums[..rows].iter().enumerate() {
            for x in &mut out_head[r * width..][..head_dim] {
                *x *= inverse_sum;
            }
        }
    }
}

impl<S: Stored> CausalAttention<'_, S> {
    /// Decoding, one query row per batch entry. Here reading the cache is the work (at 4000
    /// positions SmolLM2's cache is a third as many bytes as its weights), so the keys are
    /// split into spans, one per thread, each span's share of every head computed apart and
    /// merged after (as flash-decoding does), and each key/value head's rows are read once
    /// for all the query heads that share it.
    ///
    /// Panics unless `seq` is 1.
    pub fn decode(&self) -> Vec<f32> {
        assert_eq!(self.seq, 1, "decoding takes one query row per batch entry");
        self.check_bounds();
        let Heads {
            n_heads, head_dim, ..
        } = self.heads;
        let mut out = vec![0.0f32; self.batch * n_heads * head_dim];
        let (first_key, end) = (self.first_key(self.start), self.start + 1);
        let visible = end - first_key;
        let spans = (visible / MIN_KEYS_PER_SPAN).clamp(1, rayon::current_num_threads());
        let span_len = visible.div_ceil(spans);
        // Per batch entry, span and head: one partial (see `span`).
        let partial_len = partial_len(head_dim);
        let task_len = n_heads * partial_len;
        let mut partials = vec![0.0f32; self.batch * spans * task_len];
        let tasks = partials
            .chunks_mut(task_len)
            .enumerate()
            .map(|(i, partials)| {
                let first = first_key + i % spans * span_len;
                (i / spans, first..(first + span_len).min(end), partials)
            });
        team::for_each_part(tasks.collect(), |(batch, keys, partials)| {
            SCORES.with_borrow_mut(|scores| {
                scores.resize(n_heads * keys.len(), 0.0);
                self.span(batch, keys, scores, partials);
            })
        });
        let entries = out.chunks_exact_mut(n_heads * head_dim);
        for (out, partials) in entries.zip(partials.chunks_exact(spans * task_len)) {
            for (head, out) in out.chunks_exact_mut(head_dim).enumerate() {
                let spans = partials
                    .chunks_exact(task_len)
                    .map(|task| task[head * partial_len..][..partial_len].split_at(head_dim));
                let max = spans
                    .clone()
                    .fold(f32::NEG_INFINITY, |max, (_, stats)| max.max(stats[0]));
                out.fill(0.0);
                let mut sum = 0.0;
                for (numerators, stats) in spans {
                    // Exactly 1 with a single span, which then is plain softmax.
                    let rescale = (stats[0] - max).exp();
                    sum += rescale * stats[1];
                    for (o, &x) in out.iter_mut().zip(numerators) {
                        *o += rescale * x;
                    }
                }
                let inverse_sum = 1.0 / sum;
                out.iter_mut().for_each(|x| *x *= inverse_sum);
            }
        }
        out
    }

    /// Every query head of the query row of `batch` against the positions `keys`: for each
    /// head, `partials` gets `Σ e^(s_j - max) v_j` over them, then `max` and
    /// `Σ e^(s_j - max)`, where `s_j` is the head's score of key `j`
    /// ([`partial_len`] values per head). `scores` holds `keys.len()` per head.
    ///
    /// The keys and values are read a tile of positions at a time, every head using a tile
    /// before the next is read, so each is read once from memory, not once per head, and in
    /// order: a tile's rows hold every key/value head side by side, and going through one
    /// head's columns of the whole span, then the next head's, read the cache three times
    /// over at a stride the prefetchers follow poorly. On AVX2 and AVX-512, heads a
    /// multiple of 32 or 64 wide take `grouped::span`, which also reads each row into
    /// registers once for the whole group of query heads sharing it (docs/BENCHMARKS.md
    /// has what it bought).
    fn span(
        &self,
        batch: usize,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        partials: &mut [f32],
    ) {
        let Heads {
            n_heads,
            n_kv_heads,
            head_dim,
        } = self.heads;
        let group = n_heads / n_kv_heads;
        let (first, n) = (keys.start, keys.len());
        let (key_stride, value_stride) = (self.keys.row_stride, self.values.row_stride);
        #[cfg(target_arch = "x86_64")]
        if n > 0 && grouped::runs::<Avx2>(head_dim) {
            let kv_width = n_kv_heads * head_dim;
            let queries = self.queries.slice(batch, 0, 0, 1, n_heads * head_dim);
            let keys = (self.keys.slice(batch, first, 0, n, kv_width), key_stride);
            let values = (
                self.values.slice(batch, first, 0, n, kv_width),
                value_stride,
            );
            let span = if grouped::runs::<Avx512>(head_dim) {
                grouped::span::<S, Avx512>
            } else {
                grouped::span::<S, Avx2>
            };
            // SAFETY: the tier and head width are checked; the slices hold the `n` rows of
            // every key/value head (`Matrix::slice` checks them), `scores` and `partials`
            // are the caller's, as long as `grouped::span` says.
            unsafe { span(queries, keys, values, n, self.heads, scores, partials) };
            return;
        }
        let partial_len = partial_len(head_dim);
        // Positions `at`, `quarter + at`, `2 quarter + at`, `3 quarter + at` are read
        // together (four streams); the `n % 4` after the last quarter alone.
        let quarter = n / 4;
        let tiles = (0..quarter).step_by(STREAM_TILE);
        let starts = |at: usize| [0, 1, 2, 3].map(|k| k * quarter + at);
        for at in tiles.clone() {
            let rows = STREAM_TILE.min(quarter - at);
            for kv_head in 0..n_kv_heads {
                let column = kv_head * head_dim;
                let tile_keys =
                    starts(at).map(|p| self.keys.slice(batch, first + p, column, rows, head_dim));
                let queries =
                    (self.queries).slice(batch, 0, kv_head * group * head_dim, 1, group * head_dim);
                for (h, query) in queries.chunks_exact(head_dim).enumerate() {
                    let scores = &mut scores[(kv_head * group + h) * n..][..n];
                    let scores = quarters_mut(scores, quarter, at, rows);
                    simd::dot_rows4(query, tile_keys, key_stride, scores);
                }
            }
        }
        for kv_head in 0..n_kv_heads {
            let column = kv_head * head_dim;
            let rest = n - 4 * quarter;
            if rest == 0 {
                break;
            }
            let tile_keys = self
                .keys
                .slice(batch, first + 4 * quarter, column, rest, head_dim);
            let queries =
                (self.queries).slice(batch, 0, kv_head * group * head_dim, 1, group * head_dim);
            for (h, query) in queries.chunks_exact(head_dim).enumerate() {
                let scores = &mut scores[(kv_head * group + h) * n + 4 * quarter..][..rest];
                simd::dot_rows(query, tile_keys, key_stride, scores);
            }
        }
        numerators(scores, n, partials, head_dim);
        for at in tiles {
            let rows = STREAM_TILE.min(quarter - at);
            for kv_head in 0..n_kv_heads {
                let column = kv_head * head_dim;
                let tile_values =
                    starts(at).map(|p| self.values.slice(batch, first + p, column, rows, head_dim));
                for h in 0..group {
                    let head = kv_head * group + h;
                    let weights = starts(at).map(|p| &scores[head * n + p..][..rows]);
                    simd::weighted_row_sum4(
                        weights,
                        tile_values,
                        value_stride,
                        &mut partials[head * partial_len..][..head_dim],
                    );
                }
            }
        }
        let rest = n - 4 * quarter;
        if rest > 0 {
            for kv_head in 0..n_kv_heads {
                let column = kv_head * head_dim;
                let tile_values =
                    self.values
                        .slice(batch, first + 4 * quarter, column, rest, head_dim);
                for h in 0..group {
                    let head = kv_head * group + h;
                    simd::weighted_row_sum(
                        &scores[head * n + 4 * quarter..][..rest],
                        tile_values,
                        value_stride,
                        &mut partials[head * partial_len..][..head_dim],
                    );
                }
            }
        }
    }

    /// The earliest key the query at `position` sees.
    fn first_key(&self, position: usize) -> usize {
        self.window
            .map_or(0, |window| (position + 1).saturating_sub(window))
    }

    /// Panics unless the last element every gemm reads lies inside its buffer (the first
    /// is checked by [`Matrix::at`]), so the unchecked reads above stay in bounds.
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
        let batch = self.batch;
        self.queries.check_last(batch, self.seq, n_heads * head_dim);
        (self.keys).check_last(batch, self.start + self.seq, n_kv_heads * head_dim);
        (self.values).check_last(batch, self.start + self.seq, n_kv_heads * head_dim);
    }
}

/// `rows` entries from `at` of each of the four quarters of `scores` (`quarter` long each).
fn quarters_mut(scores: &mut [f32], quarter: usize, at: usize, rows: usize) -> [&mut [f32]; 4] {
    let (q0, rest) = scores.split_at_mut(quarter);
    let (q1, rest) = rest.split_at_mut(quarter);
    let (q2, q3) = rest.split_at_mut(quarter);
    [q0, q1, q2, q3].map(|q| &mut q[at..at + rows])
}

/// Values per head in a decoding span's partial result: the span's share of the head's
/// output, unnormalised (`head_dim`), then its largest score and its sum of
/// e^(score - largest).
fn partial_len(head_dim: usize) -> usize {
    head_dim + 2
}

/// A decoding span's scores (`n` a head) turned into softmax numerators, head by head, each
/// head's largest score and sum of numerators stored after its `head_dim` sums in
/// `partials`.
fn numerators(scores: &mut [f32], n: usize, partials: &mut [f32], head_dim: usize) {
    let heads = (scores.chunks_exact_mut(n)).zip(partials.chunks_exact_mut(partial_len(head_dim)));
    for (scores, partial) in heads {
        simd::softmax_numerators(scores, &mut partial[head_dim..]);
    }
}

thread_local! {
    /// Each thread's score rows, reused across blocks, heads and layers.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod grouped;
#[cfg(target_arch = "x86_64")]
use {avx2::Avx2, avx512::Avx512};

#[cfg(test)]
mod tests;
