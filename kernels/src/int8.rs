//! Products over quantized rows that round each input vector to 8-bit integers first, as
//! llama.cpp's quantized paths do, and multiply bytes by bytes (`vpdpbusd`, `vpmaddubsw` +
//! `vpdpwssd` with VNNI; `vpmaddubsw` + `vpmaddwd` on AVX2): several times fewer
//! instructions per weight than widening every value to f32, which is what 4-bit weights
//! need to stream at memory speed.
//!
//! Not exact: the inputs are rounded (each block of 32 values, or of 256 for the K-quants,
//! to `round(x / d)` with `d = max |x| / 127`, as ggml's `quantize_row_q8_0` and
//! `quantize_row_q8_K` do) and the integer sums are scaled in another order. It is the
//! default for weights kept as blocks ([`Matmul::Auto`]; `--matmul exact` turns it off);
//! docs/BENCHMARKS.md has its perplexity and KL divergence against the exact path and
//! llama.cpp. The two builds of the kernels (VNNI, AVX2) sum the same integers and scale
//! them in a different order, so their results differ in the last bits. What stays exact is
//! the batch: a vector's products are computed by the same instructions in the same order
//! whatever else is in the batch, so a sequence decodes alike alone and among others.
//!
//! For each block type the weight's codes are read as unsigned bytes, and the offsets that
//! make them signed are taken out with sums of the inputs computed once per vector:
//! Q6_K's `q - 32` with `32 * scale * sum(x)` per group of 16, Q4_K's minimum with its sum
//! per group of 32, and with VNNI Q8_0's `q` as `q + 128` minus `128 * sum(x)` and Q4_0's
//! `q - 8` as `q` minus `8 * sum(x)` (both added as the starting value of the dot product,
//! so they cost nothing per row). `vpmaddubsw` saturates its pairs' sums at 2^15, which
//! `255 * 127 * 2` passes: on AVX2, Q8_0 and Q4_0 take llama.cpp's way, the weight's
//! magnitude times the input with the weight's sign.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cpu::{self, Tier};
use crate::quant::BlockType;

pub mod rows;

/// How products over quantized weights take their inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Matmul {
    /// The inputs rounded to 8-bit integers per block where this CPU has the kernels for
    /// the weight's type (see [`runs`]: any x86-64 with AVX2), as llama.cpp multiplies
    /// them; every other product exact. What a quantized file is for: its weights are
    /// already an approximation, and this reads them at memory speed.
    #[default]
    Auto,
    /// The inputs as they are (f32): the products of the decoded weight values, to the bit.
    Exact,
    /// As [`Matmul::Auto`]; a program that is asked for it by name says when it changes
    /// nothing (no kernel on this CPU, no weight kept as blocks).
    Int8,
    /// As [`Matmul::Auto`], and products over bf16 weights take the inputs rounded to bf16,
    /// two products a lane per `vdpbf16ps`, as llama.cpp's BF16 path (see
    /// [`crate::dpbf16`]), where the CPU has AVX512_BF16.
    Bf16,
}

impl Matmul {
    /// Whether products over blocks take the inputs rounded to integers (where [`runs`]).
    pub fn rounds_inputs(self) -> bool {
        matches!(self, Matmul::Auto | Matmul::Int8 | Matmul::Bf16)
    }

    /// Whether products over bf16 weights take the inputs rounded to bf16 (where
    /// [`crate::dpbf16::runs`]).
    pub fn rounds_to_bf16(self) -> bool {
        self == Matmul::Bf16
    }
}

impl std::fmt::Display for Matmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Matmul::Auto => "auto",
            Matmul::Exact => "exact",
            Matmul::Int8 => "int8",
            Matmul::Bf16 => "bf16",
        })
    }
}

impl std::str::FromStr for Matmul {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Matmul::Auto),
            "exact" => Ok(Matmul::Exact),
            "int8" => Ok(Matmul::Int8),
            "bf16" => Ok(Matmul::Bf16),
            other => Err(format!(
                "unknown matmul `{other}` (expected auto, exact, int8 or bf16)"
            )),
        }
    }
}

