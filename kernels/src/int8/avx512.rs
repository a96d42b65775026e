//! The int8 products on AVX-512 with VNNI: rounding the inputs sixteen values at a time,
//! and for each kept block type its kernel (`vpdpbusd` over the weight's codes, the offsets
//! taken out with the inputs' sums as `int8.rs` explains).

use std::arch::x86_64::*;

use super::{Inputs, fetch, scales_mins};
use crate::quant::BlockType;

/// `super::round_block`, sixteen values at a time: the same maximum (which any order
/// gives), the same products, the same rounding (to nearest, ties to even).
///
/// # Safety
/// AVX-512F and BW present; `x.len()` a multiple of 16 and `q` as long.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn round_block(x: &[f32], q: &mut [i8]) -> f32 {
    assert!(x.len().is_multiple_of(16) && q.len() == x.len());
    let mut max = _mm512_setzero_ps();
    for x in x.chunks_exact(16) {
        // SAFETY: 16 values read from a chunk of 16.
        let x = unsafe { _mm512_loadu_ps(x.as_ptr()) };
        // A NaN input is skipped, as `f32::max` skips it.
        max = _mm512_max_ps(_mm512_abs_ps(x), max);
    }
    let max = _mm512_reduce_max_ps(max);
    if max == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let d = max / 127.0;
    let inverse = _mm512_set1_ps(1.0 / d);
    for (x, q) in x.chunks_exact(16).zip(q.chunks_exact_mut(16)) {
        // SAFETY: 16 values read from a chunk of 16, 16 bytes written to one of 16.
        unsafe {
            let v = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr()), inverse);
            // A NaN becomes 0, as `as i8` makes it.
            let v = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), v);
            _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(v));
        }
    }
    d
}

/// # Safety
/// As `super::four_checked` checks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
pub(super) unsafe fn four(
    ty: BlockType,
    rows: [*const u8; 4],
    inputs: &Inputs,
    store: &mut impl FnMut(usize, usize, f32),
) {
    unsafe {
        match ty {
            BlockType::Q8_0 => four_of::<Q8_0>(rows, inputs, store),
            BlockType::Q4_0 => four_of::<Q4_0>(rows, inputs, store),
            BlockType::Q4K => four_of::<Q4K>(rows, inputs, store),
            BlockType::Q6K => four_of::<Q6K>(rows, inputs, store),
            other => unreachable!("no int8 kernel for {other}"),
        }
    }
}

/// # Safety
/// As `super::one` checks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
pub(super) unsafe fn one(
    ty: BlockType,
    row: *const u8,
    inputs: &Inputs,
    store: &mut impl FnMut(usize, f32),
) {
    unsafe {
        match ty {
            BlockType::Q8_0 => one_of::<Q8_0>(row, inputs, store),
            BlockType::Q4_0 => one_of::<Q4_0>(row, inputs, store),
            BlockType::Q4K => one_of::<Q4K>(row, inputs, store),
            BlockType::Q6K => one_of::<Q6K>(row, inputs, store),
            other => unreachable!("no int8 kernel for {other}"),
        }
    }
}

/// A block type's int8 kernel: the products of `R` rows with `V` vectors.
trait Kernel {
    /// `sums[v][r]`: row `rows[r]` times vector `vectors[v]` of `inputs`.
    ///
    /// # Safety
    /// The features of `four`; each row holds `inputs.d_in` values of blocks.
    unsafe fn tile<const R: usize, const V: usize>(
        rows: [*const u8; R],
        inputs: &Inputs,
        vectors: [usize; V],
    ) -> [[f32; R]; V];
}

