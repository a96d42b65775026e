//! Vectorized element-wise math for the fused kernels: an `exp` the compiler can vectorize
//! (libm's `expf` is a scalar call per element) and row reductions in independent lanes.
//!
//! The loops are plain Rust shaped so LLVM vectorizes them (branch-free bodies, `LANES`
//! independent accumulators), and each public kernel is compiled three times, as built,
//! with AVX2 and FMA, and with AVX-512, and picks one at run time, so the same binary runs
//! on any x86-64 and uses 16-wide registers where they exist. One exception: the products
//! of several vectors at once (`dot4_x4` and its kin, a batch of decoded tokens) are written
//! with AVX-512 intrinsics, because LLVM kept their sixteen sums on the stack however the
//! plain loops were written; their plain versions, the same arithmetic, run elsewhere.

use crate::cpu::multiversioned;
use crate::stored::Stored;

/// Independent accumulators per reduction: one AVX-512 register of f32.
pub(crate) const LANES: usize = 16;

multiversioned! {
    /// Causal softmax numerators: row `r` of `scores` (rows of `width`) keeps its entries
    /// `first_seen + r - window..first_seen + r` (from 0 if that is negative) as
    /// `e^(x - max)` and zeroes the rest, and `inverse_sums[r]` gets `1 / sum` of the kept
    /// ones, so the caller can normalise after multiplying by the values. Without a sliding
    /// window, `window` is `usize::MAX`.
    pub fn causal_softmax_rows(
        scores: &mut [f32],
        width: usize,
        first_seen: usize,
        window: usize,
        inverse_sums: &mut [f32],
    ) {
        let rows = scores.chunks_exact_mut(width).zip(inverse_sums);
        for (r, (row, inverse_sum)) in rows.enumerate() {
            let end = first_seen + r;
            let (row, after) = row.split_at_mut(end);
            let (before, seen) = row.split_at_mut(end.saturating_sub(window));
            *inverse_sum = 1.0 / exp_shifted_sum(seen, max(seen));
            before.fill(0.0);
            after.fill(0.0);
        }
    }
}

multiversioned! {
    /// Softmax numerators of one row, for a caller that merges rows: `row[j]` becomes
    /// `e^(row[j] - max)` and `stats` gets `[max, sum of the new row]`.
    pub fn softmax_numerators(row: &mut [f32], stats: &mut [f32]) {
        let max = max(row);
        let sum = exp_shifted_sum(row, max);
        stats[..2].copy_from_slice(&[max, sum]);
    }
}

multiversioned! {
    /// RMSNorm of each `gamma.len()`-wide row of `x` into `out`:
    /// `x / sqrt(mean(x²) + epsilon) * gamma` (transformers' `LlamaRMSNorm`).
    pub fn rms_norm_rows(x: &[f32], gamma: &[f32], epsilon: f32, out: &mut [f32]) {
        let width = gamma.len();
        for (row, out) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
            let mut lanes = [0.0f32; LANES];
            let mut chunks = row.chunks_exact(LANES);
            for chunk in &mut chunks {
                for (lane, &v) in lanes.iter_mut().zip(chunk) {
                    *lane += v * v;
                }
            }
            let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
            let mean_square = (lanes.iter().sum::<f32>() + tail) / width as f32;
            let inverse_rms = 1.0 / (mean_square + epsilon).sqrt();
            for ((o, &v), &g) in out.iter_mut().zip(row).zip(gamma) {
                *o = v * inverse_rms * g;
            }
        }
    }
}

multiversioned! {
    /// Rotary embedding of each `cos.len()`-wide head of `x`, in place, scaled:
    /// `(x * cos + rotate_half(x) * sin) * scale`, `rotate_half(x) = cat(-x[half..], x[..half])`.
    pub fn rotary_heads(x: &mut [f32], cos: &[f32], sin: &[f32], scale: f32) {
        let half = cos.len() / 2;
        let (cos_low, cos_high) = cos.split_at(half);
        let (sin_low, sin_high) = sin.split_at(half);
        for x in x.chunks_exact_mut(cos.len()) {
            let (low, high) = x.split_at_mut(half);
            for i in 0..half {
                let (l, h) = (low[i], high[i]);
                low[i] = (l * cos_low[i] + -h * sin_low[i]) * scale;
                high[i] = (h * cos_high[i] + l * sin_high[i]) * scale;
            }
        }
    }
}

