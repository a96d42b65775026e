//! The grouped span's blocks on AVX-512 ([`grouped`](super::grouped)).

use std::arch::x86_64::*;

use super::grouped::{Grouped, ScoreBlock, SumTile};
use crate::simd::avx512::load;
use crate::stored::Stored;

pub(super) struct Avx512;

impl Grouped for Avx512 {
    /// Eight accumulators per head, the heads' query registers and a key's: 28 of the 32
    /// registers for three heads.
    const ROWS: usize = 8;
    const SCORE_HEADS: usize = 3;
    /// Four value registers and four accumulators per head: 28 registers for six heads.
    const SUM_COLUMNS: usize = 64;
    const SUM_HEADS: usize = 6;

    fn available() -> bool {
        crate::cpu::tier() >= crate::cpu::Tier::Avx512
    }

    unsafe fn scores<S: Stored>(heads: usize, block: ScoreBlock<S>) {
        // SAFETY: the caller's.
        unsafe {
            match heads {
                1 => score_block::<S, 1>(block),
                2 => score_block::<S, 2>(block),
                _ => score_block::<S, 3>(block),
            }
        }
    }

    unsafe fn sums<S: Stored>(heads: usize, tile: SumTile<S>) {
        // SAFETY: the caller's.
        unsafe {
            match heads {
                1 => sum_tile::<S, 1>(tile),
                2 => sum_tile::<S, 2>(tile),
                3 => sum_tile::<S, 3>(tile),
                4 => sum_tile::<S, 4>(tile),
                5 => sum_tile::<S, 5>(tile),
                _ => sum_tile::<S, 6>(tile),
            }
        }
    }
}

const ROWS: usize = Avx512::ROWS;

/// A [`ScoreBlock`] of `G` heads. Each score is its row's products summed in sixteen lanes
/// over the columns, then the lanes added as [`sums8`] adds them.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,f16c")]
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
        let mut sums = [[_mm512_setzero_ps(); ROWS]; G];
        for column in (0..head_dim).step_by(16) {
            let q: [__m512; G] =
                std::array::from_fn(|h| _mm512_loadu_ps(queries.add(h * head_dim + column)));
            for j in 0..ROWS {
                let k = load(row[j].add(column));
                for h in 0..G {
                    sums[h][j] = _mm512_fmadd_ps(k, q[h], sums[h][j]);
                }
            }
        }
        let mask = u8::MAX >> (ROWS - rows);
        for (h, sums) in sums.into_iter().enumerate() {
            _mm256_mask_storeu_ps(out.add(h * n), mask, sums8(sums));
        }
    }
}

/// Lane `j`: the sixteen lanes of `v[j]` added, pairs of registers at a time (8 -> 4 -> 2
/// -> 1), about three shuffles and adds per sum where reducing each register alone takes
/// eight.
#[inline]
#[target_feature(enable = "avx512f")]
fn sums8(v: [__m512; ROWS]) -> __m256 {
    // Registers j and j + 4: their 128-bit quarters 0 + 2 and 1 + 3, row j's eight partial
    // sums in the low half, row j + 4's in the high.
    let halves: [__m512; 4] = std::array::from_fn(|j| {
        let (a, b) = (v[j], v[j + 4]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    });
    // Registers i and i + 2: each quarter four partial sums of one row, rows i, i + 4,
    // i + 2, i + 6 in quarters 0..4.
    let quarters: [__m512; 2] = std::array::from_fn(|i| {
        let (a, b) = (halves[i], halves[i + 2]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    });
    // Within each quarter, lanes 0 + 2 and 1 + 3 of each register: quarter q holds two
    // partial sums of a row of the first register, then two of the second's same row.
    let (a, b) = (quarters[0], quarters[1]);
    let pairs = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
        _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
    );
    // Each pair added: the sums in lanes 0, 2 of each quarter, rows
    // [0, 1], [4, 5], [2, 3], [6, 7].
    let sums = _mm512_add_ps(pairs, _mm512_shuffle_ps::<0b10_11_00_01>(pairs, pairs));
    const ORDER: [i32; 16] = [0, 2, 8, 10, 4, 6, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: ORDER is sixteen i32s.
    let order = unsafe { _mm512_loadu_si512(ORDER.as_ptr().cast()) };
    _mm512_castps512_ps256(_mm512_permutexvar_ps(order, sums))
}

/// A [`SumTile`] of `G` heads, one multiply-add a row and column.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,f16c")]
unsafe fn sum_tile<S: Stored, const G: usize>(tile: SumTile<S>) {
    const REGISTERS: usize = Avx512::SUM_COLUMNS / 16;
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
        let mut sums: [[__m512; REGISTERS]; G] = std::array::from_fn(|h| {
            std::array::from_fn(|c| _mm512_loadu_ps(out.add(h * out_stride + 16 * c)))
        });
        for j in 0..rows {
            let row = values.add(j * stride);
            let v: [__m512; REGISTERS] = std::array::from_fn(|c| load(row.add(16 * c)));
            for (h, sums) in sums.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*weights.add(h * n + j));
                for (sum, &v) in sums.iter_mut().zip(&v) {
                    *sum = _mm512_fmadd_ps(w, v, *sum);
                }
            }
        }
        for (h, sums) in sums.iter().enumerate() {
            for (c, &sum) in sums.iter().enumerate() {
                _mm512_storeu_ps(out.add(h * out_stride + 16 * c), sum);
            }
        }
    }
}