/// Four rows: four vectors at a time with the rows in pairs (sixteen sums), then the one
/// to three vectors left with all four rows (up to twelve sums), so the blocks are read
/// and unpacked once for them, not once each. A vector's sums are made by the same
/// instructions in any tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
unsafe fn four_of<K: Kernel>(
    rows: [*const u8; 4],
    inputs: &Inputs,
    store: &mut impl FnMut(usize, usize, f32),
) {
    let n = inputs.n;
    let mut b = 0;
    unsafe {
        while n - b >= 4 {
            let vectors = [b, b + 1, b + 2, b + 3];
            for pair in [0, 2] {
                let sums = K::tile([rows[pair], rows[pair + 1]], inputs, vectors);
                for (v, sums) in sums.iter().enumerate() {
                    store(b + v, pair, sums[0]);
                    store(b + v, pair + 1, sums[1]);
                }
            }
            b += 4;
        }
        // One to three vectors left: all four rows with each, in one pass over the blocks.
        let mut put = |sums: &[[f32; 4]]| {
            for (v, sums) in sums.iter().enumerate() {
                for (r, &sum) in sums.iter().enumerate() {
                    store(b + v, r, sum);
                }
            }
        };
        match n - b {
            0 => {}
            1 => put(&K::tile(rows, inputs, [b])),
            2 => put(&K::tile(rows, inputs, [b, b + 1])),
            _ => put(&K::tile(rows, inputs, [b, b + 1, b + 2])),
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
unsafe fn one_of<K: Kernel>(row: *const u8, inputs: &Inputs, store: &mut impl FnMut(usize, f32)) {
    for b in 0..inputs.n {
        store(b, unsafe { K::tile([row], inputs, [b]) }[0][0]);
    }
}

/// The f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn half(p: *const u8) -> f32 {
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The f16 values at `a` and `b` as sixteen f32 lanes, `[a; 8]` then `[b; 8]`: one
/// conversion and one permutation (two conversions and broadcasts and an insert took
/// nine instructions of Q8_0's sixteen a step).
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn half_halves(a: *const u8, b: *const u8) -> __m512 {
    unsafe {
        let bits = |p: *const u8| i32::from(p.cast::<i16>().read_unaligned());
        let pair = _mm_insert_epi16::<1>(_mm_cvtsi32_si128(bits(a)), bits(b));
        let lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_cvtph_ps(pair)))
    }
}

/// The 32 i16 lanes `[a; 16]` then `[b; 16]`: `vpermw` indices.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn index_halves(a: i16, b: i16) -> __m512i {
    _mm512_mask_blend_epi16(0xffff_0000, _mm512_set1_epi16(a), _mm512_set1_epi16(b))
}

/// Q8_0: two blocks (64 values) a step, codes `q` read as `q + 128`.
struct Q8_0;

impl Kernel for Q8_0 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    unsafe fn tile<const R: usize, const V: usize>(
        rows: [*const u8; R],
        inputs: &Inputs,
        vectors: [usize; V],
    ) -> [[f32; R]; V] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 32 * 34;
        let mut acc = [[_mm512_setzero_ps(); R]; V];
        let mut c = 0;
        while c < d_in {
            let at = c / 32 * 34;
            unsafe {
                let mut w = [(_mm512_setzero_si512(), _mm512_setzero_ps()); R];
                for r in 0..R {
                    let p = rows[r].add(at);
                    fetch(p, row_bytes, 68);
                    let low = _mm256_loadu_si256(p.add(2).cast());
                    let high = _mm256_loadu_si256(p.add(36).cast());
                    let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
                    let unsigned = _mm512_xor_si512(q, _mm512_set1_epi8(-128));
                    w[r] = (unsigned, half_halves(p, p.add(34)));
                }
                for v in 0..V {
                    let base = vectors[v] * d_in + c;
                    let x = _mm512_loadu_si512(inputs.q32.as_ptr().add(base).cast());
                    let sums = _mm512_loadu_si512(inputs.pair_sums.as_ptr().add(base / 4).cast());
                    // The codes' offset: 128 times the sum of a lane's inputs.
                    let offsets = _mm512_slli_epi32::<7>(sums);
                    let dx = _mm512_loadu_ps(inputs.pair_scales.as_ptr().add(base / 4));
                    for r in 0..R {
                        let dot = _mm512_dpbusd_epi32(offsets, w[r].0, x);
                        let scale = _mm512_mul_ps(w[r].1, dx);
                        acc[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[v][r]);
                    }
                }
            }
            c += 64;
        }
        sums(acc)
    }
}

/// Q4_0: four blocks (128 values, 72 bytes) a step, codes `q - 8` read as `q`: the
/// blocks' nibble bytes side by side in one register, their low nibbles (each block's
/// first sixteen values) and high nibbles (its last sixteen) two `vpdpbusd`s into the
/// same lanes, four lanes a block. A row's last 64 values, if its length is an odd
/// number of 64s, are a step of two blocks.
struct Q4_0;

impl Q4_0 {
    /// `vpermt2w` indices gathering the nibble bytes of a step's four blocks into the four
    /// 128-bit lanes (block `k`'s sixteen bytes, words `9k + 1..9k + 9` of the step) from the
    /// step's words 0-31 (the first source) and 4-35 (the second, read 8 bytes on).
    const CODES: [i16; 32] = {
        let mut index = [0i16; 32];
        let mut i = 0;
        while i < 32 {
            let word = 9 * (i / 8) + 1 + i % 8;
            index[i] = if word < 32 { word } else { 32 + word - 4 } as i16;
            i += 1;
        }
        index
    };

