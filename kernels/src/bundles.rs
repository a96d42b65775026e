//! Matrix-vector products four rows at a time ("bundles") over f32, bf16 or ggml-block
//! weights, for one vector or a batch of them: the unit of work [`crate::matvec`] shares
//! among threads. Each product is summed exactly as for one vector alone, so a sequence's
//! output does not depend on the batch it is in.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cpu::multiversioned;
use crate::quant::BlockType;
use crate::simd::{LANES, dot};
use crate::stored::Stored;

/// Bundles in a product of `rows` output rows, the unit [`matvec_bundles`] works in: one
/// per four rows, and one per row left over.
pub fn matvec_bundle_count(rows: usize) -> usize {
    rows / 4 + rows % 4
}

multiversioned! {
    /// Part of the products of a matrix with `n` vectors, over rows: `out[b stride + j] =
    /// weight row j · x_b`, where `weight` holds `rows` rows of `d_in` (a `[d_in, rows]`
    /// weight stored column-major), `xs` the `n` vectors `x_b` of `d_in` one after another,
    /// `out` their products, each vector's `stride` apart: the rows of `bundles`. With
    /// `q = rows / 4`,
    /// bundle `s < q` is the rows `s`, `q + s`, `2q + s` and `3q + s`, and bundle `q + i` the
    /// leftover row `4q + i`.
    ///
    /// Four rows at a time, so each load of an `x` feeds four multiply-adds, and the four are
    /// taken from the four quarters of the matrix: four sequential streams far apart keep
    /// more reads in flight than four neighbouring rows do (docs/BENCHMARKS.md). Several
    /// vectors (a batch of sequences, each decoding a token) share each load of the weights:
    /// one pass over the matrix for all of them. Each product is summed exactly as for one
    /// vector alone (the same multiplies and adds in the same order), so a sequence's output
    /// does not depend on what else is in the batch.
    /// `out` is atomic so that threads can share a product's rows (`matvec`); the stores are
    /// relaxed, plain stores on x86.
    pub fn matvec_bundles(
        weight: &[f32],
        xs: &[f32],
        d_in: usize,
        out: &[AtomicU32],
        stride: usize,
        bundles: Range<usize>,
    ) {
        bundles_of(weight, xs, d_in, out, stride, bundles)
    }
}

multiversioned! {
    /// [`matvec_bundles`] over bf16 weights, widened in registers: the same results, bit for
    /// bit, as over their f32 values.
    pub fn matvec_bundles_bf16(
        weight: &[half::bf16],
        xs: &[f32],
        d_in: usize,
        out: &[AtomicU32],
        stride: usize,
        bundles: Range<usize>,
    ) {
        bundles_of(weight, xs, d_in, out, stride, bundles)
    }
}

multiversioned! {
    /// [`BlockType::decode`] compiled for the widest vectors the CPU has (its loops are
    /// written for the compiler to vectorize).
    pub fn decode_blocks(ty: BlockType, blocks: &[u8], out: &mut [f32]) {
        ty.decode(blocks, out)
    }
}

multiversioned! {
    /// [`matvec_bundles`] over quantized weights, rows of `ty` blocks: the same results, bit
    /// for bit, as over the f32 values the blocks decode to.
    pub fn matvec_bundles_blocks(
        ty: BlockType,
        weight: &[u8],
        xs: &[f32],
        d_in: usize,
        out: &[AtomicU32],
        stride: usize,
        bundles: Range<usize>,
    ) {
        block_bundles_of(ty, weight, xs, d_in, out, stride, bundles)
    }
}