multiversioned! {
    /// `gate[i] = silu(gate[i]) * up[i]`, with `silu(x) = x / (1 + e^-x)` as in PyTorch.
    pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + exp(-*g)) * u;
        }
    }
}

multiversioned! {
    /// `gate[i] = gelu_tanh(gate[i]) * up[i]`, GELU's tanh approximation as PyTorch's
    /// `gelu(approximate="tanh")` writes it: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`,
    /// with `tanh(u) = 1 - 2 / (1 + e^2u)` (through [`exp`], which vectorizes).
    pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
        const BETA: f32 = 0.797_884_6; // sqrt(2/pi)
        const KAPPA: f32 = 0.044_715;
        for (g, &u) in gate.iter_mut().zip(up) {
            let x = *g;
            let inner = BETA * (x + KAPPA * x * x * x);
            let tanh = 1.0 - 2.0 / (1.0 + exp(2.0 * inner));
            *g = 0.5 * x * (1.0 + tanh) * u;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::{LANES, STREAMS, Stored};

    /// `super::sum_streams`: the first `len` words (a multiple of 8) of each stream.
    ///
    /// # Safety
    /// AVX-512F present; every pointer valid for `len` words.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn sum_streams(streams: [*const u64; STREAMS], len: usize) -> u64 {
        let mut sums = [_mm512_setzero_si512(); STREAMS];
        let mut i = 0;
        while i < len {
            for (sum, stream) in sums.iter_mut().zip(streams) {
                // SAFETY: i + 8 <= len words of each stream.
                let words = unsafe { _mm512_loadu_si512(stream.add(i).cast()) };
                *sum = _mm512_add_epi64(*sum, words);
            }
            i += 8;
        }
        let mut total = 0u64;
        for sum in sums {
            total = total.wrapping_add(_mm512_reduce_add_epi64(sum) as u64);
        }
        total
    }

    /// Sixteen f32 values from `p`, `W` widened exactly.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn load<W: Stored>(p: *const W) -> __m512 {
        // SAFETY (for the callers): `p` points at LANES values of W.
        unsafe {
            if size_of::<W>() == 4 {
                _mm512_loadu_ps(p.cast())
            } else {
                // The two 16-bit types: bf16 is the high half of its f32; f16 converts.
                let half = _mm256_loadu_si256(p.cast());
                if W::BF16 {
                    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16))
                } else {
                    _mm512_cvtph_ps(half)
                }
            }
        }
    }

    /// Lane `j`: the lanes of `v[j]` summed in order, as `iter().sum()` sums them for one
    /// vector alone (from -0.0, which adds nothing), by adding the registers of their
    /// transpose in order: the same adds on the same values, for sixteen sums at once in
    /// about 80 instructions instead of sixteen stores and 256 scalar loads and adds.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn sums16(v: [__m512; LANES]) -> [f32; LANES] {
        let t = transpose(v);
        let sum = t[1..].iter().fold(t[0], |sum, &t| _mm512_add_ps(sum, t));
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds LANES f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sum) };
        lanes
    }

    /// The 16 × 16 matrix whose row `j` is `r[j]`, transposed: register `k` holds lane `k`
    /// of every `r[j]`, in lane `j`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn transpose(r: [__m512; LANES]) -> [__m512; LANES] {
        // Pairs of rows interleaved within 128-bit lanes, then pairs of pairs: register
        // 4g + c holds rows 4g..4g+4 at columns c, c + 4, c + 8, c + 12 (one per lane).
        let a: [__m512; LANES] = std::array::from_fn(|i| {
            let (x, y) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(x, y)
            } else {
                _mm512_unpackhi_ps(x, y)
            }
        });
        let b: [__m512; LANES] = std::array::from_fn(|i| {
            let (g, c) = (i / 4, i % 4);
            let (x, y) = (
                _mm512_castps_pd(a[4 * g + c / 2]),
                _mm512_castps_pd(a[4 * g + 2 + c / 2]),
            );
            _mm512_castpd_ps(if c % 2 == 0 {
                _mm512_unpacklo_pd(x, y)
            } else {
                _mm512_unpackhi_pd(x, y)
            })
        });
        // Then the 128-bit lanes regrouped, so that register k holds every row's column k.
        let mut t = [_mm512_setzero_ps(); LANES];
        for c in 0..4 {
            let e0 = _mm512_shuffle_f32x4::<0x44>(b[c], b[4 + c]);
            let e1 = _mm512_shuffle_f32x4::<0xEE>(b[c], b[4 + c]);
            let f0 = _mm512_shuffle_f32x4::<0x44>(b[8 + c], b[12 + c]);
            let f1 = _mm512_shuffle_f32x4::<0xEE>(b[8 + c], b[12 + c]);
            t[c] = _mm512_shuffle_f32x4::<0x88>(e0, f0);
            t[c + 4] = _mm512_shuffle_f32x4::<0xDD>(e0, f0);
            t[c + 8] = _mm512_shuffle_f32x4::<0x88>(e1, f1);
            t[c + 12] = _mm512_shuffle_f32x4::<0xDD>(e1, f1);
        }
        t
    }

    /// `query` (a multiple of LANES long) against sixteen rows from `rows`, `stride` apart:
    /// each row's products summed in LANES lanes, then the sixteen registers added
    /// transposed (pairs of registers into one holding half of each, 16 -> 8 -> 4 -> 2 -> 1),
    /// about three shuffles and adds per row where summing each register alone takes eight.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot16<S: Stored>(
        query: &[f32],
        rows: *const S,
        stride: usize,
    ) -> [f32; LANES] {
        let mut sums = [_mm512_setzero_ps(); LANES];
        for c in (0..query.len()).step_by(LANES) {
            // SAFETY: `query` holds c + LANES values; each row `width` (the caller's promise).
            let q = unsafe { _mm512_loadu_ps(query.as_ptr().add(c)) };
            for (j, sum) in sums.iter_mut().enumerate() {
                *sum = unsafe { _mm512_fmadd_ps(load(rows.add(j * stride + c)), q, *sum) };
            }
        }
        // Pairs (j, j + 8): 128-bit quarters 0,1 of each, then 2,3, added: row j's partial
        // sums in the low 256 bits, row j + 8's in the high.
        let eight: [__m512; 8] = std::array::from_fn(|j| {
            let (a, b) = (sums[j], sums[j + 8]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            )
        });
        // Pairs (j, j + 4): quarter q then holds rows j, j + 8, j + 4, j + 12 (q = 0..4).
        let four: [__m512; 4] = std::array::from_fn(|j| {
            let (a, b) = (eight[j], eight[j + 4]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        });
        // Within each quarter, pairs (j, j + 2): two lanes per row.
        let two: [__m512; 2] = std::array::from_fn(|j| {
            let (a, b) = (four[j], four[j + 2]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        });
        let one = _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(two[0], two[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(two[0], two[1]),
        );
        // Lane L now holds row ORDER[L]; ORDER is its own inverse.
        const ORDER: [i32; LANES] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];
        let order = unsafe { _mm512_loadu_si512(ORDER.as_ptr().cast()) };
        let mut out = [0.0f32; LANES];
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), _mm512_permutexvar_ps(order, one)) };
        out
    }
}

