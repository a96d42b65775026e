//! Vectorized element-wise math for the fused kernels: an `exp` the compiler can vectorize
//! (libm's `expf` is a scalar call per element) and row reductions in independent lanes.
//!
//! Nothing here is written with intrinsics. The loops are plain Rust shaped so LLVM
//! vectorizes them (branch-free bodies, `LANES` independent accumulators), and
//! [`vectorized`] compiles its closure a second time with AVX-512 enabled, chosen at run time,
//! so the same binary runs on any x86-64 and uses 16-wide registers where they exist.

/// Independent accumulators per reduction: one AVX-512 register of f32.
const LANES: usize = 16;

/// Runs `work` compiled for AVX-512 (with FMA) when the CPU has it, else as built.
///
/// `work` and everything it inlines (the `#[inline(always)]` helpers below) is compiled
/// into [`with_avx512`], so it picks up that function's target features.
#[inline(always)]
pub fn vectorized<R>(work: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the features `with_avx512` enables were just detected on this CPU.
        return unsafe { with_avx512(work) };
    }
    work()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn with_avx512<R>(work: impl FnOnce() -> R) -> R {
    work()
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

/// `gate[i] = silu(gate[i]) * up[i]`, with `silu(x) = x / (1 + e^-x)` as in PyTorch.
#[inline(always)]
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
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
    fn vectorized_paths_match_scalar_ones() {
        let row: Vec<f32> = (0..1000)
            .map(|i| ((i * 37) % 101) as f32 * 0.13 - 6.0)
            .collect();
        assert_eq!(
            vectorized(|| max(&row)),
            row.iter().copied().fold(f32::MIN, f32::max)
        );
        let mut fast = row.clone();
        let sum = vectorized(|| exp_shifted_sum(&mut fast, 7.0));
        let exact: Vec<f32> = row.iter().map(|x| (x - 7.0).exp()).collect();
        for (a, b) in fast.iter().zip(&exact) {
            assert!(ulps(*a, *b) <= 2);
        }
        let exact_sum: f32 = exact.iter().sum();
        assert!((sum - exact_sum).abs() <= 1e-5 * exact_sum);
        let mut gate = row.clone();
        vectorized(|| silu_mul(&mut gate, &row));
        for ((s, g), u) in gate.iter().zip(&row).zip(&row) {
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (s - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{s} vs {want}"
            );
        }
    }
}