/// Four dot products of the same four rows with each of several vectors (a multiple of
/// `LANES` long), each over `LANES` partial sums added in lane order: `[[f32; 4]; n]`, one
/// array per vector. Written as a macro so that each vector's sums are a variable of its
/// own, which LLVM keeps in registers (an array of them indexed in a loop it kept on the
/// stack). A vector's four sums do not depend on the other vectors.
macro_rules! dot4_vectors {
    ($rows:expr; $($x:expr => $sums:ident),+) => {{
        let [r0, r1, r2, r3] = $rows;
        $(let mut $sums = [[0.0f32; LANES]; 4];)+
        let rows = r0.chunks_exact(LANES).zip(r1.chunks_exact(LANES));
        let rows = rows.zip(r2.chunks_exact(LANES)).zip(r3.chunks_exact(LANES));
        for (c, (((w0, w1), w2), w3)) in rows.enumerate() {
            $(
                let x: &[f32] = &$x[c * LANES..][..LANES];
                for i in 0..LANES {
                    $sums[0][i] = w0[i].widen().mul_add(x[i], $sums[0][i]);
                    $sums[1][i] = w1[i].widen().mul_add(x[i], $sums[1][i]);
                    $sums[2][i] = w2[i].widen().mul_add(x[i], $sums[2][i]);
                    $sums[3][i] = w3[i].widen().mul_add(x[i], $sums[3][i]);
                }
            )+
        }
        [$($sums.map(|lanes| lanes.iter().sum::<f32>())),+]
    }};
}