/// Whether this CPU runs `ty`'s int8 kernel for rows of `d_in`.
pub fn runs(ty: BlockType, d_in: usize) -> bool {
    let shape = match Format::of(ty) {
        Some(Format::Blocks32) => d_in.is_multiple_of(64),
        Some(Format::Blocks256) => d_in.is_multiple_of(256),
        None => false,
    };
    shape && available()
}

/// Whether this CPU has the int8 kernels for decoding: the AVX2 tier or above (see
/// [`crate::cpu::Tier`]). The products of many rows (a prompt, [`rows`]) need VNNI
/// for Q8_0.
pub fn available() -> bool {
    cpu::tier() >= Tier::Avx2
}

/// Which build of the decoding kernels runs, and so how [`Inputs`] are laid out; a CPU
/// that runs one runs those before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
enum Kernels {
    /// `avx2.rs`: 256-bit registers, `vpmaddubsw` + `vpmaddwd`, on the AVX2 and AVX-512
    /// tiers.
    #[default]
    Avx2,
    /// `avx512.rs`: 512-bit registers and `vpdpbusd`, on the AVX-512 VNNI tier.
    Vnni,
}

impl Kernels {
    /// The fastest this CPU runs (at its tier).
    fn here() -> Kernels {
        if cpu::tier() >= Tier::Avx512Vnni {
            Kernels::Vnni
        } else {
            Kernels::Avx2
        }
    }

    /// Every build this CPU runs, for tests.
    #[cfg(test)]
    fn runnable() -> Vec<Kernels> {
        [Kernels::Avx2, Kernels::Vnni]
            .into_iter()
            .filter(|&kernels| available() && kernels <= Kernels::here())
            .collect()
    }
}

/// How a weight type wants its inputs rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// Blocks of 32 (ggml's Q8_0), for Q8_0 and Q4_0 weights.
    Blocks32,
    /// Blocks of 256 (ggml's Q8_K), for the K-quants.
    Blocks256,
}

impl Format {
    fn of(ty: BlockType) -> Option<Format> {
        match ty {
            BlockType::Q8_0 | BlockType::Q4_0 => Some(Format::Blocks32),
            BlockType::Q4K | BlockType::Q6K => Some(Format::Blocks256),
            _ => None,
        }
    }
}

/// `n` input vectors of `d_in`, rounded to 8-bit integers as the weights of a product need
/// them, laid out for each type's kernel with the per-block numbers it takes.
#[derive(Debug, Default)]
pub struct Inputs {
    d_in: usize,
    n: usize,
    /// The kernels these are laid out for.
    kernels: Kernels,
    /// Blocks of 32 (ggml's Q8_0 rounding): the integers, vector after vector.
    q32: Vec<i8>,
    /// Blocks of 32: each block's scale.
    d32: Vec<f32>,
    /// For Q8_0 rows, 64 values a step: the two blocks' scales as sixteen lanes, `[d0; 8]`
    /// then `[d1; 8]` (the lanes of a `vpdpbusd` over those 64 bytes).
    pair_scales: Vec<f32>,
    /// For Q8_0 rows: minus the sum of each four consecutive integers (a `vpdpbusd` lane's).
    pair_sums: Vec<i32>,
    /// For Q4_0 rows, 128 values (four blocks) a step, each vector padded to a whole number
    /// of steps with zeros: the blocks' first sixteen integers, then their last sixteen (the
    /// order of the rows' low and high nibbles).
    quads: Vec<i8>,
    /// For Q4_0 rows: each step's four scales as sixteen lanes, `[d0; 4]`, ..., `[d3; 4]`.
    quad_scales: Vec<f32>,
    /// For Q4_0 rows: minus the sum of the eight integers each lane multiplies.
    quad_sums: Vec<i32>,
    /// Blocks of 256 (ggml's Q8_K rounding): the integers.
    q256: Vec<i8>,
    /// Blocks of 256: the integers with each block's groups of 32 in Q4_K's order
    /// (0, 2, 1, 3, 4, 6, 5, 7), the order its nibbles come in.
    paired: Vec<i8>,
    /// Blocks of 256: a scale per block.
    scales256: Vec<f32>,
    /// Blocks of 256: the sum of each sixteen integers.
    sums16: Vec<i16>,
}

