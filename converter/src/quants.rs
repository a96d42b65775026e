//! ggml's tensor types, and their blocks decoded to f32 exactly as gguf-py's
//! `gguf.quants.dequantize` (and ggml-quants.c's `dequantize_row_*`) decode them: the same
//! element order and the same f32 operations in the same order (a scale times an integer,
//! then minus or plus a minimum), so the values are bit-identical
//! (tests/quants.rs compares every type with gguf-py on random blocks).

use anyhow::{Result, bail, ensure};
use half::f16;
use kernels::quant::{BlockType, scale_min_k4};

/// Values per super-block of the K-quants.
const QK_K: usize = 256;

/// ggml tensor types: the ones we decode, and the names of the others for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// Known to ggml, not supported here: the id and its ggml name.
    Unsupported(u32, &'static str),
}

/// The supported types' names, for errors.
const SUPPORTED: &str =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    /// The type of ggml type id `id` (ggml.h's `enum ggml_type`).
    pub fn from_id(id: u32) -> Result<Self> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::Bf16,
            _ => {
                let name = match id {
                    9 => "Q8_1",
                    15 => "Q8_K",
                    16 => "IQ2_XXS",
                    17 => "IQ2_XS",
                    18 => "IQ3_XXS",
                    19 => "IQ1_S",
                    20 => "IQ4_NL",
                    21 => "IQ3_S",
                    22 => "IQ2_S",
                    23 => "IQ4_XS",
                    24 => "I8",
                    25 => "I16",
                    26 => "I32",
                    27 => "I64",
                    28 => "F64",
                    29 => "IQ1_M",
                    34 => "TQ1_0",
                    35 => "TQ2_0",
                    39 => "MXFP4",
                    _ => bail!("unknown ggml tensor type id {id}"),
                };
                Self::Unsupported(id, name)
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Unsupported(_, name) => name,
        }
    }

    /// (elements per block, bytes per block), as ggml's type traits give them.
    pub fn block(self) -> Option<(u64, u64)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Unsupported(..) => return None,
        })
    }
}

/// Decodes `numel` values of type `ty` from `bytes` (whose length was checked at open).
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>> {
    let Some((block_values, block_bytes)) = ty.block() else {
        bail!(
            "unsupported GGUF tensor type {} (ggml type {}); supported: {SUPPORTED}",
            ty.name(),
            match ty {
                GgmlType::Unsupported(id, _) => id,
                _ => unreachable!("every other type has a block"),
            }
        )
    };
    // Capacity bounded by the bytes present, whatever `numel` claims.
    let blocks = bytes.len() / block_bytes as usize;
    let mut out = Vec::with_capacity(numel.min(blocks * block_values as usize));
    // The types the runtime keeps in memory decode with its own code: one definition of
    // their values for the record and the kernels.
    if let Some(kept) = BlockType::ALL
        .into_iter()
        .find(|kept| kept.name() == ty.name())
    {
        out.resize(blocks * block_values as usize, 0.0);
        kept.decode(&bytes[..blocks * block_bytes as usize], &mut out);
    }
    let chunks = bytes.chunks_exact(block_bytes as usize);
    match ty {
        GgmlType::F32 => out.extend(chunks.map(|c| f32::from_le_bytes(c.try_into().unwrap()))),
        GgmlType::F16 => out.extend(chunks.map(|c| half_at(c, 0))),
        GgmlType::Bf16 => {
            out.extend(chunks.map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()))
        }
        GgmlType::Q4_1 => chunks.for_each(|b| q4_1(b, &mut out)),
        GgmlType::Q5_1 => chunks.for_each(|b| q5_1(b, &mut out)),
        GgmlType::Q2K => chunks.for_each(|b| q2_k(b, &mut out)),
        GgmlType::Q3K => chunks.for_each(|b| q3_k(b, &mut out)),
        GgmlType::Q5K => chunks.for_each(|b| q5_k(b, &mut out)),
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4K | GgmlType::Q6K => {}
        GgmlType::Unsupported(..) => unreachable!("refused above"),
    }
    ensure!(
        out.len() == numel,
        "decoded {} values, expected {numel}",
        out.len()
    );
    Ok(out)
}

/// The f16 at byte `i` of `b`, as f32.
fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `d: f16, m: f16, qs: [u8; 16]`: `d * q + m`.
fn q4_1(block: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(block, 0), half_at(block, 2));
    let qs = &block[4..];
    out.extend(qs.iter().map(|&q| d * (q & 0x0f) as f32 + m));
    out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
}