/// Four rows' dot products with each of up to [`MOST_VECTORS`] vectors (`out[v]`: the
/// four sums of `xs[v]`), each as [`dot4_vectors!`] makes it. With AVX-512, in one pass,
/// through intrinsics (LLVM kept the sums of plain Rust on the stack, a store and reload per
/// add, however it was written): each load and widening of the weights serves every vector,
/// so a verify pass of five to seven rows, or a batch of that many sequences, costs little
/// more than one of four (docs/BENCHMARKS.md). Otherwise four vectors at a time, the last
/// pass repeating its last vector, or one. The same multiplies and adds in the same order
/// either way (a multiply, then an add, per lane; the lanes summed in order), so the same
/// bits.
#[inline(always)]
fn dot4_xk<W: Stored>(rows: [&[W]; 4], xs: &[&[f32]], out: &mut [[f32; 4]]) {
    assert!(out.len() == xs.len() && xs.len() <= MOST_VECTORS);
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::tier() >= crate::cpu::Tier::Avx512 {
        let d_in = xs[0].len();
        assert!(rows.iter().all(|r| r.len() >= d_in) && xs.iter().all(|x| x.len() == d_in));
        assert!(d_in.is_multiple_of(LANES));
        let rows = rows.map(<[W]>::as_ptr);
        let x = |v: usize| xs[v].as_ptr();
        // SAFETY: the AVX-512 tier was just checked; every row and vector holds `d_in`
        // values, a multiple of LANES.
        unsafe {
            match xs.len() {
                1 => out.copy_from_slice(&avx512::dot4_x1(rows, [x(0)], d_in)),
                2 => out.copy_from_slice(&avx512::dot4_x2(rows, [x(0), x(1)], d_in)),
                3 => out.copy_from_slice(&avx512::dot4_x3(rows, [x(0), x(1), x(2)], d_in)),
                4 => out.copy_from_slice(&avx512::dot4_x4(rows, std::array::from_fn(x), d_in)),
                5 => out.copy_from_slice(&avx512::dot4_x5(rows, std::array::from_fn(x), d_in)),
                6 => out.copy_from_slice(&avx512::dot4_x6(rows, std::array::from_fn(x), d_in)),
                _ => out.copy_from_slice(&avx512::dot4_x7(rows, std::array::from_fn(x), d_in)),
            }
        }
        return;
    }
    for (xs, out) in xs
        .chunks(VECTORS_PER_PASS)
        .zip(out.chunks_mut(VECTORS_PER_PASS))
    {
        if let [x] = xs {
            out[0] = dot4_vectors!(rows; x => s0)[0];
            continue;
        }
        // A pass of fewer than four vectors repeats its last one.
        let x = |v: usize| xs[v.min(xs.len() - 1)];
        let four = dot4_vectors!(rows; x(0) => s0, x(1) => s1, x(2) => s2, x(3) => s3);
        out.copy_from_slice(&four[..xs.len()]);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use crate::simd::LANES;
    use crate::simd::avx512::{load, sums16};
    use crate::stored::Stored;

    /// Hints into L1 the cache line `at` values into each of `rows`: called with `at` a row
    /// further on, the next bundle's rows at the place being read (a share's rows follow one
    /// another, so the streams stay the same). Without it one to seven vectors' decoding fell
    /// well short of the bandwidth (docs/BENCHMARKS.md, session 21).
    #[inline(always)]
    pub(crate) fn fetch_next<W, const R: usize>(rows: [*const W; R], at: usize) {
        for row in rows {
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(at).cast()) };
        }
    }

    /// See [`super::dot4_xk`]: `$k` vectors, four sums each, every sum a variable of its own
    /// (LLVM kept arrays of them partly on the stack); the first four vectors' sums added up
    /// by one [`sums16`], any others by a [`sums4`] each (the same adds in the same order).
    macro_rules! dot4_many {
        ($name:ident, $k:literal; $($v:literal => $a0:ident $a1:ident $a2:ident $a3:ident),+) => {
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn $name<W: Stored>(
                [r0, r1, r2, r3]: [*const W; 4],
                xs: [*const f32; $k],
                d_in: usize,
            ) -> [[f32; 4]; $k] {
                let zero = _mm512_setzero_ps();
                $(let (mut $a0, mut $a1, mut $a2, mut $a3) = (zero, zero, zero, zero);)+
                let mut c = 0;
                while c < d_in {
                    fetch_next([r0, r1, r2, r3], c + d_in);
                    // SAFETY: c + LANES <= d_in, which every pointer holds.
                    unsafe {
                        let (w0, w1, w2, w3) =
                            (load(r0.add(c)), load(r1.add(c)), load(r2.add(c)), load(r3.add(c)));
                        $(
                            let x = _mm512_loadu_ps(xs[$v].add(c));
                            $a0 = _mm512_fmadd_ps(w0, x, $a0);
                            $a1 = _mm512_fmadd_ps(w1, x, $a1);
                            $a2 = _mm512_fmadd_ps(w2, x, $a2);
                            $a3 = _mm512_fmadd_ps(w3, x, $a3);
                        )+
                    }
                    c += LANES;
                }
                let sums = [$([$a0, $a1, $a2, $a3]),+];
                let mut out = [[0.0f32; 4]; $k];
                let mut v = 0;
                if $k >= 4 {
                    let four = sums16(std::array::from_fn(|i| sums[i / 4][i % 4]));
                    for (v, out) in out.iter_mut().take(4).enumerate() {
                        *out = std::array::from_fn(|row| four[4 * v + row]);
                    }
                    v = 4;
                }
                while v < $k {
                    out[v] = sums4(sums[v]);
                    v += 1;
                }
                out
            }
        };
    }
    dot4_many!(dot4_x1, 1; 0 => a0 a1 a2 a3);
    dot4_many!(dot4_x2, 2; 0 => a0 a1 a2 a3, 1 => b0 b1 b2 b3);
    dot4_many!(dot4_x3, 3; 0 => a0 a1 a2 a3, 1 => b0 b1 b2 b3, 2 => c0 c1 c2 c3);
    dot4_many!(dot4_x4, 4; 0 => a0 a1 a2 a3, 1 => b0 b1 b2 b3, 2 => c0 c1 c2 c3,
        3 => d0 d1 d2 d3);
    dot4_many!(dot4_x5, 5; 0 => a0 a1 a2 a3, 1 => b0 b1 b2 b3, 2 => c0 c1 c2 c3,
        3 => d0 d1 d2 d3, 4 => e0 e1 e2 e3);
    dot4_many!(dot4_x6, 6; 0 => a0 a1 a2 a3, 1 => b0 b1 b2 b3, 2 => c0 c1 c2 c3,
        3 => d0 d1 d2 d3, 4 => e0 e1 e2 e3, 5 => f0 f1 f2 f3);
    dot4_many!(dot4_x7, 7; 0 => a0 a1 a2 a3, 1 => b0 b1 b2 b3, 2 => c0 c1 c2 c3,
        3 => d0 d1 d2 d3, 4 => e0 e1 e2 e3, 5 => f0 f1 f2 f3, 6 => g0 g1 g2 g3);

    /// Lane `r`: the lanes of `v[r]` summed in order, as `iter().sum()` sums them (as
    /// [`sums16`] does for sixteen): the four registers transposed into sixteen quarters
    /// (quarter `k` holding lane `k` of each), then added in lane order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sums4(v: [__m512; 4]) -> [f32; 4] {
        let (low01, high01) = (
            _mm512_unpacklo_ps(v[0], v[1]),
            _mm512_unpackhi_ps(v[0], v[1]),
        );
        let (low23, high23) = (
            _mm512_unpacklo_ps(v[2], v[3]),
            _mm512_unpackhi_ps(v[2], v[3]),
        );
        let (low01, high01) = (_mm512_castps_pd(low01), _mm512_castps_pd(high01));
        let (low23, high23) = (_mm512_castps_pd(low23), _mm512_castps_pd(high23));
        // Register k's 128-bit block b: lane 4b + k of v[0..4].
        let t = [
            _mm512_castpd_ps(_mm512_unpacklo_pd(low01, low23)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(low01, low23)),
            _mm512_castpd_ps(_mm512_unpacklo_pd(high01, high23)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(high01, high23)),
        ];
        // Written out, not a closure: one would be compiled without the target features.
        let mut q = [[_mm_setzero_ps(); 4]; 4];
        for (q, &t) in q.iter_mut().zip(&t) {
            *q = [
                _mm512_castps512_ps128(t),
                _mm512_extractf32x4_ps::<1>(t),
                _mm512_extractf32x4_ps::<2>(t),
                _mm512_extractf32x4_ps::<3>(t),
            ];
        }
        let mut sum = q[0][0];
        for lane in 1..LANES {
            sum = _mm_add_ps(sum, q[lane % 4][lane / 4]);
        }
        let mut sums = [0.0f32; 4];
        // SAFETY: `sums` holds four f32.
        unsafe { _mm_storeu_ps(sums.as_mut_ptr(), sum) };
        sums
    }
}

