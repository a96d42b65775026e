//! Quantized matrices as ggml stores them: each row of a weight (one output's inputs, as the
//! matrix-vector kernels read it) a run of blocks, each block a few scales and small
//! integers for 32 or 256 consecutive inputs. ggml's block types ([`BlockType`]), their
//! decoding to f32, which of them the kernels keep, and quantizing f32 rows into those with
//! ggml's reference algorithm.
//!
//! Decoding gives exactly the f32 values gguf-py's `gguf.quants.dequantize` gives (the same
//! f32 operations in the same order: a scale times an integer, then minus a minimum), which
//! is what the converter writes to the record for a quantized GGUF. So a product over the
//! blocks that widens them in registers and sums as over f32 weights equals, bit for bit,
//! the product over the record's values (the argument that makes bf16 weights exact).

use half::f16;

mod imported;
mod k;

/// ggml's block types: every one a GGUF we import may hold, decoded to f32 exactly as gguf-py
/// decodes it. The kernels compute on the [`KEPT`](BlockType::KEPT) ones; the others are
/// decoded once, at import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockType {
    /// 32 values: `d: f16, qs: [u8; 16]`, value `(q - 8) * d`; byte `j` holds values `j`
    /// (low nibble) and `j + 16` (high).
    Q4_0,
    /// 32 values: `d, m: f16, qs: [u8; 16]`, value `d * q + m`, Q4_0's nibbles.
    Q4_1,
    /// 32 values: `d: f16, qh: u32, qs: [u8; 16]`, value `(q - 16) * d` with Q4_0's nibbles
    /// and bit `i` of `qh` as value `i`'s fifth bit.
    Q5_0,
    /// 32 values: `d, m: f16, qh: u32, qs: [u8; 16]`, value `d * q + m`, Q5_0's bits.
    Q5_1,
    /// 32 values: `d: f16, qs: [i8; 32]`, value `q * d`.
    Q8_0,
    /// 256 values in sixteen groups of 16: `scales: [u8; 16], qs: [u8; 64], d, dmin: f16`.
    Q2K,
    /// 256 values in sixteen groups of 16: `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12],
    /// d: f16`.
    Q3K,
    /// 256 values in eight groups of 32: `d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`,
    /// value `(d * scale) * q - dmin * min`; six-bit scales and mins.
    Q4K,
    /// Q4_K with a fifth bit per value: `d, dmin: f16, scales: [u8; 12], qh: [u8; 32],
    /// qs: [u8; 128]`.
    Q5K,
    /// 256 values in sixteen groups of 16: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16],
    /// d: f16`, value `(d * scale) * (q - 32)`, six-bit q.
    Q6K,
}

/// What ggml's type traits say of a block type: one row per type in [`BlockType::traits`].
struct Traits {
    /// ggml's name (`Q4_K`), as GGUF tools print it.
    name: &'static str,
    /// The name in lower case (`q4_k`), as the weights file and `--weights` write it.
    lower: &'static str,
    /// ggml.h's `enum ggml_type` id.
    ggml_id: u32,
    /// Values per block.
    values: usize,
    /// Bytes per block.
    bytes: usize,
    /// Byte offsets of the block's f16 scales (and minimums), which must be finite for its
    /// values to be.
    scales: &'static [usize],
}