    /// `vpermw` indices of the four scales' words (`9k`), each four times: lanes as the
    /// `vpdpbusd` sums take them.
    const SCALES: [i16; 32] = {
        let mut index = [0i16; 32];
        let mut i = 0;
        while i < 16 {
            index[i] = (9 * (i / 4)) as i16;
            i += 1;
        }
        index
    };

    /// The `blocks` (2 or 4) blocks at `p`: low and high nibbles, and scales as lanes. The
    /// step's 72 bytes come in two loads and are sorted by two word permutations, one for
    /// the codes and one for the scales: three shuffle-port operations a row, where
    /// inserting each block's codes and each scale took nine, which made the kernel
    /// shuffle-bound on a small model's short rows (docs/BENCHMARKS.md, session 38).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,f16c")]
    unsafe fn step(p: *const u8, blocks: usize) -> (__m512i, __m512i, __m512) {
        unsafe {
            let (first, second) = if blocks == 4 {
                (
                    _mm512_loadu_si512(p.cast()),
                    _mm512_loadu_si512(p.add(8).cast()),
                )
            } else {
                // Two blocks, 36 bytes, at a row's end: only they are read, and the lanes
                // of the two missing blocks are zero (their scales too, so no NaN enters).
                (
                    _mm512_maskz_loadu_epi16(0x3_ffff, p.cast()),
                    _mm512_setzero_si512(),
                )
            };
            let codes = _mm512_loadu_si512(Self::CODES.as_ptr().cast());
            let scales = _mm512_loadu_si512(Self::SCALES.as_ptr().cast());
            let q = _mm512_permutex2var_epi16(first, codes, second);
            let d = _mm512_permutexvar_epi16(scales, first);
            let nibbles = _mm512_set1_epi8(0x0f);
            (
                _mm512_and_si512(q, nibbles),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q), nibbles),
                _mm512_cvtph_ps(_mm512_castsi512_si256(d)),
            )
        }
    }
}

impl Kernel for Q4_0 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    unsafe fn tile<const R: usize, const V: usize>(
        rows: [*const u8; R],
        inputs: &Inputs,
        vectors: [usize; V],
    ) -> [[f32; R]; V] {
        let d_in = inputs.d_in;
        let (row_bytes, stride) = (d_in / 32 * 18, super::quad_stride(d_in));
        let mut acc = [[_mm512_setzero_ps(); R]; V];
        for step in 0..d_in.div_ceil(128) {
            let blocks = (d_in / 32 - 4 * step).min(4);
            unsafe {
                let mut w = [(
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                    _mm512_setzero_ps(),
                ); R];
                for r in 0..R {
                    let p = rows[r].add(step * 72);
                    fetch(p, row_bytes, 72);
                    w[r] = Self::step(p, blocks);
                }
                for v in 0..V {
                    let at = vectors[v] * stride + step * 128;
                    let x = inputs.quads.as_ptr().add(at);
                    let (low, high) = (
                        _mm512_loadu_si512(x.cast()),
                        _mm512_loadu_si512(x.add(64).cast()),
                    );
                    let sums = _mm512_loadu_si512(inputs.quad_sums.as_ptr().add(at / 8).cast());
                    // The codes' offset: 8 times the sum of a lane's inputs.
                    let offsets = _mm512_slli_epi32::<3>(sums);
                    let dx = _mm512_loadu_ps(inputs.quad_scales.as_ptr().add(at / 8));
                    for r in 0..R {
                        let dot = _mm512_dpbusd_epi32(offsets, w[r].0, low);
                        let dot = _mm512_dpbusd_epi32(dot, w[r].1, high);
                        let scale = _mm512_mul_ps(w[r].2, dx);
                        acc[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[v][r]);
                    }
                }
            }
        }
        sums(acc)
    }
}

/// Q4_K: eight groups of 32 with 6-bit scales and mins; a block's 128 bytes of nibbles
/// read 64 at a time, the low nibbles groups 0 and 2 (4 and 6), the high 1 and 3 (5, 7).
struct Q4K;

impl Q4K {
    /// `vpermw` indices taking the eight mins (words 8-15 of the block's scales and mins
    /// widened together) twice each.
    const MIN_PAIRS: [i16; 16] = [8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15];
}