/// Vectors per pass over a bundle's rows in [`matvec_bundles`] below AVX-512: four rows'
/// sums for each of four vectors are sixteen registers.
const VECTORS_PER_PASS: usize = 4;

/// Most vectors per pass with AVX-512: four rows' sums for each of seven are 28 of its 32
/// registers, with the four rows' values beside them. (Eight vectors as two rows at a
/// time, sixteen sums, measured no faster than two passes of four.)
const MOST_VECTORS: usize = 7;

/// The body of [`matvec_bundles`] for any weight element.
#[inline(always)]
fn bundles_of<W: Stored>(
    weight: &[W],
    xs: &[f32],
    d_in: usize,
    out: &[AtomicU32],
    stride: usize,
    bundles: Range<usize>,
) {
    let quarter = weight.len() / d_in / 4;
    let row = |j: usize| &weight[j * d_in..][..d_in];
    let products = Products {
        xs,
        d_in,
        out,
        stride,
    };
    for s in bundles {
        if s < quarter {
            let rows = [0, 1, 2, 3].map(|k| k * quarter + s);
            products.four(rows.map(row), rows);
        } else {
            // Leftover bundle s is row 4q + (s - q).
            let j = 3 * quarter + s;
            products.one(row(j), j);
        }
    }
}

/// The body of [`matvec_bundles_blocks`]: each bundle's rows decoded into f32 (the values
/// they stand for, exactly), then taken as f32 rows are.
#[inline(always)]
fn block_bundles_of(
    ty: BlockType,
    weight: &[u8],
    xs: &[f32],
    d_in: usize,
    out: &[AtomicU32],
    stride: usize,
    bundles: Range<usize>,
) {
    let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
    let quarter = weight.len() / row_bytes / 4;
    let row = |j: usize| &weight[j * row_bytes..][..row_bytes];
    let products = Products {
        xs,
        d_in,
        out,
        stride,
    };
    // The block kernels cover the kept types; any other decodes below, as on any CPU.
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::tier() >= crate::cpu::Tier::Avx512 && ty.kept() {
        for s in bundles.start.min(quarter)..bundles.end.min(quarter) {
            let rows = [0, 1, 2, 3].map(|k| k * quarter + s);
            let mut store = |b: usize, k: usize, value: f32| products.store(b, rows[k], value);
            // SAFETY: the AVX-512 tier was just checked; each row holds d_in values (whole
            // blocks, as row_bytes checked) and xs whole vectors of d_in.
            unsafe {
                crate::block_products::avx512::four(
                    ty,
                    rows.map(|j| row(j).as_ptr()),
                    xs,
                    d_in,
                    &mut store,
                )
            };
        }
        // Rows past the quarters (at most three per product): decoded, then as f32 rows.
        for s in bundles.start.max(quarter)..bundles.end {
            let j = 3 * quarter + s;
            let mut decoded = DECODED.take();
            decoded.resize(d_in, 0.0);
            ty.decode(row(j), &mut decoded);
            products.one(&decoded, j);
            DECODED.set(decoded);
        }
        return;
    }
    // Taken out of the thread-local rather than borrowed in a closure: a closure is
    // compiled without its caller's target features, and would run the portable sums.
    let mut decoded = DECODED.take();
    decoded.resize(4 * d_in, 0.0);
    for s in bundles {
        if s < quarter {
            let rows = [0, 1, 2, 3].map(|k| k * quarter + s);
            for (k, &j) in rows.iter().enumerate() {
                ty.decode(row(j), &mut decoded[k * d_in..][..d_in]);
            }
            let block = [0, 1, 2, 3].map(|k| &decoded[k * d_in..][..d_in]);
            products.four(block, rows);
        } else {
            let j = 3 * quarter + s;
            ty.decode(row(j), &mut decoded[..d_in]);
            products.one(&decoded[..d_in], j);
        }
    }
    DECODED.set(decoded);
}

