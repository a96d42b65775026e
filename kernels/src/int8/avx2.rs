//! The int8 products with 256-bit registers and no VNNI (the AVX2 and AVX-512 tiers):
//! `vpmaddubsw` multiplies unsigned bytes by signed ones and adds them in pairs (to i16,
//! saturating), `vpmaddwd` adds those pairs again (to i32) or scales them by a group's
//! scale on the way, as llama.cpp's AVX2 kernels do.
//!
//! The inputs are the rounded blocks as they are (`Inputs::q32`, `Inputs::q256`). Q8_0 and
//! Q4_0 take the weight's magnitude times the input with the weight's sign (`vpsignb`), so
//! no pair passes `128 * 127 * 2`; the K-quants' codes are at most 63, their offsets taken
//! out with the inputs' sums per group of 16 as with VNNI.

use std::arch::x86_64::*;

use super::{Inputs, fetch};
use crate::quant::BlockType;

/// # Safety
/// As `super::four_checked` checks.
#[target_feature(enable = "avx2,fma,f16c")]
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
#[target_feature(enable = "avx2,fma,f16c")]
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

/// A block type's kernel: `R` rows times one vector. Sixteen registers hold no more than
/// four rows' sums beside the codes and the inputs, so a batch's vectors pass over the
/// same rows one after another (the rows stay in L1 between them), and a vector's sums
/// are made by the same instructions alone or among others.
trait Kernel {
    /// Row `rows[r]` times vector `b` of `inputs`, for each `r`.
    ///
    /// # Safety
    /// The features of `four`; each row holds `inputs.d_in` values of blocks.
    unsafe fn tile<const R: usize>(rows: [*const u8; R], inputs: &Inputs, b: usize) -> [f32; R];
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn four_of<K: Kernel>(
    rows: [*const u8; 4],
    inputs: &Inputs,
    store: &mut impl FnMut(usize, usize, f32),
) {
    for b in 0..inputs.n {
        for (r, &sum) in unsafe { K::tile(rows, inputs, b) }.iter().enumerate() {
            store(b, r, sum);
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_of<K: Kernel>(row: *const u8, inputs: &Inputs, store: &mut impl FnMut(usize, f32)) {
    for b in 0..inputs.n {
        store(b, unsafe { K::tile([row], inputs, b) }[0]);
    }
}

/// The f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn half(p: *const u8) -> f32 {
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The eight lanes added, in a fixed order.
#[inline]
#[target_feature(enable = "avx2")]
fn sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline]
#[target_feature(enable = "avx2")]
fn sums<const R: usize>(acc: [__m256; R]) -> [f32; R] {
    let mut out = [0.0; R];
    for r in 0..R {
        out[r] = sum(acc[r]);
    }
    out
}

/// The sum of `w * x` over 32 signed bytes each, in eight i32 lanes: `|w|` (unsigned)
/// times `x` with `w`'s sign, so each pair is at most `128 * 127 * 2` and never saturates.
#[inline]
#[target_feature(enable = "avx2")]
fn signed_dot(w: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// Q8_0: a block (32 values, 34 bytes) a step.
struct Q8_0;

impl Kernel for Q8_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize>(rows: [*const u8; R], inputs: &Inputs, b: usize) -> [f32; R] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 32 * 34;
        let mut acc = [_mm256_setzero_ps(); R];
        for block in 0..d_in / 32 {
            let base = b * d_in + block * 32;
            unsafe {
                let x = _mm256_loadu_si256(inputs.q32.as_ptr().add(base).cast());
                let dx = *inputs.d32.get_unchecked(base / 32);
                for r in 0..R {
                    let p = rows[r].add(block * 34);
                    fetch(p, row_bytes, 34);
                    let dot = signed_dot(_mm256_loadu_si256(p.add(2).cast()), x);
                    let scale = _mm256_set1_ps(half(p) * dx);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
                }
            }
        }
        sums(acc)
    }
}

/// Q4_0: a block (32 values, 18 bytes) a step, its sixteen bytes' low nibbles (values
/// 0-15) and high nibbles (16-31) side by side in one register. The codes `q` go into
/// `vpmaddubsw` as they are, unsigned, and the offset comes off the pairs as `8x`, made
/// once per block for all the rows: the lanes' integers are those of `(q - 8) x`, with two
/// instructions a row fewer than taking the signs. The sixteen bytes are loaded into both
/// halves at once (a load, no shuffle), and the scale is broadcast as an f16 and
/// converted in the register: the shuffle port, which the codes' insert and a scalar
/// scale's moves kept busy, is left for the rest.
struct Q4_0;

impl Kernel for Q4_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize>(rows: [*const u8; R], inputs: &Inputs, b: usize) -> [f32; R] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 32 * 18;
        let nibbles = _mm256_set1_epi8(0x0f);
        // The high half's bytes shifted down to their high nibbles.
        let high_half = _mm256_set_epi64x(4, 4, 0, 0);
        let mut acc = [_mm256_setzero_ps(); R];
        for block in 0..d_in / 32 {
            let base = b * d_in + block * 32;
            unsafe {
                let x = _mm256_loadu_si256(inputs.q32.as_ptr().add(base).cast());
                let offsets = _mm256_maddubs_epi16(_mm256_set1_epi8(8), x);
                let dx = _mm256_set1_ps(*inputs.d32.get_unchecked(base / 32));
                for r in 0..R {
                    let p = rows[r].add(block * 18);
                    fetch(p, row_bytes, 18);
                    let bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(2).cast()));
                    let q = _mm256_and_si256(_mm256_srlv_epi64(bytes, high_half), nibbles);
                    // Each pair at most 15 * 127 * 2 = 3810, less at most 8 * 128 * 2.
                    let pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q, x), offsets);
                    let dot = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
                    let d = _mm_set1_epi16(p.cast::<i16>().read_unaligned());
                    let scale = _mm256_mul_ps(_mm256_cvtph_ps(d), dx);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
                }
            }
        }
        sums(acc)
    }
}

