//! The block types decoded only when a GGUF is imported (the kernels keep none of them):
//! Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, each as gguf-py's `gguf.quants.dequantize` (and
//! ggml-quants.c's `dequantize_row_*`) decodes it: the same element order and the same f32
//! operations in the same order, so the values are bit-identical
//! (converter/tests/quants.rs compares every type with gguf-py on random blocks).

use super::{half_at, scale_min_k4};

/// `d: f16, m: f16, qs: [u8; 16]`: `d * q + m`.
pub(super) fn q4_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(block, 0), half_at(block, 2));
    let qs = &block[4..20];
    for j in 0..16 {
        out[j] = d * (qs[j] & 0x0f) as f32 + m;
        out[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

/// `d: f16, m: f16, qh: u32, qs: [u8; 16]`: `d * q + m`, value `i`'s low four bits as
/// Q4_1's and its fifth bit `i` of `qh`.
pub(super) fn q5_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(block, 0), half_at(block, 2));
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let qs = &block[8..24];
    for j in 0..16 {
        let low = (qs[j] & 0x0f) | (((qh >> j) & 1) as u8) << 4;
        let high = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        out[j] = d * low as f32 + m;
        out[j + 16] = d * high as f32 + m;
    }
}

/// `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16`. Sixteen groups of 16; group `j`
/// is `(d * (scales[j] & 15)) * q - dmin * (scales[j] >> 4)`. Element `e`'s 2 bits are in
/// byte `e / 128 * 32 + e % 32` at shift `2 * (e % 128 / 32)`.
pub(super) fn q2_k(block: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&block[..16], &block[16..80]);
    let (d, dmin) = (half_at(block, 80), half_at(block, 82));
    for (e, out) in out.iter_mut().enumerate().take(256) {
        let q = (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
        let scale = scales[e / 16];
        let (dl, ml) = (d * (scale & 0xf) as f32, dmin * (scale >> 4) as f32);
        *out = dl * q as f32 - ml;
    }
}

/// `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16`. Sixteen groups of 16 with a
/// 6-bit signed scale each (low 4 bits in bytes 0..8, high 2 in bytes 8..12); element `e`
/// is its 2 bits (laid out as Q2_K's) minus 4 unless its `hmask` bit is set.
pub(super) fn q3_k(block: &[u8], out: &mut [f32]) {
    let (hmask, qs, packed) = (&block[..32], &block[32..96], &block[96..108]);
    let d = half_at(block, 108);
    let scale = |k: usize| {
        let low = (packed[k % 8] >> (4 * (k / 8))) & 0x0f;
        let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        ((low | high << 4) as i8 - 32) as f32
    };
    let dl: [f32; 16] = std::array::from_fn(|k| d * scale(k));
    for (e, out) in out.iter_mut().enumerate().take(256) {
        let low = (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
        let high = ((hmask[e % 32] >> (e / 32)) & 1) ^ 1;
        *out = dl[e / 16] * (low as i8 - (high << 2) as i8) as f32;
    }
}

/// `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`: Q4_K with a fifth
/// bit, bit `e / 32` of `qh[e % 32]`.
pub(super) fn q5_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let (scales, mins) = scale_min_k4(&block[4..16]);
    let (qh, qs) = (&block[16..48], &block[48..]);
    for (e, out) in out.iter_mut().enumerate().take(256) {
        let low = (qs[e / 64 * 32 + e % 32] >> (4 * (e % 64 / 32))) & 0x0f;
        let q = low | ((qh[e % 32] >> (e / 32)) & 1) << 4;
        let j = e / 32;
        *out = (d * scales[j] as f32) * q as f32 - dmin * mins[j] as f32;
    }
}
