//! The prompt kernel with 256-bit registers and no VNNI (the AVX2 and AVX-512 tiers), for
//! the weights whose codes take at most 6 bits (Q4_0, Q4_K, Q6_K), and the unpacking of
//! every type's codes (AVX2 instructions only, on every tier).
//!
//! `vpmaddubsw` multiplies a panel's unsigned codes by four broadcast inputs (signed) and
//! adds them in pairs, to i16; those pairs add up in their i16 lanes over as many steps as
//! cannot overflow (eight of 4-bit codes, two of 6-bit), then `vpmaddwd` takes them to
//! i32. The integers are exact, and what follows is the VNNI kernel's arithmetic lane for
//! lane, so the products are the same bits on either tier. Q8_0's codes take 8 bits, whose
//! pairs would saturate: its prompts take the exact products here.

use std::arch::x86_64::*;

use super::{Accumulate, MR, NR, Packed, QK};
use crate::quant::BlockType;

/// Whether this kernel takes `ty` (see the module's comment).
pub(super) fn takes(ty: BlockType) -> bool {
    matches!(ty, BlockType::Q4_0 | BlockType::Q4K | BlockType::Q6K)
}

/// A step's codes (`step`: whole blocks of `ty`) in input order, unsigned (Q8_0's plus
/// 128, Q4_0's and Q4_K's 4 bits, Q6_K's 6), into `codes`.
///
/// # Safety
/// AVX2 present.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn codes(ty: BlockType, step: &[u8], codes: &mut [u8]) {
    let blocks = step.len() / ty.bytes();
    assert!(step.len() == blocks * ty.bytes() && blocks * ty.values() <= QK);
    assert!(codes.len() >= QK);
    let nibbles = _mm256_set1_epi8(0x0f);
    // SAFETY (whole body): the asserts keep every read inside `step` (32 bytes read at
    // most 32 bytes before a block's end) and every write inside `codes`.
    unsafe {
        let load = |at: usize| _mm256_loadu_si256(step.as_ptr().add(at).cast());
        let to = codes.as_mut_ptr();
        let store = |at: usize, v: __m256i| _mm256_storeu_si256(to.add(at).cast(), v);
        match ty {
            BlockType::Q8_0 => {
                for b in 0..blocks {
                    let q = load(b * ty.bytes() + 2);
                    store(32 * b, _mm256_xor_si256(q, _mm256_set1_epi8(-128)));
                }
            }
            BlockType::Q4_0 => {
                // Values 0..16 in the low nibbles, 16..32 in the high.
                let nibbles = _mm_set1_epi8(0x0f);
                for b in 0..blocks {
                    let q = _mm_loadu_si128(step.as_ptr().add(b * ty.bytes() + 2).cast());
                    let low = _mm_and_si128(q, nibbles);
                    let high = _mm_and_si128(_mm_srli_epi16(q, 4), nibbles);
                    _mm_storeu_si128(to.add(32 * b).cast(), low);
                    _mm_storeu_si128(to.add(32 * b + 16).cast(), high);
                }
            }
            BlockType::Q4K => {
                // Bytes 32c..32c + 32 hold group 2c in their low nibbles, 2c + 1 in the
                // high.
                for c in 0..4 {
                    let q = load(16 + 32 * c);
                    store(64 * c, _mm256_and_si256(q, nibbles));
                    store(
                        64 * c + 32,
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), nibbles),
                    );
                }
            }
            BlockType::Q6K => {
                // As `quant::q6_k` reads them, 32 values at a time.
                let twos = _mm256_set1_epi8(0x30);
                for c in 0..8 {
                    let (half, quarter) = (c / 4, c % 4);
                    let low = load(half * 64 + (quarter % 2) * 32);
                    let low = if quarter / 2 == 1 {
                        _mm256_srli_epi16(low, 4)
                    } else {
                        low
                    };
                    let high = load(128 + half * 32);
                    // The two bits at 2 * quarter, moved to bits 4 and 5.
                    let high = match quarter {
                        0 => _mm256_slli_epi16(high, 4),
                        1 => _mm256_slli_epi16(high, 2),
                        2 => high,
                        _ => _mm256_srli_epi16(high, 2),
                    };
                    let code = _mm256_or_si256(
                        _mm256_and_si256(low, nibbles),
                        _mm256_and_si256(high, twos),
                    );
                    store(32 * c, code);
                }
            }
            other => unreachable!("no int8 kernel for {other}"),
        }
    }
}

/// Prompt rows at a time: two registers of i16 sums each (the panel's sixteen weight
/// rows), beside the panel's two registers of codes and the broadcast inputs, fifteen of
/// the sixteen registers.
const ROWS: usize = 6;

/// See `Rounded::tile`, and the AVX-512 kernel's `tile` for `G`, `C` and `PER_GROUP`.
/// `STEPS`: four-input steps whose pairs add up in i16 before going to i32 (at most 8 for
/// 4-bit codes, 2 for 6-bit; a divisor of `G`).
///
/// # Safety
/// AVX2 and FMA present; `sums` as `Rounded::tile` says.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<
    const G: usize,
    const C: i32,
    const PER_GROUP: bool,
    const STEPS: usize,
