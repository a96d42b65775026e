//! How an f32 value is stored in memory (`f32`, `bf16`, `f16`) and widened exactly where a
//! kernel reads it.

/// How an f32 value is stored: as f32, or as a 16-bit float (a bf16 weight, an f16 or bf16
/// KV cache entry), widened exactly to f32 where it is read (every bf16 and f16 value is an
/// f32 value). A product over bf16 weights is bit-identical to one over the f32 values they
/// stand for: the same multiplies and adds in the same order, only half the bytes read.
pub trait Stored: Copy + Send + Sync + 'static {
    /// Whether this is bf16 (the high half of an f32), which the intrinsics widen by a shift.
    const BF16: bool = false;

    fn widen(self) -> f32;
    /// The nearest stored value to `x` (ties to even), as PyTorch's and llama.cpp's
    /// conversions round.
    fn narrow(x: f32) -> Self;
}

impl Stored for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        x
    }
}

impl Stored for half::bf16 {
    const BF16: bool = true;

    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

impl Stored for half::f16 {
    /// Branch-free, so that it vectorizes (`half`'s own conversion is a call per value
    /// without F16C at build time); Marat Dukhan's FP16 library's conversion. A normal value
    /// (or infinity, NaN) is its bits shifted into an f32's, with the exponent rebiased by
    /// a multiply by 2^-112 (exact); a subnormal one is rebuilt as 0.5 + m * 2^-24 minus 0.5,
    /// exactly; the sign is put back last.
    #[inline(always)]
    fn widen(self) -> f32 {
        let w = u32::from(self.to_bits()) << 16;
        let sign = w & 0x8000_0000;
        let two_w = w.wrapping_add(w);
        let normalized = f32::from_bits((two_w >> 4) + (0xe0 << 23)) * f32::from_bits(0x0780_0000);
        let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
        let magnitude = if two_w < 1 << 27 {
            denormalized
        } else {
            normalized
        };
        f32::from_bits(sign | magnitude.to_bits())
    }

    #[inline(always)]
    fn narrow(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of the 65536 f16 values widens to `half`'s conversion of it (NaNs to NaNs),
    /// and back to itself.
    #[test]
    fn f16_widens_exactly() {
        for bits in 0..=u16::MAX {
            let value = half::f16::from_bits(bits);
            let (ours, theirs) = (value.widen(), value.to_f32());
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#06x}");
                assert_eq!(half::f16::narrow(ours).to_bits(), bits);
            }
        }
    }
}