/// The 5-bit values of a Q5_1 block (laid out as Q5_0's): 16 bytes of low nibbles (as Q4) and a u32 of
/// fifth bits, bit `i` for element `i`.
fn five_bits(qh: &[u8], qs: &[u8]) -> impl Iterator<Item = u8> {
    let qh = u32::from_le_bytes(qh.try_into().expect("4 bytes"));
    let low = (qs.iter().map(|q| q & 0x0f)).chain(qs.iter().map(|q| q >> 4));
    low.enumerate()
        .map(move |(i, low)| low | (((qh >> i) & 1) as u8) << 4)
}

/// `d: f16, m: f16, qh: u32, qs: [u8; 16]`: `d * q + m`.
fn q5_1(block: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(block, 0), half_at(block, 2));
    out.extend(five_bits(&block[4..8], &block[8..]).map(|q| d * q as f32 + m));
}

/// `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16`. Sixteen groups of 16; group `j`
/// is `(d * (scales[j] & 15)) * q - dmin * (scales[j] >> 4)`. Element `e`'s 2 bits are in
/// byte `e / 128 * 32 + e % 32` at shift `2 * (e % 128 / 32)`.
fn q2_k(block: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&block[..16], &block[16..80]);
    let (d, dmin) = (half_at(block, 80), half_at(block, 82));
    out.extend((0..QK_K).map(|e| {
        let q = (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
        let scale = scales[e / 16];
        let (dl, ml) = (d * (scale & 0xf) as f32, dmin * (scale >> 4) as f32);
        dl * q as f32 - ml
    }));
}

/// `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16`. Sixteen groups of 16 with a
/// 6-bit signed scale each (low 4 bits in bytes 0..8, high 2 in bytes 8..12); element `e`
/// is its 2 bits (laid out as Q2_K's) minus 4 unless its `hmask` bit is set.
fn q3_k(block: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, packed) = (&block[..32], &block[32..96], &block[96..108]);
    let d = half_at(block, 108);
    let scale = |k: usize| {
        let low = (packed[k % 8] >> (4 * (k / 8))) & 0x0f;
        let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        ((low | high << 4) as i8 - 32) as f32
    };
    let dl: [f32; 16] = std::array::from_fn(|k| d * scale(k));
    out.extend((0..QK_K).map(|e| {
        let low = (qs[e / 128 * 32 + e % 32] >> (2 * (e % 128 / 32))) & 3;
        let high = ((hmask[e % 32] >> (e / 32)) & 1) ^ 1;
        dl[e / 16] * (low as i8 - (high << 2) as i8) as f32
    }));
}

/// `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`: Q4_K
/// (`kernels::quant`) with a fifth bit, bit `e / 32` of `qh[e % 32]`.
fn q5_k(block: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let (scales, mins) = scale_min_k4(&block[4..16]);
    let (qh, qs) = (&block[16..48], &block[48..]);
    out.extend((0..QK_K).map(|e| {
        let low = (qs[e / 64 * 32 + e % 32] >> (4 * (e % 64 / 32))) & 0x0f;
        let q = low | ((qh[e % 32] >> (e / 32)) & 1) << 4;
        let j = e / 32;
        (d * scales[j] as f32) * q as f32 - dmin * mins[j] as f32
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_block_matches_ggml_reference() {
        // d = 0.5, m = -1.0; byte k holds element k (low nibble) and k + 16 (high nibble).
        let mut block = Vec::new();
        block.extend(f16::from_f32(0.5).to_le_bytes());
        block.extend(f16::from_f32(-1.0).to_le_bytes());
        block.extend((0..16u8).map(|k| (15 - k) << 4 | k));
        let out = dequantize(GgmlType::Q4_1, &block, 32).unwrap();
        for k in 0..16 {
            assert_eq!(out[k], 0.5 * k as f32 - 1.0);
            assert_eq!(out[k + 16], 0.5 * (15 - k) as f32 - 1.0);
        }
    }

    #[test]
    fn q4_0_and_q8_0_blocks() {
        let mut q4 = f16::from_f32(2.0).to_le_bytes().to_vec();
        q4.extend([0x80u8; 16]); // low nibble 0 → -8, high nibble 8 → 0
        let out = dequantize(GgmlType::Q4_0, &q4, 32).unwrap();
        assert!(out[..16].iter().all(|&v| v == -16.0) && out[16..].iter().all(|&v| v == 0.0));

        let mut q8 = f16::from_f32(0.25).to_le_bytes().to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequantize(GgmlType::Q8_0, &q8, 32).unwrap();
        assert_eq!(out[0], -4.0);
        assert_eq!(out[31], 3.75);
    }

    #[test]
    fn unsupported_type_is_named() {
        let err = dequantize(GgmlType::from_id(16).unwrap(), &[], 256).unwrap_err();
        assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    }
}