thread_local! {
    /// The calling thread's decoded rows of quantized weights (`block_bundles_of`).
    static DECODED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Where [`matvec_bundles`] puts its products: every vector of `xs` times given rows.
struct Products<'a> {
    xs: &'a [f32],
    d_in: usize,
    out: &'a [AtomicU32],
    stride: usize,
}

impl Products<'_> {
    #[inline(always)]
    fn store(&self, b: usize, j: usize, value: f32) {
        self.out[b * self.stride + j].store(value.to_bits(), Ordering::Relaxed)
    }

    #[inline(always)]
    fn x(&self, b: usize) -> &[f32] {
        &self.xs[b * self.d_in..][..self.d_in]
    }

    /// Row `j`, `row`, times every vector.
    #[inline(always)]
    fn one<W: Stored>(&self, row: &[W], j: usize) {
        for b in 0..self.xs.len() / self.d_in {
            self.store(b, j, dot(row, self.x(b)));
        }
    }

    /// Rows `rows`, `block`, times every vector: in passes of at most [`MOST_VECTORS`]
    /// vectors, as even as can be (ten as five and five, not seven and three).
    #[inline(always)]
    fn four<W: Stored>(&self, block: [&[W]; 4], rows: [usize; 4]) {
        let n = self.xs.len() / self.d_in;
        if !self.d_in.is_multiple_of(LANES) {
            for (row, j) in block.into_iter().zip(rows) {
                self.one(row, j);
            }
            return;
        }
        let passes = n.div_ceil(MOST_VECTORS);
        let mut b = 0;
        for pass in 0..passes {
            let count = (n - b).div_ceil(passes - pass);
            let xs: [&[f32]; MOST_VECTORS] = std::array::from_fn(|v| self.x(b + v.min(count - 1)));
            let mut sums = [[0.0f32; 4]; MOST_VECTORS];
            dot4_xk(block, &xs[..count], &mut sums[..count]);
            for (v, sums) in sums[..count].iter().enumerate() {
                for (&j, &value) in rows.iter().zip(sums) {
                    self.store(b + v, j, value);
                }
            }
            b += count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_bundles_match_their_definition() {
        let (d_in, d_out) = (37, 11); // neither a multiple of the lanes nor of 4 rows
        let weight: Vec<f32> = (0..d_in * d_out).map(|i| (i % 13) as f32 - 6.0).collect();
        let x: Vec<f32> = (0..d_in).map(|i| i as f32 * 0.5).collect();
        let out: Vec<AtomicU32> = (0..d_out).map(|_| AtomicU32::new(0)).collect();
        let bundles = matvec_bundle_count(d_out);
        matvec_bundles(&weight, &x, d_in, &out, d_out, 0..bundles / 2);
        matvec_bundles(&weight, &x, d_in, &out, d_out, bundles / 2..bundles);
        for (row, got) in weight.chunks(d_in).zip(&out) {
            let want: f32 = row.iter().zip(&x).map(|(w, x)| w * x).sum();
            assert_eq!(
                f32::from_bits(got.load(Ordering::Relaxed)),
                want,
                "small integers: every order of summation is exact"
            );
        }
    }
}