multiversioned! {
    /// `scores[j] = query · row j of rows`, rows `stride` apart, each `query.len()` long
    /// (a query against one head's columns of the token-major KV cache).
    pub fn dot_rows<S: Stored>(query: &[f32], rows: &[S], stride: usize, scores: &mut [f32]) {
        for (j, score) in scores.iter_mut().enumerate() {
            let row = &rows[j * stride..][..query.len()];
            *score = dot(row, query);
        }
    }
}

multiversioned! {
    /// `out += Σ_j weights[j] · row j of rows`, rows `stride` apart, each `out.len()` long.
    pub fn weighted_row_sum<S: Stored>(weights: &[f32], rows: &[S], stride: usize, out: &mut [f32]) {
        let done = out.len() - out.len() % ROW_BLOCK;
        let (whole, tail) = out.split_at_mut(done);
        for (b, out) in whole.chunks_exact_mut(ROW_BLOCK).enumerate() {
            let out: &mut [f32; ROW_BLOCK] = out.try_into().expect("a whole block");
            weighted_row_block(weights, &rows[b * ROW_BLOCK..], stride, out);
        }
        for (j, &weight) in weights.iter().enumerate() {
            let row = &rows[j * stride + done..][..tail.len()];
            for (o, &v) in tail.iter_mut().zip(row) {
                *o += weight * v.widen();
            }
        }
    }
}