/// Q4_K: eight groups of 32 with 6-bit scales and mins; each 32 bytes of nibbles hold two
/// groups, the low nibbles the first, the high the second. A row's eight scales are widened
/// once into both halves of a register, and each group's taken from there by a byte
/// shuffle; its two f16 scales are converted in one instruction.
struct Q4K;

/// `vpshufb` indices spreading word `g` of each 128-bit half over that half: group `g`'s
/// scale from a Q4_K row's eight, widened.
static SPREAD_WORD: [[u8; 32]; 8] = {
    let mut indices = [[0; 32]; 8];
    let mut g = 0;
    while g < 8 {
        let mut i = 0;
        while i < 32 {
            indices[g][i] = (2 * g + i % 2) as u8;
            i += 1;
        }
        g += 1;
    }
    indices
};

impl Kernel for Q4K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize>(rows: [*const u8; R], inputs: &Inputs, b: usize) -> [f32; R] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 256 * 144;
        let nibbles = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); R];
        for block in 0..d_in / 256 {
            let k = b * d_in / 256 + block;
            unsafe {
                let x = inputs.q256.as_ptr().add(k * 256);
                let dx = _mm_set1_ps(*inputs.scales256.get_unchecked(k));
                let sums16 = _mm256_loadu_si256(inputs.sums16.as_ptr().add(16 * k).cast());
                for r in 0..R {
                    let p = rows[r].add(block * 144);
                    fetch(p, row_bytes, 144);
                    let (scales, mins) = super::scales_mins(p.add(4));
                    let scales = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales));
                    let scales = _mm256_broadcastsi128_si256(scales);
                    let mut dot = _mm256_setzero_si256();
                    for pair in 0..4 {
                        let q = _mm256_loadu_si256(p.add(16 + 32 * pair).cast());
                        let (low, high) = (_mm256_and_si256(q, nibbles), high_nibbles(q));
                        let low = _mm256_maddubs_epi16(low, load(x.add(64 * pair)));
                        let high = _mm256_maddubs_epi16(high, load(x.add(64 * pair + 32)));
                        let scale =
                            |g: usize| _mm256_shuffle_epi8(scales, load(SPREAD_WORD[g].as_ptr()));
                        let low = _mm256_madd_epi16(low, scale(2 * pair));
                        let high = _mm256_madd_epi16(high, scale(2 * pair + 1));
                        dot = _mm256_add_epi32(dot, _mm256_add_epi32(low, high));
                    }
                    // Each min twice: a sum of 16 inputs per lane, two per group.
                    let m = _mm_cvtsi64_si128(mins);
                    let m =
                        _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)), sums16);
                    // `[d, dmin]` times the inputs' scale; dmin's product taken off (the same
                    // bits as adding the product with `-dmin`).
                    let d = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
                    let d = _mm_mul_ps(d, dx);
                    let dq = _mm256_broadcastss_ps(d);
                    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(d));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), dq, acc[r]);
                    acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), dmin, acc[r]);
                }
            }
        }
        sums(acc)
    }
}