impl Inputs {
    /// `xs` (vectors of `d_in`, one after another) rounded for the weight types `types`.
    pub fn new(xs: &[f32], d_in: usize, types: impl IntoIterator<Item = BlockType>) -> Self {
        Inputs::for_kernels(xs, d_in, types, Kernels::here())
    }

    fn for_kernels(
        xs: &[f32],
        d_in: usize,
        types: impl IntoIterator<Item = BlockType>,
        kernels: Kernels,
    ) -> Self {
        let mut inputs = Inputs {
            d_in,
            n: xs.len() / d_in,
            kernels,
            ..Inputs::default()
        };
        // The AVX2 kernels read the rounded blocks as they are; the VNNI ones as below.
        let vnni = inputs.kernels == Kernels::Vnni;
        let types: Vec<BlockType> = types.into_iter().collect();
        if types
            .iter()
            .any(|&ty| Format::of(ty) == Some(Format::Blocks32))
        {
            inputs.round32(xs);
        }
        if vnni && types.contains(&BlockType::Q8_0) {
            inputs.lay_out_pairs();
        }
        if vnni && types.contains(&BlockType::Q4_0) {
            inputs.lay_out_quads();
        }
        if types
            .iter()
            .any(|&ty| Format::of(ty) == Some(Format::Blocks256))
        {
            inputs.round256(xs, vnni);
        }
        inputs
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn round32(&mut self, xs: &[f32]) {
        assert!(self.d_in.is_multiple_of(64));
        self.q32 = vec![0; xs.len()];
        self.d32 = (xs.chunks_exact(32).zip(self.q32.chunks_exact_mut(32)))
            .map(|(x, q)| round_block(x, q))
            .collect();
    }

    fn lay_out_pairs(&mut self) {
        self.pair_scales = vec![0.0; self.q32.len() / 4];
        self.pair_sums = vec![0; self.q32.len() / 4];
        for (b, q) in self.q32.chunks_exact(32).enumerate() {
            // Block b's lanes: the first or the second eight of its pair's sixteen.
            let lanes = b / 2 * 16 + b % 2 * 8;
            self.pair_scales[lanes..lanes + 8].fill(self.d32[b]);
            for (k, q) in q.chunks_exact(4).enumerate() {
                self.pair_sums[b * 8 + k] = -q.iter().map(|&q| i32::from(q)).sum::<i32>();
            }
        }
    }

    fn lay_out_quads(&mut self) {
        let (d_in, stride) = (self.d_in, quad_stride(self.d_in));
        self.quads = vec![0; self.n * stride];
        self.quad_scales = vec![0.0; self.n * stride / 8];
        self.quad_sums = vec![0; self.n * stride / 8];
        for v in 0..self.n {
            for block in 0..d_in / 32 {
                let q = &self.q32[v * d_in + block * 32..][..32];
                let (step, k) = (v * stride / 128 + block / 4, block % 4);
                let at = step * 128 + 16 * k;
                self.quads[at..at + 16].copy_from_slice(&q[..16]);
                self.quads[at + 64..at + 80].copy_from_slice(&q[16..]);
                for lane in 0..4 {
                    let (low, high) = (&q[4 * lane..][..4], &q[16 + 4 * lane..][..4]);
                    let sum: i32 = low.iter().chain(high).map(|&q| i32::from(q)).sum();
                    self.quad_sums[step * 16 + 4 * k + lane] = -sum;
                    self.quad_scales[step * 16 + 4 * k + lane] = self.d32[v * d_in / 32 + block];
                }
            }
        }
    }

    fn round256(&mut self, xs: &[f32], paired: bool) {
        assert!(self.d_in.is_multiple_of(256));
        self.q256 = vec![0; xs.len()];
        if paired {
            self.paired = vec![0; xs.len()];
        }
        self.scales256 = vec![0.0; xs.len() / 256];
        self.sums16 = vec![0; xs.len() / 16];
        let blocks = xs.chunks_exact(256).zip(self.q256.chunks_exact_mut(256));
        for (b, (x, q)) in blocks.enumerate() {
            self.scales256[b] = round_block(x, q);
            for (k, q) in q.chunks_exact(16).enumerate() {
                self.sums16[b * 16 + k] = q.iter().map(|&q| i16::from(q)).sum();
            }
            if paired {
                for (to, from) in [0, 2, 1, 3, 4, 6, 5, 7].into_iter().enumerate() {
                    self.paired[b * 256 + to * 32..][..32].copy_from_slice(&q[from * 32..][..32]);
                }
            }
        }
    }
}

/// A vector's length in [`Inputs::quads`]: whole steps of 128.
fn quad_stride(d_in: usize) -> usize {
    d_in.next_multiple_of(128)
}

/// `x` rounded into `q` as ggml rounds a block of inputs (`d = max |x| / 127`, `q =
/// round(x / d)`); returns `d`.
fn round_block(x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x.len().is_multiple_of(16) && q.len() == x.len() && cpu::tier() >= Tier::Avx512 {
        // SAFETY: the tier has AVX-512 F and BW; the lengths are the kernel's.
        return unsafe { avx512::round_block(x, q) };
    }
    round_scalar(x, q)
}

/// [`round_block`] one value at a time.
fn round_scalar(x: &[f32], q: &mut [i8]) -> f32 {
    let max = x.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let d = max / 127.0;
    let inverse = 1.0 / d;
    // Rounded to nearest, ties to even, by adding and taking away 1.5 * 2^23 (exact for
    // |v| < 2^22): `round_ties_even` is a call to libm's `rintf` per value on baseline x86-64.
    const ROUND: f32 = 12_582_912.0;
    for (q, x) in q.iter_mut().zip(x) {
        *q = ((x * inverse + ROUND) - ROUND) as i8;
    }
    d
}

/// The products of four rows of `ty` blocks (`rows`, each `d_in` values) with every vector
/// of `inputs`, handed to `store(vector, row, value)`.
///
/// # Panics
/// Unless [`runs`]`(ty, d_in)` and `inputs` were made for `ty` over vectors of `d_in`.
#[cfg(test)]
pub(super) fn four(
    ty: BlockType,
    rows: [&[u8]; 4],
    inputs: &Inputs,
    store: &mut impl FnMut(usize, usize, f32),
) {
    four_checked(Checked::new(ty, inputs), rows, store);
}

/// [`four`] with the inputs already checked for the rows' type: only the rows' lengths are
/// checked here, which costs nothing beside a tile of short rows (the inputs' checks,
/// divisions among them, showed in a small model's decode profile: docs/BENCHMARKS.md,
/// session 35).
#[inline]
fn four_checked(checked: Checked<'_>, rows: [&[u8]; 4], store: &mut impl FnMut(usize, usize, f32)) {
    let Checked {
        ty,
        inputs,
        row_bytes,
    } = checked;
    assert!(rows.iter().all(|row| row.len() >= row_bytes));
    let rows = [
        rows[0].as_ptr(),
        rows[1].as_ptr(),
        rows[2].as_ptr(),
        rows[3].as_ptr(),
    ];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `Checked::new` made sure of the features and of every vector's length, the
    // assert above of every row's.
    unsafe {
        match inputs.kernels {
            Kernels::Vnni => avx512::four(ty, rows, inputs, store),
            Kernels::Avx2 => avx2::four(ty, rows, inputs, store),
        }
    }
}

/// The products of one row of `ty` blocks with every vector of `inputs`, as [`four`].
pub(super) fn one(ty: BlockType, row: &[u8], inputs: &Inputs, store: &mut impl FnMut(usize, f32)) {
    let Checked {
        inputs, row_bytes, ..
    } = Checked::new(ty, inputs);
    assert!(row.len() >= row_bytes);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `four_checked`.
    unsafe {
        match inputs.kernels {
            Kernels::Vnni => avx512::one(ty, row.as_ptr(), inputs, store),
            Kernels::Avx2 => avx2::one(ty, row.as_ptr(), inputs, store),
        }
    }
}

/// `bundles` of the rows of `weight` (`ty` blocks, each `inputs.d_in` values) times every
/// vector of `inputs`, as `bundles::matvec_bundles` counts bundles (bundle `s` the rows `s`,
/// `q + s`, `2q + s`, `3q + s` of `q` quarters, then the rows past them one each); the
/// product of vector `b` and row `j` stored at `out[b * stride + j]`.
pub(super) fn bundles(
    ty: BlockType,
    weight: &[u8],
    inputs: &Inputs,
    out: &[AtomicU32],
    stride: usize,
    bundles: Range<usize>,
) {
    let checked = Checked::new(ty, inputs);
    let row_bytes = checked.row_bytes;
    let quarter = weight.len() / row_bytes / 4;
    let row = |j: usize| &weight[j * row_bytes..][..row_bytes];
    let put = |b: usize, j: usize, value: f32| {
        out[b * stride + j].store(value.to_bits(), Ordering::Relaxed)
    };
    for s in bundles.start.min(quarter)..bundles.end.min(quarter) {
        // Spelled out: `array::map` here was not inlined, a call per tile in a small
        // model's decode profile.
        let rows = [s, quarter + s, 2 * quarter + s, 3 * quarter + s];
        let tile = [row(rows[0]), row(rows[1]), row(rows[2]), row(rows[3])];
        four_checked(checked, tile, &mut |b, k, value| put(b, rows[k], value));
    }
    for s in bundles.start.max(quarter)..bundles.end {
        let j = 3 * quarter + s;
        one(ty, row(j), inputs, &mut |b, value| put(b, j, value));
    }
}

/// Hints into L1 the cache lines of `bytes` bytes at `at` a row further on: the same
/// place in the next bundle's row (a share's rows are one after another). Without it,
/// Q4_K_M decoding ran 25% slower; two or four rows ahead, no faster than one.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn fetch(at: *const u8, row_bytes: usize, bytes: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let mut line = 0;
    while line < bytes {
        // SAFETY: a prefetch is a hint; it reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(row_bytes + line).cast()) };
        line += 64;
    }
}