>(
    packed: &Packed,
    x: &[i8],
    terms: (&[i32], &[f32]),
    d: &[f32],
    sums: Accumulate,
    (valid, n): (usize, usize),
) {
    let groups = QK / 4 / G;
    let scales = if PER_GROUP { groups } else { 1 };
    let count = if C == 0 { terms.1.len() } else { terms.0.len() };
    assert!(x.len() >= MR * QK && count >= MR * groups && d.len() >= MR * scales);
    assert!(G.is_multiple_of(STEPS) && n <= NR);
    // Each row's sums over the step: its sixteen columns as two halves.
    let mut block = [[_mm256_setzero_ps(); 2]; MR];
    // SAFETY (whole body): the asserts and the caller's promises keep every read inside
    // the slices and every write inside out's tile.
    unsafe {
        let mut first = 0;
        while first < MR {
            // A last part of fewer rows (MR = 6 + 6 + 2).
            if MR - first >= ROWS {
                rows::<ROWS, G, C, PER_GROUP, STEPS>(packed, x, terms, d, first, &mut block);
                first += ROWS;
            } else {
                rows::<{ MR % ROWS }, G, C, PER_GROUP, STEPS>(
                    packed, x, terms, d, first, &mut block,
                );
                first += MR % ROWS;
            }
        }
        // Columns `8h..8h + 8` that are real: lanes below `n - 8h`.
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mask = |h: i32| _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32 - 8 * h), lanes);
        let masks = [mask(0), mask(1)];
        let (from, to) = (sums.from, sums.to);
        for (r, block) in block.iter().enumerate().take(valid) {
            for (h, (&block, &mask)) in block.iter().zip(&masks).enumerate() {
                let acc = if from.0.is_null() {
                    _mm256_setzero_ps()
                } else {
                    _mm256_maskload_ps(from.0.add(r * from.1 + 8 * h), mask)
                };
                let acc = if PER_GROUP {
                    _mm256_add_ps(acc, block)
                } else {
                    _mm256_fmadd_ps(block, _mm256_set1_ps(d[r]), acc)
                };
                _mm256_maskstore_ps(to.0.add(r * to.1 + 8 * h), mask, acc);
            }
        }
    }
}

/// Rows `first..first + R` of the tile over the step into `block` (see [`tile`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows<
    const R: usize,
    const G: usize,
    const C: i32,
    const PER_GROUP: bool,
    const STEPS: usize,
>(
    packed: &Packed,
    x: &[i8],
    (starts, totals): (&[i32], &[f32]),
    d: &[f32],
    first: usize,
    block: &mut [[__m256; 2]; MR],
) {
    let groups = QK / 4 / G;
    // SAFETY (whole body): as in `tile`, rows `first..first + R` being the tile's.
    unsafe {
        let codes = packed.codes.as_ptr();
        let xs = x.as_ptr().add(first * QK);
        let ones = _mm256_set1_epi16(1);
        for g in 0..groups {
            let mut dots: [[__m256i; 2]; R] = std::array::from_fn(|r| {
                let start = if C == 0 {
                    0
                } else {
                    *starts.get_unchecked((first + r) * groups + g)
                };
                [_mm256_set1_epi32(start); 2]
            });
            for steps in (g * G..(g + 1) * G).step_by(STEPS) {
                let mut pairs = [[_mm256_setzero_si256(); 2]; R];
                for k in steps..steps + STEPS {
                    let w = codes.add(k * NR * 4);
                    let w = [
                        _mm256_load_si256(w.cast()),
                        _mm256_load_si256(w.add(32).cast()),
                    ];
                    for (r, pairs) in pairs.iter_mut().enumerate() {
                        let four = xs.add(r * QK + 4 * k).cast::<i32>().read_unaligned();
                        let four = _mm256_set1_epi32(four);
                        for (pair, &w) in pairs.iter_mut().zip(&w) {
                            *pair = _mm256_add_epi16(*pair, _mm256_maddubs_epi16(w, four));
                        }
                    }
                }
                for (dots, pairs) in dots.iter_mut().zip(&pairs) {
                    for (dot, &pair) in dots.iter_mut().zip(pairs) {
                        *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(pair, ones));
                    }
                }
            }
            // The group's scales and offsets for the panel's rows, as two halves.
            let halves = |at: *const f32| [_mm256_load_ps(at), _mm256_load_ps(at.add(8))];
            let scales = halves(packed.scales.as_ptr().add(g * NR));
            let offsets = halves(packed.offsets.as_ptr().add(g * NR));
            for (r, dots) in dots.iter().enumerate() {
                let row = first + r;
                for h in 0..2 {
                    let scale = scales[h];
                    let scale = if PER_GROUP {
                        _mm256_mul_ps(scale, _mm256_set1_ps(*d.get_unchecked(row * groups + g)))
                    } else {
                        scale
                    };
                    let sum = &mut block[row][h];
                    *sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h]), scale, *sum);
                    if C == 0 {
                        let total = _mm256_set1_ps(*totals.get_unchecked(row * groups + g));
                        *sum = _mm256_fnmadd_ps(offsets[h], total, *sum);
                    }
                }
            }
        }
    }
}
