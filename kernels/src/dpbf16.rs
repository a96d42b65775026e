//! Products over bf16 weights with the inputs rounded to bf16 (ties to even) and each two
//! products summed by one `vdpbf16ps` lane, as llama.cpp multiplies BF16 weights: what
//! [`Matmul::Bf16`](crate::int8::Matmul::Bf16) asks for, on CPUs with AVX512_BF16.
//!
//! Why: an exact product widens each bf16 weight to f32 first (two instructions per
//! sixteen values besides the FMA), and an f32 FMA does sixteen multiply-adds where a
//! `vdpbf16ps` does 32. Where 512-bit operations take two cycles (AMD Zen 4), that is what
//! bounds decoding and prompts; on Intel's Sapphire Rapids `vdpbf16ps` runs at half the FMA
//! rate, so it buys little there. Not exact: each input loses its low 16 bits (a relative
//! error up to 2^-9), as llama.cpp's BF16 path does; a row's result depends only on that
//! row and the weight, not on the batch, the prompt's length or the threads.
//!
//! Decoding: four rows at a time (a [`crate::bundles`] bundle), each vector in turn.
//! Prompts: as [`crate::int8::rows`], a panel of sixteen weight rows laid out as the
//! instruction reads them (lane `j` holds a pair of row `j`'s values) and fourteen prompt
//! rows passing over it, each broadcasting a pair per instruction; with AMX's tiles
//! ([`amx`]), sixteen prompt rows by sixteen weight rows by 32 inputs an instruction.

use std::ops::Range;
use std::sync::atomic::AtomicU32;

use half::bf16;
use rayon::prelude::*;

use crate::cpu::{self, Tier};
use crate::team::OutPtr;

#[cfg(target_arch = "x86_64")]
mod amx;

/// Prompt rows per tile: fourteen registers of sums beside the panel's.
const MR: usize = 14;
/// Weight rows per panel: one register of f32 lanes.
const NR: usize = 16;
/// Weight rows (output columns) per task: four panels, which a tile of the prompt passes
/// over in turn while it is in cache.
const GROUP: usize = 4 * NR;

/// Whether this CPU has `vdpbf16ps` (and the kernels' AVX-512 tier: `RUNTIME_CPU` below it
/// turns these off too).
pub fn runs() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static BF16: OnceLock<bool> = OnceLock::new();
        *BF16.get_or_init(|| std::is_x86_feature_detected!("avx512bf16"))
            && cpu::tier() >= Tier::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `xs` rounded to bf16, ties to even (NaN stays NaN), as the products take them.
///
/// # Panics
/// Unless [`runs`].
pub fn round(xs: &[f32]) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; xs.len()];
    round_into(xs, &mut out);
    out
}