/// Q4_K's packed scales and mins (`quant::scale_min_k4`), eight bytes each, as
/// llama.cpp unpacks them: in 32-bit words.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scales_mins(p: *const u8) -> (i64, i64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| unsafe { p.add(4 * i).cast::<u32>().read_unaligned() };
    let (a, b, c) = (word(0), word(1), word(2));
    let scales = (a & LOW6) as u64 | ((((c & LOW4) | (((a >> 6) & LOW2) << 4)) as u64) << 32);
    let mins = (b & LOW6) as u64 | (((((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4)) as u64) << 32);
    (scales as i64, mins as i64)
}

/// Inputs checked for a block type's kernel on this CPU, with the length of that type's
/// rows: what the kernels need of the inputs, so that a row's length is all a call over
/// rows must still check.
#[derive(Clone, Copy)]
struct Checked<'a> {
    ty: BlockType,
    inputs: &'a Inputs,
    row_bytes: usize,
}

impl<'a> Checked<'a> {
    fn new(ty: BlockType, inputs: &'a Inputs) -> Self {
        let d_in = inputs.d_in;
        assert!(
            runs(ty, d_in),
            "no int8 kernel for {ty} rows of {d_in} here"
        );
        assert!(
            inputs.kernels <= Kernels::here(),
            "inputs laid out for kernels this CPU does not run"
        );
        // What `Inputs::new` lays out for this type, in values.
        let made = match (ty, inputs.kernels) {
            (BlockType::Q8_0, Kernels::Vnni) => inputs.pair_sums.len() * 4,
            (BlockType::Q4_0, Kernels::Vnni) => inputs.quads.len() / quad_stride(d_in) * d_in,
            (BlockType::Q8_0 | BlockType::Q4_0, Kernels::Avx2) => inputs.q32.len(),
            _ => inputs.q256.len(),
        };
        assert_eq!(made, inputs.n * d_in, "inputs rounded for {ty}");
        let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
        Checked {
            ty,
            inputs,
            row_bytes,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests;