impl Kernel for Q4K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    unsafe fn tile<const R: usize, const V: usize>(
        rows: [*const u8; R],
        inputs: &Inputs,
        vectors: [usize; V],
    ) -> [[f32; R]; V] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 256 * 144;
        let nibbles = _mm512_set1_epi8(0x0f);
        // SAFETY: sixteen i16 read from a table of sixteen.
        let min_pairs = unsafe { _mm256_loadu_si256(Self::MIN_PAIRS.as_ptr().cast()) };
        let mut acc = [[_mm512_setzero_ps(); R]; V];
        for block in 0..d_in / 256 {
            unsafe {
                let mut d = [_mm_setzero_ps(); R];
                let mut scales = [_mm512_setzero_si512(); R];
                let mut mins = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let p = rows[r].add(block * 144);
                    fetch(p, row_bytes, 144);
                    // The block's two f16 scales in one conversion: lanes `[d, dmin, 0, 0]`.
                    let halves = _mm_cvtsi32_si128(p.cast::<i32>().read_unaligned());
                    d[r] = _mm_cvtph_ps(halves);
                    // Scales (words 0-7) and mins (8-15) widened at once; each min twice: a
                    // sum of 16 inputs per lane, two per group.
                    let (s, m) = scales_mins(p.add(4));
                    let both = _mm256_cvtepu8_epi16(_mm_set_epi64x(m, s));
                    scales[r] = _mm512_castsi256_si512(both);
                    mins[r] = _mm256_permutexvar_epi16(min_pairs, both);
                }
                let mut dots = [[_mm512_setzero_si512(); R]; V];
                for half in 0..2 {
                    let mut low = [_mm512_setzero_si512(); R];
                    let mut high = [_mm512_setzero_si512(); R];
                    let mut low_scales = [_mm512_setzero_si512(); R];
                    let mut high_scales = [_mm512_setzero_si512(); R];
                    let g = 4 * half as i16;
                    for r in 0..R {
                        let q =
                            _mm512_loadu_si512(rows[r].add(block * 144 + 16 + 64 * half).cast());
                        low[r] = _mm512_and_si512(q, nibbles);
                        high[r] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nibbles);
                        low_scales[r] = _mm512_permutexvar_epi16(index_halves(g, g + 2), scales[r]);
                        high_scales[r] =
                            _mm512_permutexvar_epi16(index_halves(g + 1, g + 3), scales[r]);
                    }
                    let at = block * 256 + 128 * half;
                    let xs = vectors.map(|b| inputs.paired[b * d_in + at..].as_ptr());
                    let scales = [low_scales, high_scales];
                    scaled_dots(&mut dots, [low, high], scales, xs);
                }
                for v in 0..V {
                    let k = vectors[v] * d_in / 256 + block;
                    let dx = _mm_set1_ps(*inputs.scales256.get_unchecked(k));
                    let sums = _mm256_loadu_si256(inputs.sums16.as_ptr().add(16 * k).cast());
                    for r in 0..R {
                        // `[d dx, dmin dx]`, each then in every lane.
                        let scaled = _mm512_castps128_ps512(_mm_mul_ps(d[r], dx));
                        let dq = _mm512_broadcastss_ps(_mm512_castps512_ps128(scaled));
                        let dmin = _mm512_permutexvar_ps(_mm512_set1_epi32(1), scaled);
                        let values = _mm512_cvtepi32_ps(dots[v][r]);
                        acc[v][r] = _mm512_fmadd_ps(values, dq, acc[v][r]);
                        let m = _mm512_zextsi256_si512(_mm256_madd_epi16(mins[r], sums));
                        acc[v][r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), dmin, acc[v][r]);
                    }
                }
            }
        }
        sums(acc)
    }
}

/// The K-quant kernels' step over 128 values of a block: each row's codes as unsigned
/// bytes (`codes[0][r]` those of the first 64 inputs at `xs[v]`, `codes[1][r]` the
/// last 64's), multiplied by the vector's integers and summed in pairs (`vpmaddubsw`:
/// at most 2 * 63 * 127, no saturation), each pair times its group's scale and summed
/// into `dots[v][r]` (`vpdpwssd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scaled_dots<const R: usize, const V: usize>(
    dots: &mut [[__m512i; R]; V],
    codes: [[__m512i; R]; 2],
    scales: [[__m512i; R]; 2],
    xs: [*const i8; V],
) {
    for v in 0..V {
        for half in 0..2 {
            // SAFETY: the caller's vectors hold 128 integers from `xs[v]`.
            let x = unsafe { _mm512_loadu_si512(xs[v].add(64 * half).cast()) };
            for r in 0..R {
                let p = _mm512_maddubs_epi16(codes[half][r], x);
                dots[v][r] = _mm512_dpwssd_epi32(dots[v][r], p, scales[half][r]);
            }
        }
    }
}