impl BlockType {
    /// Every type, in ggml's id order.
    pub const ALL: [BlockType; 10] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];

    /// The types the kernels compute on as blocks (`block_products`, `int8`), in ggml's id
    /// order: a model keeps a projection of one of these as the GGUF's own blocks.
    pub const KEPT: [BlockType; 5] = [Self::Q4_0, Self::Q5_0, Self::Q8_0, Self::Q4K, Self::Q6K];

    // Inlined, so that `ty.bytes()` in a kernel's loop is a table read, or a constant.
    #[rustfmt::skip]
    #[inline(always)]
    const fn traits(self) -> Traits {
        const fn t(name: &'static str, lower: &'static str, ggml_id: u32, values: usize, bytes: usize, scales: &'static [usize]) -> Traits {
            Traits { name, lower, ggml_id, values, bytes, scales }
        }
        match self {
            Self::Q4_0 => t("Q4_0", "q4_0", 2, 32, 18, &[0]),
            Self::Q4_1 => t("Q4_1", "q4_1", 3, 32, 20, &[0, 2]),
            Self::Q5_0 => t("Q5_0", "q5_0", 6, 32, 22, &[0]),
            Self::Q5_1 => t("Q5_1", "q5_1", 7, 32, 24, &[0, 2]),
            Self::Q8_0 => t("Q8_0", "q8_0", 8, 32, 34, &[0]),
            Self::Q2K => t("Q2_K", "q2_k", 10, 256, 84, &[80, 82]),
            Self::Q3K => t("Q3_K", "q3_k", 11, 256, 110, &[108]),
            Self::Q4K => t("Q4_K", "q4_k", 12, 256, 144, &[0, 2]),
            Self::Q5K => t("Q5_K", "q5_k", 13, 256, 176, &[0, 2]),
            Self::Q6K => t("Q6_K", "q6_k", 14, 256, 210, &[208]),
        }
    }

    /// ggml's name for it (`Q4_K`), as GGUF tools print it.
    #[inline]
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// Its name in lower case (`q4_k`), as the weights file's index and `--weights` write it.
    #[inline]
    pub fn lower_name(self) -> &'static str {
        self.traits().lower
    }

    /// ggml.h's `enum ggml_type` id.
    #[inline]
    pub fn ggml_id(self) -> u32 {
        self.traits().ggml_id
    }

    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Whether the kernels compute on it as blocks ([`Self::KEPT`]).
    #[inline]
    pub fn kept(self) -> bool {
        Self::KEPT.contains(&self)
    }

    /// Values per block.
    #[inline]
    pub const fn values(self) -> usize {
        self.traits().values
    }

    /// Bytes per block.
    #[inline]
    pub const fn bytes(self) -> usize {
        self.traits().bytes
    }

    /// Bytes of a row of `d_in` values, or `None` unless `d_in` is a whole number of blocks.
    #[inline]
    pub fn row_bytes(self, d_in: usize) -> Option<usize> {
        d_in.is_multiple_of(self.values())
            .then(|| d_in / self.values() * self.bytes())
    }

    /// Whether it can quantize f32 values at load (`quantize`).
    pub fn quantizes(self) -> bool {
        matches!(self, Self::Q8_0 | Self::Q4_0 | Self::Q4K | Self::Q6K)
    }

    /// The index of the first block (of the whole blocks in `blocks`) with a scale that is
    /// infinite or NaN: blocks a loader must refuse, since every value of the block would
    /// be one too.
    pub fn first_bad_scale(self, blocks: &[u8]) -> Option<usize> {
        blocks.chunks_exact(self.bytes()).position(|block| {
            (self.traits().scales.iter()).any(|&at| !half_at(block, at).is_finite())
        })
    }

    /// Decodes the whole blocks of `blocks` into `out`, `values()` per block.
    ///
    /// # Panics
    /// If `out` does not hold exactly as many values as `blocks` has whole blocks.
    #[inline(always)]
    pub fn decode(self, blocks: &[u8], out: &mut [f32]) {
        let (values, bytes) = (self.values(), self.bytes());
        let n = blocks.len() / bytes;
        assert_eq!(n * values, out.len());
        // Plain loops, every function inlined: a kernel compiled for AVX-512 calls this, and
        // an iterator's `fold` would be a function of its own, compiled without it.
        for i in 0..n {
            let (block, out) = (
                &blocks[i * bytes..][..bytes],
                &mut out[i * values..][..values],
            );
            match self {
                Self::Q8_0 => q8_0(block, out),
                Self::Q4_0 => q4_0(block, out),
                Self::Q5_0 => q5_0(block, out),
                Self::Q4K => q4_k(block, out),
                Self::Q6K => q6_k(block, out),
                Self::Q4_1 => imported::q4_1(block, out),
                Self::Q5_1 => imported::q5_1(block, out),
                Self::Q2K => imported::q2_k(block, out),
                Self::Q3K => imported::q3_k(block, out),
                Self::Q5K => imported::q5_k(block, out),
            }
        }
    }

    /// `values` (whole blocks of them) as blocks of this type, appended to `out`, as ggml's
    /// reference quantizer (`quantize_row_*_ref`, what llama-quantize runs without an importance
    /// matrix) makes them, and gguf-py's `quantize` for the types it has (Q8_0, Q4_0).
    ///
    /// # Panics
    /// If this type does not [`quantize`](Self::quantizes), or `values` is not whole blocks.
    pub fn quantize(self, values: &[f32], out: &mut Vec<u8>) {
        assert!(values.len().is_multiple_of(self.values()));
        let blocks = values.chunks_exact(self.values());
        match self {
            Self::Q8_0 => blocks.for_each(|v| quantize_q8_0(v, out)),
            Self::Q4_0 => blocks.for_each(|v| quantize_q4_0(v, out)),
            Self::Q4K => blocks.for_each(|v| k::quantize_q4_k(v, out)),
            Self::Q6K => blocks.for_each(|v| k::quantize_q6_k(v, out)),
            other => panic!("{} is not quantized at load", other.name()),
        }
    }
}