multiversioned! {
    /// [`dot_rows`] over four blocks of rows read together: `scores[k][j] = query · row j of
    /// rows[k]`. Four streams far apart keep more reads in flight than one (as in
    /// [`matvec_bundles`]), and the four sums are independent.
    pub fn dot_rows4<S: Stored>(query: &[f32], rows: [&[S]; 4], stride: usize, scores: [&mut [f32]; 4]) {
        let width = query.len();
        #[cfg(target_arch = "x86_64")]
        if width.is_multiple_of(LANES) && crate::cpu::tier() >= crate::cpu::Tier::Avx512 {
            // Sixteen rows at a time, their sums added transposed (see `avx512::dot16`).
            for (rows, scores) in rows.iter().zip(scores) {
                let whole = scores.len() - scores.len() % LANES;
                let (blocks, rest) = scores.split_at_mut(whole);
                for (b, block) in blocks.chunks_exact_mut(LANES).enumerate() {
                    let first = b * LANES * stride;
                    assert!(rows.len() >= first + (LANES - 1) * stride + width);
                    let block: &mut [f32; LANES] = block.try_into().expect("a whole register");
                    // SAFETY: the AVX-512 tier was just checked; the sixteen rows, `stride` apart
                    // from `first`, each `width` long, lie inside `rows` (asserted).
                    *block = unsafe { avx512::dot16(query, rows[first..].as_ptr(), stride) };
                }
                for (j, score) in rest.iter_mut().enumerate() {
                    *score = dot(&rows[(whole + j) * stride..][..width], query);
                }
            }
            return;
        }
        let [s0, s1, s2, s3] = scores;
        let row = |k: usize, j: usize| &rows[k][j * stride..][..width];
        for (j, (((s0, s1), s2), s3)) in s0.iter_mut().zip(s1).zip(s2).zip(s3).enumerate() {
            let block = [row(0, j), row(1, j), row(2, j), row(3, j)];
            [*s0, *s1, *s2, *s3] = if width.is_multiple_of(LANES) {
                dot4_pairwise(block, query)
            } else {
                block.map(|row| dot(row, query))
            };
        }
    }
}