/// Q6_K: sixteen groups of 16 with 8-bit scales; each half of the block (128 values)
/// a run of 64 bytes of low nibbles and 32 of high bit pairs, read 64 values at a time.
struct Q6K;

impl Kernel for Q6K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    unsafe fn tile<const R: usize, const V: usize>(
        rows: [*const u8; R],
        inputs: &Inputs,
        vectors: [usize; V],
    ) -> [[f32; R]; V] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 256 * 210;
        let (nibbles, pairs) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
        let mut acc = [[_mm512_setzero_ps(); R]; V];
        for block in 0..d_in / 256 {
            unsafe {
                let mut d = [0.0; R];
                let mut scales = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let p = rows[r].add(block * 210);
                    fetch(p, row_bytes, 210);
                    d[r] = half(p.add(208));
                    scales[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
                }
                let mut dots = [[_mm512_setzero_si512(); R]; V];
                for half in 0..2 {
                    let mut low = [_mm512_setzero_si512(); R];
                    let mut high = [_mm512_setzero_si512(); R];
                    let mut low_scales = [_mm512_setzero_si512(); R];
                    let mut high_scales = [_mm512_setzero_si512(); R];
                    for r in 0..R {
                        let p = rows[r].add(block * 210);
                        let ql = _mm512_loadu_si512(p.add(64 * half).cast());
                        let qh = _mm256_loadu_si256(p.add(128 + 32 * half).cast());
                        // Values l and l + 32 take bits 0-1 and 2-3 of qh[l]; values
                        // l + 64 and l + 96 bits 4-5 and 6-7.
                        let qh = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(qh),
                            _mm256_srli_epi16::<2>(qh),
                        );
                        let top =
                            |bits: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(bits, pairs));
                        low[r] = _mm512_or_si512(_mm512_and_si512(ql, nibbles), top(qh));
                        high[r] = _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nibbles),
                            top(_mm512_srli_epi16::<4>(qh)),
                        );
                        let all = _mm512_castsi256_si512(scales[r]);
                        low_scales[r] = _mm512_permutexvar_epi16(group_index(2 * half), all);
                        high_scales[r] = _mm512_permutexvar_epi16(group_index(2 * half + 1), all);
                    }
                    let at = block * 256 + 128 * half;
                    let xs = vectors.map(|b| inputs.q256[b * d_in + at..].as_ptr());
                    let scales = [low_scales, high_scales];
                    scaled_dots(&mut dots, [low, high], scales, xs);
                }
                for v in 0..V {
                    let k = vectors[v] * d_in / 256 + block;
                    let dx = *inputs.scales256.get_unchecked(k);
                    let sums = _mm256_loadu_si256(inputs.sums16.as_ptr().add(16 * k).cast());
                    for r in 0..R {
                        // The codes' offset of 32: 32 * scale * sum, per group of 16.
                        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(scales[r], sums));
                        let dot = _mm512_sub_epi32(dots[v][r], _mm512_zextsi256_si512(offset));
                        let scale = _mm512_set1_ps(d[r] * dx);
                        acc[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[v][r]);
                    }
                }
            }
        }
        sums(acc)
    }
}

/// `vpermw` indices spreading Q6_K's sixteen scales (i16) over 64 values' i16 lanes:
/// quarter `q` of the block, lanes `8k..8k + 8` taking group `4q + k`.
/// Each accumulator's lanes added: plain loops, not `map` closures, which the compiler may
/// leave as calls compiled without the caller's target features (a 20% slower decode).
#[inline]
#[target_feature(enable = "avx512f")]
fn sums<const R: usize, const V: usize>(acc: [[__m512; R]; V]) -> [[f32; R]; V] {
    let mut out = [[0.0; R]; V];
    for v in 0..V {
        for r in 0..R {
            out[v][r] = _mm512_reduce_add_ps(acc[v][r]);
        }
    }
    out
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn group_index(quarter: usize) -> __m512i {
    let q = 4 * quarter as i16;
    let low = _mm512_mask_blend_epi16(0x0000_ff00, _mm512_set1_epi16(q), _mm512_set1_epi16(q + 1));
    let high = _mm512_mask_blend_epi16(
        0xff00_0000,
        _mm512_set1_epi16(q + 2),
        _mm512_set1_epi16(q + 3),
    );
    _mm512_mask_blend_epi16(0xffff_0000, low, high)
}