/// [`round`] into `out` (as long as `xs`).
fn round_into(xs: &[f32], out: &mut [bf16]) {
    assert!(runs(), "no AVX512_BF16 here");
    assert_eq!(xs.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `runs` checked the CPU; the lengths are equal.
    unsafe {
        avx512::round(xs, out)
    };
}

/// Part of the products of a bf16 matrix with `n` vectors rounded to bf16 (`xs`, one
/// after another): `out[b stride + j] = weight row j · x_b`, over the rows of `bundles`,
/// numbered as [`crate::bundles::matvec_bundles`] numbers them.
///
/// # Panics
/// Unless [`runs`], and `weight` and `xs` are whole rows of `d_in`.
pub fn bundles(
    weight: &[bf16],
    xs: &[bf16],
    d_in: usize,
    out: &[AtomicU32],
    stride: usize,
    bundles: Range<usize>,
) {
    assert!(runs(), "no AVX512_BF16 here");
    assert!(weight.len().is_multiple_of(d_in) && xs.len().is_multiple_of(d_in));
    let (rows, n) = (weight.len() / d_in, xs.len() / d_in);
    let q = rows / 4;
    assert!(bundles.end <= crate::bundles::matvec_bundle_count(rows));
    assert!(n == 0 || out.len() >= (n - 1) * stride + rows);
    for bundle in bundles {
        let picked: [usize; 4] = if bundle < q {
            [bundle, q + bundle, 2 * q + bundle, 3 * q + bundle]
        } else {
            // A leftover row (at most three a product), in every slot.
            [4 * q + bundle - q; 4]
        };
        let row = |j: usize| weight[j * d_in..][..d_in].as_ptr();
        for b in 0..n {
            let x = xs[b * d_in..][..d_in].as_ptr();
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `runs` checked the CPU; each pointer holds d_in values.
            let sums = unsafe { avx512::dot4(picked.map(row), x, d_in) };
            #[cfg(not(target_arch = "x86_64"))]
            let sums: [f32; 4] = unreachable!("no AVX512_BF16 off x86-64 ({x:?})");
            let count = if bundle < q { 4 } else { 1 };
            for (&j, &sum) in picked.iter().zip(&sums).take(count) {
                out[b * stride + j].store(sum.to_bits(), std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// `x` (rows of `d_in`) times the bf16 weight `weight` (rows of `d_in`, one per output),
/// each input rounded to bf16: rows of `d_out`.
///
/// # Panics
/// Unless [`runs`], and `x` and `weight` are whole rows of `d_in`.
pub fn linear_rows(x: &[f32], weight: &[bf16], d_in: usize) -> Vec<f32> {
    assert!(runs(), "no AVX512_BF16 here");
    assert!(d_in > 0 && x.len().is_multiple_of(d_in) && weight.len().is_multiple_of(d_in));
    let (rows, d_out) = (x.len() / d_in, weight.len() / d_in);
    if rows == 0 || d_out == 0 {
        return vec![0.0; rows * d_out];
    }
    #[cfg(target_arch = "x86_64")]
    if amx::runs() {
        return amx::linear_rows(x, weight, d_in);
    }
    // Rows padded with zeros to whole tiles, each to a whole number of pairs.
    let (padded, width) = (rows.next_multiple_of(MR), d_in.next_multiple_of(2));
    let rounded = round_rows(x, d_in, padded, width);
    let pairs = width / 2;
    let mut out = vec![0.0f32; rows * d_out];
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..d_out.div_ceil(GROUP))
        .into_par_iter()
        .for_each(|group| {
            let columns = group * GROUP..((group + 1) * GROUP).min(d_out);
            let panels = Panel::all(weight, d_in, columns.clone(), pairs);
            for tile in (0..rows).step_by(MR) {
                let valid = MR.min(rows - tile);
                let x = rounded[tile * width..].as_ptr();
                for panel in &panels {
                    let to = out_ptr.at(tile * d_out + panel.columns.start);
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `runs` checked the CPU; `x` holds MR rows of `width` values, the
                    // panel `pairs` pairs; the panel's columns of the tile's rows of `out`
                    // belong to this task alone.
                    unsafe {
                        avx512::tile(
                            panel,
                            x,
                            width,
                            pairs,
                            to,
                            d_out,
                            (valid, panel.columns.len()),
                        )
                    };
                }
            }
        });
    out
}

/// The rows of `x` (rows of `d_in`) rounded to bf16, each at the start of a row of `width`
/// values, `padded` rows (the rest zeros).
fn round_rows(x: &[f32], d_in: usize, padded: usize, width: usize) -> Vec<bf16> {
    let mut rounded = vec![bf16::ZERO; padded * width];
    (rounded.par_chunks_mut(width))
        .zip(x.par_chunks(d_in))
        .for_each(|(to, x)| round_into(x, &mut to[..d_in]));
    rounded
}

/// Sixteen weight rows, pairs of values interleaved as `vdpbf16ps` reads them: for each
/// pair of inputs, sixteen rows' pairs (rows past the weight's, a last lone value's
/// partner, and pairs past the row's, zero).
struct Panel {
    columns: Range<usize>,
    pairs: Vec<[u32; NR]>,
}

impl Panel {
    /// The panels of rows `columns` of `weight`, sixteen rows each (the last fewer), as
    /// `pairs` pairs.
    fn all(weight: &[bf16], d_in: usize, columns: Range<usize>, pairs: usize) -> Vec<Self> {
        (columns.clone().step_by(NR))
            .map(|first| Panel::new(weight, d_in, first..(first + NR).min(columns.end), pairs))
            .collect()
    }

    /// Rows `columns` of `weight` as `pairs` pairs (at least `d_in` values).
    fn new(weight: &[bf16], d_in: usize, columns: Range<usize>, pairs: usize) -> Self {
        assert!(2 * pairs >= d_in);
        let mut pairs = vec![[0u32; NR]; pairs];
        let rows: Vec<&[bf16]> = (columns.clone())
            .map(|row| &weight[row * d_in..][..d_in])
            .collect();
        // Sixteen rows' 32 values at a time as a transpose of 32-bit words; what is left
        // (a panel of fewer rows, the end of rows not a multiple of 32) a pair at a time.
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if let Ok(rows) = <[&[bf16]; NR]>::try_from(rows.as_slice()) {
            done = d_in / 32 * 32;
            // SAFETY: `runs` (checked by every caller of `new`) means AVX-512F; each row
            // holds `d_in` values and `pairs` d_in / 2 entries.
            unsafe { avx512::interleave(rows, &mut pairs, done) };
        }
        for (j, row) in rows.iter().enumerate() {
            let (pairs, row) = (&mut pairs[done / 2..], &row[done..]);
            for (pair, values) in pairs.iter_mut().zip(row.chunks(2)) {
                let high = values.get(1).map_or(0, |v| u32::from(v.to_bits()));
                pair[j] = u32::from(values[0].to_bits()) | high << 16;
            }
        }
        Panel { columns, pairs }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use half::bf16;

    use super::{MR, NR, Panel};
    use crate::bundles::avx512::fetch_next;
    use crate::simd::avx512::transpose;

    /// See `super::round`.
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 present; `out` as long as `xs`.
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw")]
    pub(super) unsafe fn round(xs: &[f32], out: &mut [bf16]) {
        assert_eq!(xs.len(), out.len());
        let whole = xs.len() / 32 * 32;
        // SAFETY: 32 values read and written at `i < whole`.
        unsafe {
            for i in (0..whole).step_by(32) {
                let (low, high) = (
                    _mm512_loadu_ps(xs.as_ptr().add(i)),
                    _mm512_loadu_ps(xs.as_ptr().add(i + 16)),
                );
                let pairs = _mm512_cvtne2ps_pbh(high, low);
                _mm512_storeu_si512(
                    out.as_mut_ptr().add(i).cast(),
                    std::mem::transmute::<__m512bh, __m512i>(pairs),
                );
            }
        }
        for (to, &x) in out[whole..].iter_mut().zip(&xs[whole..]) {
            *to = bf16::from_f32(x);
        }
    }

    /// The first `len` values (a multiple of 32) of sixteen rows into `pairs` as `Panel`
    /// lays them out: each 16 × 16 block of 32-bit words (pairs) transposed.
    ///
    /// # Safety
    /// AVX-512F present; every row holds `len` values, `pairs` `len / 2` entries.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn interleave(rows: [&[bf16]; NR], pairs: &mut [[u32; NR]], len: usize) {
        assert!(len.is_multiple_of(32) && pairs.len() >= len / 2);
        assert!(rows.iter().all(|row| row.len() >= len));
        // SAFETY: reads of 32 values at `c < len` of each row; writes of 16 entries from
        // `c / 2`.
        unsafe {
            for c in (0..len).step_by(32) {
                let block: [__m512; NR] =
                    std::array::from_fn(|j| _mm512_loadu_ps(rows[j].as_ptr().add(c).cast()));
                for (k, words) in transpose(block).into_iter().enumerate() {
                    _mm512_storeu_ps(pairs.as_mut_ptr().add(c / 2 + k).cast(), words);
                }
            }
        }
    }

    /// Four rows (`d_in` bf16 values each) times `x` (as many): the four sums, each of
    /// `vdpbf16ps` lanes added in a fixed order.
    ///
    /// # Safety
    /// AVX-512F, BW and AVX512_BF16 present; every pointer holds `d_in` values.
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw")]
    pub(super) unsafe fn dot4(rows: [*const bf16; 4], x: *const bf16, d_in: usize) -> [f32; 4] {
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut c = 0;
        // SAFETY (whole body): reads stay within `d_in` values of each pointer (the last
        // piece masked); the prefetches are hints.
        unsafe {
            let load = |p: *const bf16, at: usize, mask: __mmask32| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(
                    mask,
                    p.add(at).cast(),
                ))
            };
            while c < d_in {
                let mask: __mmask32 = if d_in - c >= 32 {
                    !0
                } else {
                    (1u32 << (d_in - c)) - 1
                };
                let xv = load(x, c, mask);
                fetch_next(rows, c + d_in);
                for (acc, &row) in acc.iter_mut().zip(&rows) {
                    *acc = _mm512_dpbf16_ps(*acc, load(row, c, mask), xv);
                }
                c += 32;
            }
        }
        // A loop, not `map`: a closure would be compiled without the target features.
        let mut sums = [0.0f32; 4];
        for (sum, acc) in sums.iter_mut().zip(acc) {
            *sum = _mm512_reduce_add_ps(acc);
        }
        sums
    }

    /// Rows `x..` (MR of `width` bf16 values, `width` apart) times the panel's rows
    /// (`pairs` pairs): the first `valid` rows' first `n` sums stored at `out`, rows
    /// `stride` apart.
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 present; `x` holds MR rows; `out` as described.
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw")]
    pub(super) unsafe fn tile(
        panel: &Panel,
        x: *const bf16,
        width: usize,
        pairs: usize,
        out: *mut f32,
        stride: usize,
        (valid, n): (usize, usize),
    ) {
        assert!(valid <= MR && n <= NR && panel.pairs.len() >= pairs);
        let mask: __mmask16 = if n >= NR { !0 } else { (1u16 << n) - 1 };
        let mut acc = [_mm512_setzero_ps(); MR];
        // SAFETY (whole body): `k < pairs` pairs of each row and of the panel; stores to
        // `valid` rows of `n` values.
        unsafe {
            let xs = x.cast::<u32>();
            let w = panel.pairs.as_ptr().cast::<__m512i>();
            for k in 0..pairs {
                let w = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(w.add(k)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let pair = xs.add(r * width / 2 + k).read_unaligned() as i32;
                    let pair = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                    *acc = _mm512_dpbf16_ps(*acc, w, pair);
                }
            }
            for (r, acc) in acc.iter().enumerate().take(valid) {
                _mm512_mask_storeu_ps(out.add(r * stride), mask, *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::testing::Needs;
    use crate::testing::{in_pool, uniform};

    /// Whether the kernels cannot run at this tier (and the test is skipped, saying so,
    /// also under `REQUIRE_KERNELS`: CI's Ice Lake and Zen 3 hosts lack AVX512_BF16; `cpu::testing`).
    fn skipped() -> bool {
        let skipped = !crate::cpu::testing::runs(Needs::Bf16);
        assert_eq!(runs(), !skipped);
        skipped
    }

    fn widen(values: &[bf16]) -> Vec<f64> {
        values.iter().map(|v| f64::from(v.to_f32())).collect()
    }

    /// Each sum against the f64 sum of the rounded inputs' products: off by no more than
    /// f32 additions over the row allow.
    fn check(got: f32, weight: &[f64], x: &[f64], what: &str) {
        let exact: f64 = weight.iter().zip(x).map(|(w, x)| w * x).sum();
        let size: f64 = weight.iter().zip(x).map(|(w, x)| (w * x).abs()).sum();
        let error = (f64::from(got) - exact).abs();
        assert!(
            error <= size * 1e-5 + 1e-30,
            "{what}: {got} vs {exact} (size {size})"
        );
    }

    /// The rounding is to nearest, ties to even, as `half` rounds (NaN kept), on values of
    /// every size and ties.
    #[test]
    fn rounding_is_to_nearest_even() {
        if skipped() {
            return;
        }
        let mut next = uniform(3);
        let mut xs: Vec<f32> = (0..1000).map(|i| next() * 10f32.powi(i % 12 - 6)).collect();
        xs.extend([
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::INFINITY,
        ]);
        xs.extend([-0.0, f32::MAX, f32::MIN_POSITIVE, 1e-41]);
        for (got, x) in round(&xs).iter().zip(&xs) {
            assert_eq!(got.to_bits(), bf16::from_f32(*x).to_bits(), "{x:e}");
        }
        assert!(round(&[f32::NAN])[0].is_nan());
    }

    /// Decoding's products equal the definition (up to the order of f32 additions), for
    /// lengths with and without a partial last 32, bundles of four rows and leftovers; and
    /// a vector's products are the same bits alone and in a batch.
    #[test]
    fn bundles_follow_the_definition() {
        if skipped() {
            return;
        }
        for (rows, d_in, n) in [(11, 576, 3), (8, 48, 2), (6, 1000, 1)] {
            let mut next = uniform(rows as u64 + d_in as u64);
            let weight: Vec<bf16> = (0..rows * d_in).map(|_| bf16::from_f32(next())).collect();
            let xs: Vec<f32> = (0..n * d_in).map(|_| next() * 3.0).collect();
            let rounded = round(&xs);
            let out: Vec<AtomicU32> = (0..n * rows).map(|_| AtomicU32::new(0)).collect();
            let count = crate::bundles::matvec_bundle_count(rows);
            bundles(&weight, &rounded, d_in, &out, rows, 0..count);
            let got: Vec<f32> = out
                .iter()
                .map(|v| f32::from_bits(v.load(std::sync::atomic::Ordering::Relaxed)))
                .collect();
            for b in 0..n {
                let x = widen(&rounded[b * d_in..][..d_in]);
                for j in 0..rows {
                    let w = widen(&weight[j * d_in..][..d_in]);
                    check(
                        got[b * rows + j],
                        &w,
                        &x,
                        &format!("{rows}x{d_in} row {j} vector {b}"),
                    );
                }
                let alone: Vec<AtomicU32> = (0..rows).map(|_| AtomicU32::new(0)).collect();
                bundles(
                    &weight,
                    &rounded[b * d_in..][..d_in],
                    d_in,
                    &alone,
                    rows,
                    0..count,
                );
                for j in 0..rows {
                    let bits = alone[j].load(std::sync::atomic::Ordering::Relaxed);
                    assert_eq!(
                        bits,
                        got[b * rows + j].to_bits(),
                        "vector {b} row {j} alone"
                    );
                }
            }
        }
    }

    /// A prompt's products through [`linear_rows`] as the tier picks them (on AMX's tiles at
    /// the amx tier, else the `vdpbf16ps` kernel, which `just test-tiers` runs at
    /// `RUNTIME_CPU=avx512vnni` on an AMX host), as [`prompt_rows_follow_the_definition_in`].
    #[test]
    fn prompt_rows_follow_the_definition() {
        if skipped() {
            return;
        }
        let on = if cpu::tier() >= Tier::Amx {
            "AMX's tiles"
        } else {
            "vdpbf16ps"
        };
        eprintln!("prompt rows on {on} (the {} tier)", crate::cpu::tier());
        prompt_rows_follow_the_definition_in(linear_rows);
    }

    /// AMX's tiles called directly, as [`prompt_rows_follow_the_definition_in`]: the amx
    /// tier, which no CI host is sure to have (AMD's Zen 4 lacks it), so skipped where the
    /// CPU lacks it even under `REQUIRE_KERNELS`, saying so.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_prompt_rows_follow_the_definition() {
        if !crate::cpu::testing::runs(Needs::Tier(Tier::Amx)) {
            return;
        }
        assert!(amx::runs());
        prompt_rows_follow_the_definition_in(amx::linear_rows);
    }

    /// A prompt's products (`linear`: [`linear_rows`] or a kernel of it) equal the
    /// definition (up to the order of f32 additions), and each row's result is the one it
    /// gets alone, to the bit, at 1, 2 and 3 threads: shapes with partial tiles, panels and
    /// groups, and an odd `d_in`; on AMX's tiles, whole and partial pairs of tiles, a lone
    /// last panel, rows of a multiple of 1 KiB.
    fn prompt_rows_follow_the_definition_in(linear: fn(&[f32], &[bf16], usize) -> Vec<f32>) {
        let shapes = [
            (13, 576, 70),
            (30, 33, 130),
            (15, 64, 16),
            (70, 2048, 300),
            (32, 96, 64),
        ];
        for (rows, d_in, d_out) in shapes {
            let mut next = uniform(7 + rows as u64);
            let weight: Vec<bf16> = (0..d_out * d_in).map(|_| bf16::from_f32(next())).collect();
            let x: Vec<f32> = (0..rows * d_in).map(|_| next() * 2.0).collect();
            let got = linear(&x, &weight, d_in);
            for r in 0..rows {
                let xr = widen(&round(&x[r * d_in..][..d_in]));
                for j in 0..d_out {
                    let w = widen(&weight[j * d_in..][..d_in]);
                    check(
                        got[r * d_out + j],
                        &w,
                        &xr,
                        &format!("{rows}x{d_in}x{d_out} ({r}, {j})"),
                    );
                }
            }
            for threads in [1, 2, 3] {
                let again = in_pool(threads, || linear(&x, &weight, d_in));
                assert!(
                    again
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
                for r in [0, rows - 1] {
                    let alone = in_pool(threads, || linear(&x[r * d_in..][..d_in], &weight, d_in));
                    let same = alone
                        .iter()
                        .zip(&got[r * d_out..])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "row {r} alone, {threads} threads");
                }
            }
        }
    }

    /// Multiply-adds per second of [`linear_rows`] on a prompt of 512 at 1B's widest shape,
    /// at the tier this CPU runs (`RUNTIME_CPU=avx512vnni`: the `vdpbf16ps` kernel):
    /// `cargo test --release -p kernels bf16_prompt_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bf16_prompt_speed() {
        if skipped() {
            return;
        }
        let (rows, d_in, d_out) = (512, 2048, 8192);
        let mut next = uniform(5);
        let weight: Vec<bf16> = (0..d_out * d_in).map(|_| bf16::from_f32(next())).collect();
        let x: Vec<f32> = (0..rows * d_in).map(|_| next()).collect();
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let start = std::time::Instant::now();
            std::hint::black_box(linear_rows(&x, &weight, d_in));
            best = best.min(start.elapsed().as_secs_f64());
        }
        let macs = (rows * d_in * d_out) as f64;
        println!(
            "{}: {:.1} ms, {:.1} GMAC/s",
            crate::cpu::tier(),
            best * 1e3,
            macs / best / 1e9
        );
    }
}