multiversioned! {
    /// [`weighted_row_sum`] over four blocks of rows read together:
    /// `out += Σ_k Σ_j weights[k][j] · row j of rows[k]`.
    pub fn weighted_row_sum4<S: Stored>(weights: [&[f32]; 4], rows: [&[S]; 4], stride: usize, out: &mut [f32]) {
        let done = out.len() - out.len() % ROW_BLOCK;
        let (whole, tail) = out.split_at_mut(done);
        for (b, out) in whole.chunks_exact_mut(ROW_BLOCK).enumerate() {
            let out: &mut [f32; ROW_BLOCK] = out.try_into().expect("a whole block");
            let mut sums = [[0.0f32; ROW_BLOCK]; 4];
            for j in 0..weights[0].len() {
                for k in 0..4 {
                    let row: &[S; ROW_BLOCK] = rows[k][j * stride + b * ROW_BLOCK..][..ROW_BLOCK]
                        .try_into()
                        .expect("a whole block");
                    let weight = weights[k][j];
                    for i in 0..ROW_BLOCK {
                        sums[k][i] += weight * row[i].widen();
                    }
                }
            }
            for i in 0..ROW_BLOCK {
                out[i] += (sums[0][i] + sums[1][i]) + (sums[2][i] + sums[3][i]);
            }
        }
        for k in 0..4 {
            for (j, &weight) in weights[k].iter().enumerate() {
                let row = &rows[k][j * stride + done..][..tail.len()];
                for (o, &v) in tail.iter_mut().zip(row) {
                    *o += weight * v.widen();
                }
            }
        }
    }
}

/// Columns per block of [`weighted_row_sum`]: four registers, a 64-wide head in one block.
const ROW_BLOCK: usize = 4 * LANES;

/// One block of [`weighted_row_sum`], summed in fixed-size arrays the compiler keeps in
/// registers (summing into `out` directly stores and reloads it for every row), two rows
/// at a time so consecutive adds do not wait on each other.
#[inline(always)]
fn weighted_row_block<S: Stored>(
    weights: &[f32],
    rows: &[S],
    stride: usize,
    out: &mut [f32; ROW_BLOCK],
) {
    let mut sums = [[0.0f32; ROW_BLOCK]; 2];
    for (j, &weight) in weights.iter().enumerate() {
        let row: &[S; ROW_BLOCK] = rows[j * stride..][..ROW_BLOCK]
            .try_into()
            .expect("a whole block");
        let sum = &mut sums[j % 2];
        for i in 0..ROW_BLOCK {
            sum[i] += weight * row[i].widen();
        }
    }
    for i in 0..ROW_BLOCK {
        out[i] += sums[0][i] + sums[1][i];
    }
}