/// Q6_K: sixteen groups of 16 with 8-bit scales; each half of the block (128 values) is
/// 64 bytes of low nibbles and 32 of high bit pairs, read 32 values at a time.
struct Q6K;

impl Kernel for Q6K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize>(rows: [*const u8; R], inputs: &Inputs, b: usize) -> [f32; R] {
        let d_in = inputs.d_in;
        let row_bytes = d_in / 256 * 210;
        let nibbles = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); R];
        for block in 0..d_in / 256 {
            let k = b * d_in / 256 + block;
            unsafe {
                let x = inputs.q256.as_ptr().add(k * 256);
                let dx = *inputs.scales256.get_unchecked(k);
                let sums16 = _mm256_loadu_si256(inputs.sums16.as_ptr().add(16 * k).cast());
                for r in 0..R {
                    let p = rows[r].add(block * 210);
                    fetch(p, row_bytes, 210);
                    let scales = _mm_loadu_si128(p.add(192).cast());
                    let mut dot = _mm256_setzero_si256();
                    for half in 0..2 {
                        let ql0 = load(p.add(64 * half));
                        let ql1 = load(p.add(64 * half + 32));
                        let qh = load(p.add(128 + 32 * half));
                        // Value l of each quarter, l < 32: the low or high nibble of
                        // ql[l] or ql[l + 32], and bits 0-1, 2-3, 4-5 or 6-7 of qh[l].
                        let codes = [
                            six_bits(_mm256_and_si256(ql0, nibbles), qh, 0),
                            six_bits(_mm256_and_si256(ql1, nibbles), qh, 2),
                            six_bits(high_nibbles(ql0), qh, 4),
                            six_bits(high_nibbles(ql1), qh, 6),
                        ];
                        for (quarter, codes) in codes.into_iter().enumerate() {
                            let at = 128 * half + 32 * quarter;
                            let products = _mm256_maddubs_epi16(codes, load(x.add(at)));
                            // Groups 8 half + 2 quarter and the next: eight i16 lanes each.
                            let group = 0x0101_0101_0101_0101 * (at / 16) as i64;
                            let spread = _mm_set_epi64x(group + 0x0101_0101_0101_0101, group);
                            let scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, spread));
                            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(products, scale));
                        }
                    }
                    // The codes' offset of 32: 32 * scale * sum, per group of 16.
                    let offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), sums16);
                    let dot = _mm256_sub_epi32(dot, _mm256_slli_epi32::<5>(offset));
                    let scale = _mm256_set1_ps(half(p.add(208)) * dx);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
                }
            }
        }
        sums(acc)
    }
}

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load<T>(p: *const T) -> __m256i {
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Each byte's high four bits, as its low.
#[inline]
#[target_feature(enable = "avx2")]
fn high_nibbles(q: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srli_epi16::<4>(q), _mm256_set1_epi8(0x0f))
}

/// Q6_K's codes: `low` (four bits) with bits `shift` and `shift + 1` of `qh` above them.
#[inline]
#[target_feature(enable = "avx2")]
fn six_bits(low: __m256i, qh: __m256i, shift: i64) -> __m256i {
    let pairs = _mm256_and_si256(
        _mm256_srl_epi16(qh, _mm_cvtsi64_si128(shift)),
        _mm256_set1_epi8(3),
    );
    _mm256_or_si256(low, _mm256_slli_epi16::<4>(pairs))
}
