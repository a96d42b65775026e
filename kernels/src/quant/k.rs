//! ggml's reference quantizers for the K types, `quantize_row_q4_K_ref` and
//! `quantize_row_q6_K_ref` (ggml-quants.c): what `ggml_quantize_chunk` runs without an
//! importance matrix, and so what llama-quantize writes without one.
//!
//! Each scale is the outcome of a search that compares f32 sums of squared errors, so a
//! single rounding done differently can pick another scale and change every byte of a
//! group. Every expression is therefore ggml's, in its order, in f32, products and sums
//! each rounded: the library that `kernels/tests/quant.rs` compares against is built
//! for plain SSE2 (its disassembly has no FMA), so nothing is fused. `int` operands that C
//! converts to float (`nmax`, a code `l`, a loop index) are converted at the same point.

use half::f16;

use super::scale_min_k4;

/// Values in a K-type block.
const QK_K: usize = 256;

/// Below this largest magnitude a group is all zero (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: adding 1.5 * 2^23 leaves `round(x)` (ties to even) in the low
/// mantissa bits, for `|x| < 2^22`. Beyond that (or for NaN) the bits are garbage, as in
/// ggml, whose release build drops the assert; callers clamp them to a valid code, and the
/// garbage must be ggml's for the clamped code to be.
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `quantize_row_q4_K_ref` for one block of 256 values: eight groups of 32, each
/// `scale * q - min` with q in 0..=15, scale and min fitted to the group by weighted least
/// squares (`fit_scale_min`), then both stored as 6-bit multiples of the block's d and dmin
/// and the codes made again from the stored scales.
pub(super) fn quantize_q4_k(values: &[f32], out: &mut Vec<u8>) {
    let x: &[f32; QK_K] = values.try_into().expect("a block of 256 values");
    let mut codes = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, group) in x.chunks_exact(32).enumerate() {
        let mut sum_x2 = 0f32;
        for &v in group {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + group[l].abs());
        let codes = (&mut codes[32 * j..][..32]).try_into().expect("32 codes");
        (scales[j], mins[j]) = fit_scale_min(group.try_into().expect("32"), &weights, codes);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // C stores the int in a uint8_t (modulo 256) before clamping to 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | (lm & 0x0f) << 4;
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (
        f16::from_f32(max_scale / 63.0),
        f16::from_f32(max_min / 63.0),
    );

    // Codes again from the scales as stored; a group whose stored scale is zero keeps the
    // codes of its fit, as in ggml.
    let (sc, m) = scale_min_k4(&packed);
    for (j, group) in x.chunks_exact(32).enumerate() {
        let dl = d.to_f32() * f32::from(sc[j]);
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m[j]);
        for (code, &v) in codes[32 * j..][..32].iter_mut().zip(group) {
            *code = nearest_int((v + dm) / dl).clamp(0, 15) as u8;
        }
    }
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(packed);
    for pair in codes.chunks_exact(64) {
        out.extend((0..32).map(|l| pair[l] | pair[l + 32] << 4));
    }
}