/// `a · b` (of equal lengths) over `LANES` partial sums. Spelled out over whole registers:
/// written with chunk iterators, LLVM vectorized it two lanes wide where it was inlined
/// into `dot_rows`.
#[inline(always)]
pub(crate) fn dot<W: Stored>(a: &[W], b: &[f32]) -> f32 {
    let whole = b.len() - b.len() % LANES;
    let tail: f32 = (a[whole..].iter().zip(&b[whole..]))
        .map(|(a, b)| a.widen() * b)
        .sum();
    let mut lanes = [0.0f32; LANES];
    for c in (0..whole).step_by(LANES) {
        let a: &[W; LANES] = a[c..c + LANES].try_into().expect("a whole register");
        let b: &[f32; LANES] = b[c..c + LANES].try_into().expect("a whole register");
        for i in 0..LANES {
            lanes[i] += a[i].widen() * b[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Four dot products for attention's scores, which need no fixed order of summation: each
/// row's partial sums are added pairwise (halves, then quarters, ...), a few shuffles where
/// the lane-ordered sum of `dot4_vectors!` is a chain of fifteen dependent adds, and the four
/// rows' sums are four named arrays, which LLVM keeps in registers (one 2-D array it kept
/// on the stack when inlined into `dot_rows4`, a store and reload per add).
#[inline(always)]
fn dot4_pairwise<W: Stored>(rows: [&[W]; 4], x: &[f32]) -> [f32; 4] {
    let (mut l0, mut l1, mut l2, mut l3) =
        ([0.0f32; LANES], [0.0; LANES], [0.0; LANES], [0.0; LANES]);
    for c in (0..x.len()).step_by(LANES) {
        let xs: &[f32; LANES] = x[c..c + LANES].try_into().expect("a whole register");
        let w = rows
            .map(|row| -> &[W; LANES] { row[c..c + LANES].try_into().expect("a whole register") });
        for i in 0..LANES {
            l0[i] += w[0][i].widen() * xs[i];
            l1[i] += w[1][i].widen() * xs[i];
            l2[i] += w[2][i].widen() * xs[i];
            l3[i] += w[3][i].widen() * xs[i];
        }
    }
    [l0, l1, l2, l3].map(|mut lanes| {
        let mut half = LANES / 2;
        while half > 0 {
            for i in 0..half {
                lanes[i] += lanes[i + half];
            }
            half /= 2;
        }
        lanes[0]
    })
}

/// `e^x` to within 2 ulp for `x` in [-87, 88] (clamped outside it: `exp(-inf)` is
/// 1e-38, not 0, which no softmax or sigmoid here can tell apart).
///
/// Cephes' `expf`: `x = n ln2 + r` with `|r| <= ln2 / 2`, a degree-6 polynomial for `e^r`,
/// and `2^n` built directly in the exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to the nearest integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // The low bits of `shifted` hold n (two's complement, |n| <= 127): 2^n = (n + 127) << 23.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    e_r * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// Largest element of `row` (`-inf` for an empty row).
#[inline(always)]
pub fn max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    tail.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// Replaces every `x` in `row` by `e^(x - shift)` and returns their sum.
#[inline(always)]
pub fn exp_shifted_sum(row: &mut [f32], shift: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *x = exp(*x - shift);
            *lane += *x;
        }
    }
    let mut tail_sum = 0.0;
    for x in chunks.into_remainder() {
        *x = exp(*x - shift);
        tail_sum += *x;
    }
    lanes.iter().sum::<f32>() + tail_sum
}

multiversioned! {
    /// Each token's weight at a temperature, `weights[i] = e^((logits[i] - max) /
    /// temperature)` with `max` the largest logit (NaN logits aside), and their sum: a
    /// sampler's unnormalised probabilities. Exactly 1 for the tokens at `max` (also when
    /// it is infinite, or the temperature subnormal); exactly 0 for a NaN logit, for
    /// `-inf` (a token a grammar masked) and wherever the exponent is below -87 (where
    /// [`exp`] clamps: no draw against a sum of at least 1 can land on such a token, and
    /// a nonzero weight could make it one a draw past the sum's rounding falls to); else
    /// [`exp`], within 2 ulp. The exponent is taken in f64, where neither the gap (up to
    /// twice f32's largest) nor its quotient by a subnormal temperature overflows, and is
    /// at most 0.
    pub fn temperature_weights(logits: &[f32], max: f32, temperature: f32, weights: &mut [f32]) -> f32 {
        assert_eq!(logits.len(), weights.len());
        let inverse = 1.0 / f64::from(temperature);
        let weight = |logit: f32| {
            let x = (f64::from(logit) - f64::from(max)) * inverse;
            if logit == max {
                1.0
            } else if x >= -87.0 {
                exp(x as f32)
            } else {
                0.0
            }
        };
        let mut lanes = [0.0f32; LANES];
        let mut chunks = logits.chunks_exact(LANES).zip(weights.chunks_exact_mut(LANES));
        for (logits, weights) in &mut chunks {
            for ((lane, w), &logit) in lanes.iter_mut().zip(weights).zip(logits) {
                *w = weight(logit);
                *lane += *w;
            }
        }
        let whole = logits.len() / LANES * LANES;
        let mut sum = lanes.iter().sum::<f32>();
        for (w, &logit) in weights[whole..].iter_mut().zip(&logits[whole..]) {
            *w = weight(logit);
            sum += *w;
        }
        sum
    }
}

/// Streams [`sum_streams`] reads side by side.
pub const STREAMS: usize = 8;

/// The wrapping sum of every word of `streams`, read side by side 64 bytes of each at a
/// time: memory read as the weight kernels read it (several rows far apart at once, at the
/// widest loads), so a bandwidth probe built on it measures what decoding can draw. At
/// baseline x86-64, adding the words took longer than reading them; 4 KiB of one stream
/// and then the next read half as fast; and LLVM left the plain loop scalar, so the
/// AVX-512 tier has it in intrinsics.
pub fn sum_streams(streams: [&[u64]; STREAMS]) -> u64 {
    const LANES: usize = 8;
    let len = streams.iter().map(|s| s.len()).min().unwrap_or(0) / LANES * LANES;
    let tails = streams.iter().flat_map(|s| &s[len..]);
    let tail = tails.fold(0u64, |a, &b| a.wrapping_add(b));
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::tier() >= crate::cpu::Tier::Avx512 {
        // SAFETY: the AVX-512 tier was just checked; each stream holds `len` words.
        return tail
            .wrapping_add(unsafe { avx512::sum_streams(streams.map(<[u64]>::as_ptr), len) });
    }
    let mut sum = tail;
    for i in (0..len).step_by(LANES) {
        for stream in &streams {
            sum = (stream[i..i + LANES].iter()).fold(sum, |a, &b| a.wrapping_add(b));
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// The probe's sum is every word's, whatever the streams' lengths (the shortest
    /// sets how far they are read side by side; the rest are summed after).
    #[test]
    fn sum_streams_adds_every_word() {
        let words: Vec<u64> = (0..5000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        for lens in [[600; STREAMS], [601, 17, 0, 9, 800, 64, 65, 3]] {
            let mut at = 0;
            let streams: [&[u64]; STREAMS] = std::array::from_fn(|i| {
                at += lens[i];
                &words[at - lens[i]..at]
            });
            let want = words[..at].iter().fold(0u64, |a, &b| a.wrapping_add(b));
            assert_eq!(sum_streams(streams), want, "{lens:?}");
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm_over_its_range() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x <= 88.0 {
            worst = worst.max(ulps(exp(x), x.exp()));
            x += 0.000_37;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
        assert!(exp(-1000.0) < 1e-37);
    }

    #[test]
    fn kernels_match_their_scalar_definitions() {
        let width = 1000;
        let row: Vec<f32> = (0..width)
            .map(|i| ((i * 37) % 101) as f32 * 0.13 - 6.0)
            .collect();
        let (rows, first_seen) = (3, 990);
        // No window, a window shorter than every row, and one that only the last rows pass.
        for window in [usize::MAX, 300, 991] {
            let mut scores = row.repeat(rows);
            let mut inverse_sums = [0.0; 3];
            causal_softmax_rows(&mut scores, width, first_seen, window, &mut inverse_sums);
            for (r, out) in scores.chunks(width).enumerate() {
                let end = first_seen + r;
                let seen = end.saturating_sub(window)..end;
                let max = row[seen.clone()].iter().copied().fold(f32::MIN, f32::max);
                let exact: Vec<f32> = row[seen.clone()].iter().map(|x| (x - max).exp()).collect();
                for (a, b) in out[seen.clone()].iter().zip(&exact) {
                    assert!(ulps(*a, *b) <= 2, "{a} vs {b}");
                }
                assert!(out[end..].iter().all(|&x| x == 0.0));
                assert!(out[..seen.start].iter().all(|&x| x == 0.0));
                let sum: f32 = exact.iter().sum();
                assert!((1.0 / inverse_sums[r] - sum).abs() <= 1e-5 * sum);
            }
        }
        // Attention's row kernels: a query against rows `stride` apart, and back; 70 columns
        // are one whole block of weighted_row_sum and a tail.
        let (n_rows, stride, width) = (9, 100, 70);
        let rows: Vec<f32> = (0..n_rows * stride)
            .map(|i| (i % 11) as f32 - 5.0)
            .collect();
        let query: Vec<f32> = (0..width).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut scores = vec![0.0; n_rows];
        dot_rows(&query, &rows, stride, &mut scores);
        let mut summed = vec![0.0; width];
        weighted_row_sum(&scores, &rows, stride, &mut summed);
        for (j, score) in scores.iter().enumerate() {
            let row = &rows[j * stride..][..width];
            let want: f32 = row.iter().zip(&query).map(|(a, b)| a * b).sum();
            assert_eq!(*score, want, "small integers: exact in any order");
        }
        for (c, got) in summed.iter().enumerate() {
            let want: f32 = (0..n_rows).map(|j| scores[j] * rows[j * stride + c]).sum();
            assert_eq!(*got, want, "column {c}");
        }
        // The same rows as four streams of two (the ninth is not read), stored as bf16.
        let narrow: Vec<half::bf16> = rows.iter().map(|&x| half::bf16::narrow(x)).collect();
        let streams = [0, 2, 4, 6].map(|j| &narrow[j * stride..]);
        let mut quarters = [[0.0f32; 2]; 4];
        let [q0, q1, q2, q3] = &mut quarters;
        dot_rows4(&query, streams, stride, [q0, q1, q2, q3]);
        assert_eq!(quarters.concat(), scores[..8]);
        let mut summed4 = vec![0.0; width];
        let weights = [0, 1, 2, 3].map(|k| &quarters[k][..]);
        weighted_row_sum4(weights, streams, stride, &mut summed4);
        for (c, got) in summed4.iter().enumerate() {
            let want: f32 = (0..8).map(|j| scores[j] * rows[j * stride + c]).sum();
            assert_eq!(*got, want, "column {c} of four streams");
        }
        // Whole registers wide, 37 rows per stream: two blocks of sixteen (summed transposed
        // with AVX-512) and a tail; small integers, so exact in any order.
        let (width, stride, per_stream) = (64, 80, 37);
        let rows: Vec<f32> = (0..4 * per_stream * stride)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let query: Vec<f32> = (0..width).map(|i| (i % 9) as f32 - 4.0).collect();
        let streams = [0, 1, 2, 3].map(|k| &rows[k * per_stream * stride..]);
        let mut got = [[0.0f32; 37]; 4];
        let [g0, g1, g2, g3] = &mut got;
        dot_rows4(&query, streams, stride, [g0, g1, g2, g3]);
        for (k, got) in got.iter().enumerate() {
            for (j, got) in got.iter().enumerate() {
                let row = &streams[k][j * stride..][..width];
                let want: f32 = row.iter().zip(&query).map(|(a, b)| a * b).sum();
                assert_eq!(*got, want, "stream {k}, row {j}");
            }
        }
        let gamma: Vec<f32> = (0..40).map(|i| 0.5 + i as f32 * 0.01).collect();
        let mut normed = vec![0.0; 1000];
        rms_norm_rows(&row, &gamma, 1e-5, &mut normed);
        for ((x, out), gamma) in row
            .chunks(40)
            .zip(normed.chunks(40))
            .zip([&gamma].repeat(25))
        {
            let rms = (x.iter().map(|v| (v * v) as f64).sum::<f64>() / 40.0 + 1e-5).sqrt();
            for ((v, o), g) in x.iter().zip(out).zip(gamma) {
                let want = *v as f64 / rms * *g as f64;
                assert!(
                    (*o as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "{o} vs {want}"
                );
            }
        }
        let mut gate = row.clone();
        silu_mul(&mut gate, &row);
        for ((s, g), u) in gate.iter().zip(&row).zip(&row) {
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (s - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{s} vs {want}"
            );
        }
        // GELU-tanh over [-12, 12] (past that tanh is ±1 in f32) and beyond, against f64.
        let xs: Vec<f32> = (-1300..1300).map(|i| i as f32 * 0.01).collect();
        let mut gate = xs.clone();
        gelu_tanh_mul(&mut gate, &vec![1.0; xs.len()]);
        for (&got, &x) in gate.iter().zip(&xs) {
            let x = x as f64;
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            let want = 0.5 * x * (1.0 + inner.tanh());
            assert!(
                (got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "gelu_tanh({x}) = {got}, want {want}"
            );
        }
    }
}
