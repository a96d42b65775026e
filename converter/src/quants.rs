//! ggml's tensor types, and a GGUF tensor decoded to f32: plain floats widened, ggml's blocks
//! decoded by `kernels::quant` exactly as gguf-py's `gguf.quants.dequantize` decodes them
//! (tests/quants.rs compares every type with gguf-py on random blocks).

use anyhow::{Result, bail, ensure};
use half::f16;
use kernels::quant::BlockType;
use rayon::prelude::*;

/// ggml tensor types: plain floats, ggml's blocks, or a type we do not read (named for
/// errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Blocks(BlockType),
    /// Known to ggml, not supported here: the id and its ggml name.
    Unsupported(u32, &'static str),
}

impl GgmlType {
    /// The type of ggml type id `id` (ggml.h's `enum ggml_type`).
    pub fn from_id(id: u32) -> Result<Self> {
        if let Some(ty) = BlockType::from_ggml_id(id) {
            return Ok(Self::Blocks(ty));
        }
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
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
            Self::Blocks(ty) => ty.name(),
            Self::Unsupported(_, name) => name,
        }
    }

    /// (elements per block, bytes per block), as ggml's type traits give them.
    pub fn block(self) -> Option<(u64, u64)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Blocks(ty) => (ty.values() as u64, ty.bytes() as u64),
            Self::Unsupported(..) => return None,
        })
    }
}

/// Decodes `numel` values of type `ty` from `bytes` (whose length was checked at open).
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>> {
    let Some((block_values, block_bytes)) = ty.block() else {
        let supported: Vec<&str> = ["F32", "F16", "BF16"]
            .into_iter()
            .chain(BlockType::ALL.iter().map(|ty| ty.name()))
            .collect();
        bail!(
            "unsupported GGUF tensor type {} (ggml type {}); supported: {}",
            ty.name(),
            match ty {
                GgmlType::Unsupported(id, _) => id,
                _ => unreachable!("every other type has a block"),
            },
            supported.join(", ")
        )
    };
    // Capacity bounded by the bytes present, whatever `numel` claims.
    let blocks = bytes.len() / block_bytes as usize;
    let chunks = bytes.chunks_exact(block_bytes as usize);
    let out: Vec<f32> = match ty {
        GgmlType::F32 => chunks
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        GgmlType::F16 => chunks
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        GgmlType::Bf16 => chunks
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        // One definition of every block type's values, the runtime's, for the record and
        // the kernels.
        GgmlType::Blocks(ty) => {
            let mut out = vec![0.0; blocks * block_values as usize];
            // Blocks decode independently: on every core, a few thousand at a time.
            let per_task = 4096;
            (out.par_chunks_mut(per_task * block_values as usize))
                .zip(
                    bytes[..blocks * block_bytes as usize]
                        .par_chunks(per_task * block_bytes as usize),
                )
                .for_each(|(out, bytes)| ty.decode(bytes, out));
            out
        }
        GgmlType::Unsupported(..) => unreachable!("refused above"),
    };
    ensure!(
        out.len() == numel,
        "decoded {} values, expected {numel}",
        out.len()
    );
    Ok(out)
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
        let out = dequantize(GgmlType::Blocks(BlockType::Q4_1), &block, 32).unwrap();
        for k in 0..16 {
            assert_eq!(out[k], 0.5 * k as f32 - 1.0);
            assert_eq!(out[k + 16], 0.5 * (15 - k) as f32 - 1.0);
        }
    }

    #[test]
    fn q4_0_and_q8_0_blocks() {
        let mut q4 = f16::from_f32(2.0).to_le_bytes().to_vec();
        q4.extend([0x80u8; 16]); // low nibble 0 → -8, high nibble 8 → 0
        let out = dequantize(GgmlType::Blocks(BlockType::Q4_0), &q4, 32).unwrap();
        assert!(out[..16].iter().all(|&v| v == -16.0) && out[16..].iter().all(|&v| v == 0.0));

        let mut q8 = f16::from_f32(0.25).to_le_bytes().to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequantize(GgmlType::Blocks(BlockType::Q8_0), &q8, 32).unwrap();
        assert_eq!(out[0], -4.0);
        assert_eq!(out[31], 3.75);
    }

    #[test]
    fn unsupported_type_is_named() {
        let err = dequantize(GgmlType::from_id(16).unwrap(), &[], 256).unwrap_err();
        assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    }
}