/// ggml's `make_qkx2_quants(32, 15, x, weights, L, &the_min, Laux, -1, 0.1, 20, false)`:
/// codes `L` in 0..=15 and `(scale, the_min)` with `x ≈ scale * L - the_min`, the min kept
/// at or below zero. Starts from the range's own step, then tries 21 steps around it,
/// each with the least-squares scale and min for its codes, and keeps the one of least
/// weighted squared error.
fn fit_scale_min(x: &[f32; 32], weights: &[f32; 32], codes: &mut [u8; 32]) -> (f32, f32) {
    const NMAX: f32 = 15.0;
    const RMIN: f32 = -1.0;
    const RDELTA: f32 = 0.1;
    const NSTEP: i32 = 20;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..32 {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        codes.fill(0);
        return (0.0, -min);
    }
    // `min` is an argument: ggml's search measures each trial from the best min so far,
    // both in the codes and in the step `(max - min)`, not from the range's own minimum.
    let code = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, 15) as u8;
    let error = |scale: f32, min: f32, codes: &[u8; 32]| {
        let mut error = 0f32;
        for i in 0..32 {
            let diff = scale * f32::from(codes[i]) + min - x[i];
            error += weights[i] * (diff * diff);
        }
        error
    };
    let iscale = NMAX / (max - min);
    let mut scale = 1.0 / iscale;
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = code(iscale, min, v);
    }
    let mut best_error = error(scale, min, codes);
    let mut trial = [0u8; 32];
    for is in 0..=NSTEP {
        let iscale = (RMIN + RDELTA * is as f32 + NMAX) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..32 {
            trial[i] = code(iscale, min, x[i]);
            let (w, l) = (weights[i], f32::from(trial[i]));
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let this_error = error(this_scale, this_min, &trial);
            if this_error < best_error {
                *codes = trial;
                best_error = this_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `quantize_row_q6_K_ref` for one block of 256 values: sixteen groups of 16, each
/// `scale * (q - 32)` with q in 0..=63, the scale fitted per group (`fit_scale`), then
/// stored as a signed 8-bit multiple of the block's d (the largest scale, by magnitude,
/// as -128) and the codes made again from the stored scales.
pub(super) fn quantize_q6_k(values: &[f32], out: &mut Vec<u8>) {
    let x: &[f32; QK_K] = values.try_into().expect("a block of 256 values");
    let mut codes = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (ib, group) in x.chunks_exact(16).enumerate() {
        let codes = (&mut codes[16 * ib..][..16]).try_into().expect("16 codes");
        scales[ib] = fit_scale(group.try_into().expect("16"), codes);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        // ggml zeroes the block, d included (f16 +0.0 is all zero bits).
        out.extend([0u8; 210]);
        return;
    }

    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    // C stores the int in an int8_t: wraps, though only 128 (clamped) can exceed its range.
    let block_scales: [i8; 16] = std::array::from_fn(|ib| {
        let scale = nearest_int(iscale * scales[ib]).min(127);
        scale as i8
    });
    for (j, group) in x.chunks_exact(16).enumerate() {
        let dl = d.to_f32() * f32::from(block_scales[j]);
        if dl == 0.0 {
            continue;
        }
        for (code, &v) in codes[16 * j..][..16].iter_mut().zip(group) {
            *code = (nearest_int(v / dl).clamp(-32, 31) + 32) as u8;
        }
    }

    // Value e's low nibble to byte e / 128 * 64 + e % 64 (high nibble when e % 128 >= 64),
    // its top 2 bits to byte 128 + e / 128 * 32 + e % 32 at shift 2 * (e % 128 / 32).
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (half, codes) in codes.chunks_exact(128).enumerate() {
        for l in 0..32 {
            let q = [codes[l], codes[l + 32], codes[l + 64], codes[l + 96]];
            ql[64 * half + l] = (q[0] & 0x0f) | (q[2] & 0x0f) << 4;
            ql[64 * half + l + 32] = (q[1] & 0x0f) | (q[3] & 0x0f) << 4;
            qh[32 * half + l] =
                (q[0] >> 4) | (q[1] >> 4) << 2 | (q[2] >> 4) << 4 | (q[3] >> 4) << 6;
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(block_scales.map(|s| s as u8));
    out.extend(d.to_le_bytes());
}

/// ggml's `make_qx_quants(16, 32, x, L, 1, NULL)`: codes `L` in 0..=63 (value `l - 32`)
/// and a scale with `x ≈ scale * (L - 32)`, weights `x²`. Starts from the step that
/// puts the value of largest magnitude at -32, then tries 18 steps around it (±0.1 to
/// ±0.9 codes at that value) and keeps the one whose least-squares scale explains the most
/// of the weighted `x²` (largest `sumlx² / suml2`).
fn fit_scale(x: &[f32; 16], codes: &mut [u8; 16]) -> f32 {
    const NMAX: i32 = 32;
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
    // sumlx = Σ w·x·l and suml2 = Σ w·l·l with w = x², for the codes of `iscale`.
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let (w, l) = (v * v, code(iscale, v) as f32);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let set_codes = |iscale: f32, codes: &mut [u8; 16]| {
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = (code(iscale, v) + NMAX) as u8;
        }
    };
    let iscale = -(NMAX as f32) / max;
    set_codes(iscale, codes);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(NMAX as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set_codes(iscale, codes);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }
}