impl std::fmt::Display for BlockType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The f16 at byte `i` of `b`, as f32.
#[inline(always)]
pub(crate) fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline(always)]
fn q8_0(block: &[u8], out: &mut [f32]) {
    let d = half_at(block, 0);
    let (qs, out) = (&block[2..34], &mut out[..32]);
    for i in 0..32 {
        out[i] = f32::from(qs[i] as i8) * d;
    }
}

#[inline(always)]
fn q4_0(block: &[u8], out: &mut [f32]) {
    let d = half_at(block, 0);
    let (qs, out) = (&block[2..18], &mut out[..32]);
    for j in 0..16 {
        out[j] = d * ((qs[j] & 0x0f) as i32 - 8) as f32;
        out[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

#[inline(always)]
fn q5_0(block: &[u8], out: &mut [f32]) {
    let d = half_at(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let (qs, out) = (&block[6..22], &mut out[..32]);
    for j in 0..16 {
        let (fifth, fifth_high) = (
            ((qh >> j) & 1) as i32 * 16,
            ((qh >> (j + 16)) & 1) as i32 * 16,
        );
        out[j] = d * (((qs[j] & 0x0f) as i32 | fifth) - 16) as f32;
        out[j + 16] = d * (((qs[j] >> 4) as i32 | fifth_high) - 16) as f32;
    }
}

/// Q4_K's (and Q5_K's) eight 6-bit scales and mins, packed in 12 bytes.
#[inline(always)]
pub fn scale_min_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (d, m, md) = (&packed[..4], &packed[4..8], &packed[8..12]);
    let scales = std::array::from_fn(|j| match j {
        0..4 => d[j] & 0x3f,
        _ => (md[j - 4] & 0x0f) | ((d[j - 4] >> 2) & 0x30),
    });
    let mins = std::array::from_fn(|j| match j {
        0..4 => m[j] & 0x3f,
        _ => (md[j - 4] >> 4) | ((m[j - 4] >> 2) & 0x30),
    });
    (scales, mins)
}

/// Group `g` (32 values) takes the low nibbles of bytes `g / 2 * 32..` when `g` is even, the
/// high nibbles when odd.
#[inline(always)]
fn q4_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let (scales, mins) = scale_min_k4(&block[4..16]);
    let qs = &block[16..144];
    for g in 0..8 {
        let (dl, ml) = (d * scales[g] as f32, dmin * mins[g] as f32);
        let (qs, out) = (&qs[g / 2 * 32..][..32], &mut out[g * 32..][..32]);
        let shift = 4 * (g % 2);
        for i in 0..32 {
            out[i] = dl * ((qs[i] >> shift) & 0x0f) as f32 - ml;
        }
    }
}

/// Value `e`'s low nibble is in byte `e / 128 * 64 + e % 64` (high nibble when
/// `e % 128 >= 64`), its top 2 bits in byte `e / 128 * 32 + e % 32` at shift
/// `2 * (e % 128 / 32)`; groups of 16 share a scale.
#[inline(always)]
fn q6_k(block: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&block[..128], &block[128..192], &block[192..208]);
    let d = half_at(block, 208);
    for c in 0..8 {
        // Values 32c..32c+32: within their half (128), quarter c % 4; two groups of 16.
        let (half, quarter) = (c / 4, c % 4);
        let low = &ql[half * 64 + (quarter % 2) * 32..][..32];
        let high = &qh[half * 32..][..32];
        let (low_shift, high_shift) = (4 * (quarter / 2), 2 * quarter);
        let out = &mut out[c * 32..][..32];
        for g in 0..2 {
            let dl = d * f32::from(scales[2 * c + g] as i8);
            for i in 16 * g..16 * g + 16 {
                let q = ((low[i] >> low_shift) & 0x0f) | ((high[i] >> high_shift) & 3) << 4;
                out[i] = dl * (q as i8 - 32) as f32;
            }
        }
    }
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, codes `round(x / d)` (half away
/// from zero) computed as `x * (1 / d)`, `d` stored rounded to f16.
fn quantize_q8_0(values: &[f32], out: &mut Vec<u8>) {
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16::from_f32(d).to_le_bytes());
    // A block of values so small that 1/d overflows gets code 0, as in ggml and gguf-py.
    let code = |x: f32| {
        let x = x * id;
        if x.is_finite() {
            round_half_away(x) as i8 as u8
        } else {
            0
        }
    };
    out.extend(values.iter().map(|&x| code(x)));
}

/// `x.round()` (to nearest, ties away from zero, as C's `roundf`) for `|x| < 2^31`, without
/// the call to libm's `roundf` that `f32::round` is on CPUs without SSE4.1 at build time:
/// the integer part, plus one if the part after it (exact in f32) is at least a half.
#[inline(always)]
fn round_half_away(x: f32) -> f32 {
    let a = x.abs();
    let whole = a as i32;
    let rounded = (whole + i32::from(a - whole as f32 >= 0.5)) as f32;
    rounded.copysign(x)
}

/// ggml's `quantize_row_q4_0_ref`: `d = max / -8` for the value of largest magnitude
/// (the first of equals), codes `min(15, trunc(x * (1 / d) + 8.5))` in f32, the product and
/// the sum each rounded (ggml's library is built without fusing them). As gguf-py, `max`
/// starts from the first value, so a block of -0.0 stores `d = +0.0` (ggml's loop starts
/// from +0.0 and stores -0.0: the one block where the two differ); a code that is not
/// finite (1/d overflowed) is 0.
fn quantize_q4_0(values: &[f32], out: &mut Vec<u8>) {
    let (mut amax, mut max) = (values[0].abs(), values[0]);
    for &v in &values[1..] {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16::from_f32(d).to_le_bytes());
    let code = |x: f32| {
        let c = (x * id + 8.5).trunc();
        if c.is_finite() { (c as u8).min(15) } else { 0 }
    };
    out.extend((0..16).map(|j| code(values[j]) | code(values[j + 16]) << 4));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_values(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((state >> 8) as f32 / (1 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    /// Quantizing then decoding lands each value on the nearest code: within half a step,
    /// plus the code times the error of storing d as f16 (codes are made with d unrounded),
    /// at most 127 * 2^-11 d for Q8_0. Q4_0's codes run from -8 d to 7 d with -8 d the
    /// block's extreme value, so the other extreme, clipped to 7, may be a whole step off.
    #[test]
    fn quantized_values_are_within_half_a_step() {
        let values = random_values(32 * 64, 3);
        for (ty, steps) in [(BlockType::Q8_0, 0.57), (BlockType::Q4_0, 1.01)] {
            let mut blocks = Vec::new();
            ty.quantize(&values, &mut blocks);
            assert_eq!(blocks.len(), values.len() / 32 * ty.bytes());
            let mut decoded = vec![0.0; values.len()];
            ty.decode(&blocks, &mut decoded);
            for (b, (v, x)) in values.chunks(32).zip(decoded.chunks(32)).enumerate() {
                let d = half_at(&blocks[b * ty.bytes()..], 0).abs();
                for (v, x) in v.iter().zip(x) {
                    assert!((v - x).abs() <= d * steps + 1e-7, "{ty} {v} {x} {d}");
                }
            }
        }
    }

    #[test]
    fn rounding_is_c_roundf() {
        let cases = [
            0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, 126.5, -127.0, 0.0, -0.0, 3.7, -3.2,
        ];
        for x in cases {
            assert_eq!(round_half_away(x).to_bits(), x.round().to_bits(), "{x}");
        }
    }

    #[test]
    fn zero_blocks_quantize_to_zero() {
        for ty in [BlockType::Q8_0, BlockType::Q4_0] {
            let mut blocks = Vec::new();
            ty.quantize(&[0.0; 32], &mut blocks);
            let mut decoded = [1.0; 32];
            ty.decode(&blocks, &mut decoded);
            assert_eq!(decoded, [0.0; 32]);
        }
    }

    #[test]
    fn bad_scales_are_found() {
        let mut blocks = Vec::new();
        BlockType::Q8_0.quantize(&random_values(96, 1), &mut blocks);
        assert_eq!(BlockType::Q8_0.first_bad_scale(&blocks), None);
        blocks[34..36].copy_from_slice(&f16::NAN.to_le_bytes());
        assert_eq!(BlockType::Q8_0.first_bad_scale(&blocks), Some(1));
    }
}
