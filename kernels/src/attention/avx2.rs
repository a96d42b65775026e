//! The grouped span's blocks on AVX2 ([`grouped`](super::grouped)): the AVX-512 blocks'
//! arithmetic in eight lanes and within sixteen registers.

use std::arch::x86_64::*;

use super::grouped::{Grouped, ScoreBlock, SumTile};
use crate::stored::Stored;

pub(super) struct Avx2;

impl Grouped for Avx2 {
    /// Four accumulators per head, the heads' query registers and a key's: 11 of the 16
    /// registers for two heads.
    const ROWS: usize = 4;
    const SCORE_HEADS: usize = 2;
    /// Four value registers and four accumulators per head: 13 registers for two heads.
    const SUM_COLUMNS: usize = 32;
    const SUM_HEADS: usize = 2;

    fn available() -> bool {
        crate::cpu::tier() >= crate::cpu::Tier::Avx2
    }

    unsafe fn scores<S: Stored>(heads: usize, block: ScoreBlock<S>) {
        // SAFETY: the caller's.
        unsafe {
            match heads {
                1 => score_block::<S, 1>(block),
                _ => score_block::<S, 2>(block),
            }
        }
    }

    unsafe fn sums<S: Stored>(heads: usize, tile: SumTile<S>) {
        // SAFETY: the caller's.
        unsafe {
            match heads {
                1 => sum_tile::<S, 1>(tile),
                _ => sum_tile::<S, 2>(tile),
            }
        }
    }
}

const ROWS: usize = Avx2::ROWS;

/// Eight values from `p`, `S` widened exactly (bf16 is the high half of its f32).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load<S: Stored>(p: *const S) -> __m256 {
    // SAFETY: `p` points at eight values of S (the caller's promise).
    unsafe {
        if size_of::<S>() == 4 {
            _mm256_loadu_ps(p.cast())
        } else {
            let half = _mm_loadu_si128(p.cast());
            if S::BF16 {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half)))
            } else {
                _mm256_cvtph_ps(half)
            }
        }
    }
}

/// A [`ScoreBlock`] of `G` heads. Each score is its row's products summed in eight lanes
/// over the columns, then the lanes added as [`sums4`] adds them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_block<S: Stored, const G: usize>(block: ScoreBlock<S>) {
    let ScoreBlock {
        queries,
        head_dim,
        keys,
        stride,
        rows,
        out,
        n,
    } = block;
    // SAFETY: the caller's (see `grouped::span`); rows past `rows` read the last row again,
    // and their scores are not stored.
    unsafe {
        let row: [*const S; ROWS] = std::array::from_fn(|j| keys.add(j.min(rows - 1) * stride));
        let mut sums = [[_mm256_setzero_ps(); ROWS]; G];
        for column in (0..head_dim).step_by(8) {
            let q: [__m256; G] =
                std::array::from_fn(|h| _mm256_loadu_ps(queries.add(h * head_dim + column)));
            for j in 0..ROWS {
                let k = load(row[j].add(column));
                for h in 0..G {
                    sums[h][j] = _mm256_fmadd_ps(k, q[h], sums[h][j]);
                }
            }
        }
        let lane = |j: usize| if j < rows { -1 } else { 0 };
        let mask = _mm_setr_epi32(lane(0), lane(1), lane(2), lane(3));
        for (h, sums) in sums.into_iter().enumerate() {
            _mm_maskstore_ps(out.add(h * n), mask, sums4(sums));
        }
    }
}

/// Lane `j`: the eight lanes of `v[j]` added, pairs of registers at a time.
#[inline]
#[target_feature(enable = "avx2")]
fn sums4(v: [__m256; ROWS]) -> __m128 {
    // Registers j and j + 2: their halves added, row j's four partial sums in the low
    // half, row j + 2's in the high.
    let halves: [__m256; 2] = std::array::from_fn(|j| {
        let (a, b) = (v[j], v[j + 2]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    });
    // Lanes 0 + 2 and 1 + 3 of each half: two partial sums of rows 0 and 1 in the low
    // half, of rows 2 and 3 in the high.
    let (a, b) = (halves[0], halves[1]);
    let pairs = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
        _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
    );
    // Each pair added: rows 0, 1, 2, 3 in lanes 0, 2, 4, 6.
    let sums = _mm256_add_ps(pairs, _mm256_shuffle_ps::<0b10_11_00_01>(pairs, pairs));
    let order = _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0);
    _mm256_castps256_ps128(_mm256_permutevar8x32_ps(sums, order))
}

/// A [`SumTile`] of `G` heads, one multiply-add a row and column.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_tile<S: Stored, const G: usize>(tile: SumTile<S>) {
    const REGISTERS: usize = Avx2::SUM_COLUMNS / 8;
    let SumTile {
        weights,
        n,
        values,
        stride,
        rows,
        out,
        out_stride,
    } = tile;
    // SAFETY: the caller's (see `grouped::span`).
    unsafe {
        let mut sums: [[__m256; REGISTERS]; G] = std::array::from_fn(|h| {
            std::array::from_fn(|c| _mm256_loadu_ps(out.add(h * out_stride + 8 * c)))
        });
        for j in 0..rows {
            let row = values.add(j * stride);
            let v: [__m256; REGISTERS] = std::array::from_fn(|c| load(row.add(8 * c)));
            for (h, sums) in sums.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*weights.add(h * n + j));
                for (sum, &v) in sums.iter_mut().zip(&v) {
                    *sum = _mm256_fmadd_ps(w, v, *sum);
                }
            }
        }
        for (h, sums) in sums.iter().enumerate() {
            for (c, &sum) in sums.iter().enumerate() {
                _mm256_storeu_ps(out.add(h * out_stride + 8 * c), sum);
            }
        }
    }
}
