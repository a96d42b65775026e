//! Products over quantized rows that round each input vector to 8-bit integers first, as
//! llama.cpp's quantized paths do, and multiply bytes by bytes (`vpdpbusd`, `vpmaddubsw` +
//! `vpdpwssd`): several times fewer instructions per weight than widening every value to
//! f32, which is what 4-bit weights need to stream at memory speed.
//!
//! Not exact: the inputs are rounded (each block of 32 values, or of 256 for the K-quants,
//! to `round(x / d)` with `d = max |x| / 127`, as ggml's `quantize_row_q8_0` and
//! `quantize_row_q8_K` do) and the integer sums are scaled in another order. So this runs
//! only when asked ([`Matmul::Int8`], `--matmul int8`); docs/BENCHMARKS.md has its
//! perplexity and KL divergence against the exact path and llama.cpp. What stays exact is
//! the batch: a vector's products are computed by the same instructions in the same order
//! whatever else is in the batch, so a sequence decodes alike alone and among others.
//!
//! For each block type the weight's codes are read as unsigned bytes, and the offsets that
//! make them signed are taken out with sums of the inputs computed once per vector:
//! Q8_0's `q` as `q + 128` minus `128 * sum(x)`, Q4_0's `q - 8` as `q` minus `8 * sum(x)`
//! (both added as the starting value of the dot product, so they cost nothing per row),
//! Q6_K's `q - 32` with `32 * scale * sum(x)` per group of 16, Q4_K's minimum with its sum
//! per group of 32.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::quant::BlockType;

pub mod rows;

/// How products over quantized weights take their inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Matmul {
    /// The inputs as they are (f32): the products of the decoded weight values, to the bit.
    #[default]
    Exact,
    /// The inputs rounded to 8-bit integers per block, where this CPU has the kernels for
    /// the weight's type (see [`runs`]); other weights take the exact path.
    Int8,
}

impl std::fmt::Display for Matmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Matmul::Exact => "exact",
            Matmul::Int8 => "int8",
        })
    }
}

impl std::str::FromStr for Matmul {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(Matmul::Exact),
            "int8" => Ok(Matmul::Int8),
            other => Err(format!("unknown matmul `{other}` (expected exact or int8)")),
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

/// Whether this CPU has the int8 kernels: AVX-512 with the byte and int8-dot-product
/// extensions (Ice Lake, Sapphire Rapids, Zen 4 and later).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("f16c")
            && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
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
        let mut inputs = Inputs {
            d_in,
            n: xs.len() / d_in,
            ..Inputs::default()
        };
        let types: Vec<BlockType> = types.into_iter().collect();
        if types
            .iter()
            .any(|&ty| Format::of(ty) == Some(Format::Blocks32))
        {
            inputs.round32(xs);
        }
        if types.contains(&BlockType::Q8_0) {
            inputs.lay_out_pairs();
        }
        if types.contains(&BlockType::Q4_0) {
            inputs.lay_out_quads();
        }
        if types
            .iter()
            .any(|&ty| Format::of(ty) == Some(Format::Blocks256))
        {
            inputs.round256(xs);
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

    fn round256(&mut self, xs: &[f32]) {
        assert!(self.d_in.is_multiple_of(256));
        self.q256 = vec![0; xs.len()];
        self.paired = vec![0; xs.len()];
        self.scales256 = vec![0.0; xs.len() / 256];
        self.sums16 = vec![0; xs.len() / 16];
        let blocks = xs.chunks_exact(256).zip(self.q256.chunks_exact_mut(256));
        for (b, (x, q)) in blocks.enumerate() {
            self.scales256[b] = round_block(x, q);
            for (k, q) in q.chunks_exact(16).enumerate() {
                self.sums16[b * 16 + k] = q.iter().map(|&q| i16::from(q)).sum();
            }
            for (to, from) in [0, 2, 1, 3, 4, 6, 5, 7].into_iter().enumerate() {
                self.paired[b * 256 + to * 32..][..32].copy_from_slice(&q[from * 32..][..32]);
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
    if x.len().is_multiple_of(16) && q.len() == x.len() && available() {
        // SAFETY: `available` checked the features; the lengths are the kernel's.
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
pub(super) fn four(
    ty: BlockType,
    rows: [&[u8]; 4],
    inputs: &Inputs,
    store: &mut impl FnMut(usize, usize, f32),
) {
    check(ty, &rows, inputs);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `check` made sure of the features and of every row's and vector's length.
    unsafe {
        avx512::four(ty, rows.map(<[u8]>::as_ptr), inputs, store)
    }
}

/// The products of one row of `ty` blocks with every vector of `inputs`, as [`four`].
pub(super) fn one(ty: BlockType, row: &[u8], inputs: &Inputs, store: &mut impl FnMut(usize, f32)) {
    check(ty, &[row], inputs);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `four`.
    unsafe {
        avx512::one(ty, row.as_ptr(), inputs, store)
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
    let row_bytes = ty.row_bytes(inputs.d_in).expect("rows of whole blocks");
    let quarter = weight.len() / row_bytes / 4;
    let row = |j: usize| &weight[j * row_bytes..][..row_bytes];
    let put = |b: usize, j: usize, value: f32| {
        out[b * stride + j].store(value.to_bits(), Ordering::Relaxed)
    };
    for s in bundles.start.min(quarter)..bundles.end.min(quarter) {
        let rows = [0, 1, 2, 3].map(|k| k * quarter + s);
        four(ty, rows.map(row), inputs, &mut |b, k, value| {
            put(b, rows[k], value)
        });
    }
    for s in bundles.start.max(quarter)..bundles.end {
        let j = 3 * quarter + s;
        one(ty, row(j), inputs, &mut |b, value| put(b, j, value));
    }
}

fn check(ty: BlockType, rows: &[&[u8]], inputs: &Inputs) {
    let d_in = inputs.d_in;
    assert!(
        runs(ty, d_in),
        "no int8 kernel for {ty} rows of {d_in} here"
    );
    let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
    assert!(rows.iter().all(|row| row.len() >= row_bytes));
    // What `Inputs::new` lays out for this type, in values.
    let made = match ty {
        BlockType::Q8_0 => inputs.pair_sums.len() * 4,
        BlockType::Q4_0 => inputs.quads.len() / quad_stride(d_in) * d_in,
        _ => inputs.q256.len(),
    };
    assert_eq!(made, inputs.n * d_in, "inputs rounded for {ty}");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Inputs;
    use crate::quant::BlockType;

    /// `super::round_block`, sixteen values at a time: the same maximum (which any order
    /// gives), the same products, the same rounding (to nearest, ties to even).
    ///
    /// # Safety
    /// AVX-512F and BW present; `x.len()` a multiple of 16 and `q` as long.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn round_block(x: &[f32], q: &mut [i8]) -> f32 {
        assert!(x.len().is_multiple_of(16) && q.len() == x.len());
        let mut max = _mm512_setzero_ps();
        for x in x.chunks_exact(16) {
            // SAFETY: 16 values read from a chunk of 16.
            let x = unsafe { _mm512_loadu_ps(x.as_ptr()) };
            // A NaN input is skipped, as `f32::max` skips it.
            max = _mm512_max_ps(_mm512_abs_ps(x), max);
        }
        let max = _mm512_reduce_max_ps(max);
        if max == 0.0 {
            q.fill(0);
            return 0.0;
        }
        let d = max / 127.0;
        let inverse = _mm512_set1_ps(1.0 / d);
        for (x, q) in x.chunks_exact(16).zip(q.chunks_exact_mut(16)) {
            // SAFETY: 16 values read from a chunk of 16, 16 bytes written to one of 16.
            unsafe {
                let v = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr()), inverse);
                // A NaN becomes 0, as `as i8` makes it.
                let v = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), v);
                _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(v));
            }
        }
        d
    }

    /// # Safety
    /// As `super::four` checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    pub(super) unsafe fn four(
        ty: BlockType,
        rows: [*const u8; 4],
        inputs: &Inputs,
        store: &mut impl FnMut(usize, usize, f32),
    ) {
        unsafe {
            match ty {
                BlockType::Q8_0 => four_of::<Q8_0>(rows, inputs, store),
                BlockType::Q4_0 => four_of::<Q4_0>(rows, inputs, store),
                BlockType::Q4K => four_of::<Q4K>(rows, inputs, store),
                BlockType::Q6K => four_of::<Q6K>(rows, inputs, store),
                other => unreachable!("no int8 kernel for {other}"),
            }
        }
    }

    /// # Safety
    /// As `super::one` checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    pub(super) unsafe fn one(
        ty: BlockType,
        row: *const u8,
        inputs: &Inputs,
        store: &mut impl FnMut(usize, f32),
    ) {
        unsafe {
            match ty {
                BlockType::Q8_0 => one_of::<Q8_0>(row, inputs, store),
                BlockType::Q4_0 => one_of::<Q4_0>(row, inputs, store),
                BlockType::Q4K => one_of::<Q4K>(row, inputs, store),
                BlockType::Q6K => one_of::<Q6K>(row, inputs, store),
                other => unreachable!("no int8 kernel for {other}"),
            }
        }
    }

    /// A block type's int8 kernel: the products of `R` rows with `V` vectors.
    trait Kernel {
        /// `sums[v][r]`: row `rows[r]` times vector `vectors[v]` of `inputs`.
        ///
        /// # Safety
        /// The features of `four`; each row holds `inputs.d_in` values of blocks.
        unsafe fn tile<const R: usize, const V: usize>(
            rows: [*const u8; R],
            inputs: &Inputs,
            vectors: [usize; V],
        ) -> [[f32; R]; V];
    }

    /// Four rows: each vector alone if there is one, else four vectors at a time with the
    /// rows in pairs (sixteen sums either way), any vectors left over alone. A vector's sums
    /// are made by the same instructions in either tile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    unsafe fn four_of<K: Kernel>(
        rows: [*const u8; 4],
        inputs: &Inputs,
        store: &mut impl FnMut(usize, usize, f32),
    ) {
        let n = inputs.n;
        let mut b = 0;
        unsafe {
            while n - b >= 4 {
                let vectors = [b, b + 1, b + 2, b + 3];
                for pair in [0, 2] {
                    let sums = K::tile([rows[pair], rows[pair + 1]], inputs, vectors);
                    for (v, sums) in sums.iter().enumerate() {
                        store(b + v, pair, sums[0]);
                        store(b + v, pair + 1, sums[1]);
                    }
                }
                b += 4;
            }
            while b < n {
                for (r, &sum) in K::tile(rows, inputs, [b])[0].iter().enumerate() {
                    store(b, r, sum);
                }
                b += 1;
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
    unsafe fn one_of<K: Kernel>(
        row: *const u8,
        inputs: &Inputs,
        store: &mut impl FnMut(usize, f32),
    ) {
        for b in 0..inputs.n {
            store(b, unsafe { K::tile([row], inputs, [b]) }[0][0]);
        }
    }

    /// Hints into L1 the cache lines of `bytes` bytes at `at` a row further on: the same
    /// place in the next bundle's row (a share's rows are one after another). Without it,
    /// Q4_K_M decoding ran 25% slower; two or four rows ahead, no faster than one.
    #[inline(always)]
    fn fetch(at: *const u8, row_bytes: usize, bytes: usize) {
        let mut line = 0;
        while line < bytes {
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(row_bytes + line).cast()) };
            line += 64;
        }
    }

    /// The f16 at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn half(p: *const u8) -> f32 {
        let bits = unsafe { p.cast::<u16>().read_unaligned() };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// Sixteen lanes, `[a; 8]` then `[b; 8]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn halves(a: f32, b: f32) -> __m512 {
        _mm512_insertf32x8::<1>(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b))
    }

    /// The 32 i16 lanes `[a; 16]` then `[b; 16]`: `vpermw` indices.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn index_halves(a: i16, b: i16) -> __m512i {
        _mm512_mask_blend_epi16(0xffff_0000, _mm512_set1_epi16(a), _mm512_set1_epi16(b))
    }

    /// Q8_0: two blocks (64 values) a step, codes `q` read as `q + 128`.
    struct Q8_0;

    impl Kernel for Q8_0 {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
        unsafe fn tile<const R: usize, const V: usize>(
            rows: [*const u8; R],
            inputs: &Inputs,
            vectors: [usize; V],
        ) -> [[f32; R]; V] {
            let d_in = inputs.d_in;
            let row_bytes = d_in / 32 * 34;
            let mut acc = [[_mm512_setzero_ps(); R]; V];
            let mut c = 0;
            while c < d_in {
                let at = c / 32 * 34;
                unsafe {
                    let mut w = [(_mm512_setzero_si512(), _mm512_setzero_ps()); R];
                    for r in 0..R {
                        let p = rows[r].add(at);
                        fetch(p, row_bytes, 68);
                        let low = _mm256_loadu_si256(p.add(2).cast());
                        let high = _mm256_loadu_si256(p.add(36).cast());
                        let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
                        let unsigned = _mm512_xor_si512(q, _mm512_set1_epi8(-128));
                        w[r] = (unsigned, halves(half(p), half(p.add(34))));
                    }
                    for v in 0..V {
                        let base = vectors[v] * d_in + c;
                        let x = _mm512_loadu_si512(inputs.q32.as_ptr().add(base).cast());
                        let sums =
                            _mm512_loadu_si512(inputs.pair_sums.as_ptr().add(base / 4).cast());
                        // The codes' offset: 128 times the sum of a lane's inputs.
                        let offsets = _mm512_slli_epi32::<7>(sums);
                        let dx = _mm512_loadu_ps(inputs.pair_scales.as_ptr().add(base / 4));
                        for r in 0..R {
                            let dot = _mm512_dpbusd_epi32(offsets, w[r].0, x);
                            let scale = _mm512_mul_ps(w[r].1, dx);
                            acc[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[v][r]);
                        }
                    }
                }
                c += 64;
            }
            acc.map(|row| row.map(|a| _mm512_reduce_add_ps(a)))
        }
    }

    /// Q4_0: four blocks (128 values, 72 bytes) a step, codes `q - 8` read as `q`: the
    /// blocks' nibble bytes side by side in one register, their low nibbles (each block's
    /// first sixteen values) and high nibbles (its last sixteen) two `vpdpbusd`s into the
    /// same lanes, four lanes a block. A row's last 64 values, if its length is an odd
    /// number of 64s, are a step of two blocks.
    struct Q4_0;

    impl Q4_0 {
        /// The `blocks` (2 or 4) blocks at `p`: low and high nibbles, and scales as lanes.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,f16c")]
        unsafe fn step(p: *const u8, blocks: usize) -> (__m512i, __m512i, __m512) {
            unsafe {
                let codes = |k: usize| _mm_loadu_si128(p.add(18 * k + 2).cast());
                let scale = |k: usize| p.add(18 * k).cast::<i16>().read_unaligned();
                let mut q = _mm512_inserti32x4::<1>(_mm512_zextsi128_si512(codes(0)), codes(1));
                let mut d = _mm_setr_epi16(scale(0), scale(1), 0, 0, 0, 0, 0, 0);
                if blocks == 4 {
                    q = _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(q, codes(2)), codes(3));
                    d = _mm_setr_epi16(scale(0), scale(1), scale(2), scale(3), 0, 0, 0, 0);
                }
                let nibbles = _mm512_set1_epi8(0x0f);
                let lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
                (
                    _mm512_and_si512(q, nibbles),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(q), nibbles),
                    _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_cvtph_ps(d))),
                )
            }
        }
    }

    impl Kernel for Q4_0 {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
        unsafe fn tile<const R: usize, const V: usize>(
            rows: [*const u8; R],
            inputs: &Inputs,
            vectors: [usize; V],
        ) -> [[f32; R]; V] {
            let d_in = inputs.d_in;
            let (row_bytes, stride) = (d_in / 32 * 18, super::quad_stride(d_in));
            let mut acc = [[_mm512_setzero_ps(); R]; V];
            for step in 0..d_in.div_ceil(128) {
                let blocks = (d_in / 32 - 4 * step).min(4);
                unsafe {
                    let mut w = [(
                        _mm512_setzero_si512(),
                        _mm512_setzero_si512(),
                        _mm512_setzero_ps(),
                    ); R];
                    for r in 0..R {
                        let p = rows[r].add(step * 72);
                        fetch(p, row_bytes, 72);
                        w[r] = Self::step(p, blocks);
                    }
                    for v in 0..V {
                        let at = vectors[v] * stride + step * 128;
                        let x = inputs.quads.as_ptr().add(at);
                        let (low, high) = (
                            _mm512_loadu_si512(x.cast()),
                            _mm512_loadu_si512(x.add(64).cast()),
                        );
                        let sums = _mm512_loadu_si512(inputs.quad_sums.as_ptr().add(at / 8).cast());
                        // The codes' offset: 8 times the sum of a lane's inputs.
                        let offsets = _mm512_slli_epi32::<3>(sums);
                        let dx = _mm512_loadu_ps(inputs.quad_scales.as_ptr().add(at / 8));
                        for r in 0..R {
                            let dot = _mm512_dpbusd_epi32(offsets, w[r].0, low);
                            let dot = _mm512_dpbusd_epi32(dot, w[r].1, high);
                            let scale = _mm512_mul_ps(w[r].2, dx);
                            acc[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[v][r]);
                        }
                    }
                }
            }
            acc.map(|row| row.map(|a| _mm512_reduce_add_ps(a)))
        }
    }

    /// Q4_K: eight groups of 32 with 6-bit scales and mins; a block's 128 bytes of nibbles
    /// read 64 at a time, the low nibbles groups 0 and 2 (4 and 6), the high 1 and 3 (5, 7).
    struct Q4K;

    impl Kernel for Q4K {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
        unsafe fn tile<const R: usize, const V: usize>(
            rows: [*const u8; R],
            inputs: &Inputs,
            vectors: [usize; V],
        ) -> [[f32; R]; V] {
            let d_in = inputs.d_in;
            let row_bytes = d_in / 256 * 144;
            let nibbles = _mm512_set1_epi8(0x0f);
            let mut acc = [[_mm512_setzero_ps(); R]; V];
            for block in 0..d_in / 256 {
                unsafe {
                    let mut d = [(0.0, 0.0); R];
                    let mut scales = [_mm512_setzero_si512(); R];
                    let mut mins = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let p = rows[r].add(block * 144);
                        fetch(p, row_bytes, 144);
                        d[r] = (half(p), half(p.add(2)));
                        let (s, m) = scales_mins(p.add(4));
                        scales[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(s)));
                        // Each min twice: a sum of 16 inputs per lane, two per group.
                        let m = _mm_cvtsi64_si128(m);
                        mins[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
                    }
                    let mut dots = [[_mm512_setzero_si512(); R]; V];
                    for half in 0..2 {
                        let mut low = [_mm512_setzero_si512(); R];
                        let mut high = [_mm512_setzero_si512(); R];
                        let mut low_scales = [_mm512_setzero_si512(); R];
                        let mut high_scales = [_mm512_setzero_si512(); R];
                        let g = 4 * half as i16;
                        for r in 0..R {
                            let q = _mm512_loadu_si512(
                                rows[r].add(block * 144 + 16 + 64 * half).cast(),
                            );
                            low[r] = _mm512_and_si512(q, nibbles);
                            high[r] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nibbles);
                            low_scales[r] =
                                _mm512_permutexvar_epi16(index_halves(g, g + 2), scales[r]);
                            high_scales[r] =
                                _mm512_permutexvar_epi16(index_halves(g + 1, g + 3), scales[r]);
                        }
                        let at = block * 256 + 128 * half;
                        let xs = vectors.map(|b| inputs.paired[b * d_in + at..].as_ptr());
                        let scales = [low_scales, high_scales];
                        scaled_dots(&mut dots, [low, high], scales, xs);
                    }
                    for v in 0..V {
                        let k = vectors[v] * d_in / 256 + block;
                        let dx = *inputs.scales256.get_unchecked(k);
                        let sums = _mm256_loadu_si256(inputs.sums16.as_ptr().add(16 * k).cast());
                        for r in 0..R {
                            let (dq, dmin) = (d[r].0 * dx, -d[r].1 * dx);
                            let values = _mm512_cvtepi32_ps(dots[v][r]);
                            acc[v][r] = _mm512_fmadd_ps(values, _mm512_set1_ps(dq), acc[v][r]);
                            let m = _mm512_zextsi256_si512(_mm256_madd_epi16(mins[r], sums));
                            acc[v][r] = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(m),
                                _mm512_set1_ps(dmin),
                                acc[v][r],
                            );
                        }
                    }
                }
            }
            acc.map(|row| row.map(|a| _mm512_reduce_add_ps(a)))
        }
    }

    /// The K-quant kernels' step over 128 values of a block: each row's codes as unsigned
    /// bytes (`codes[0][r]` those of the first 64 inputs at `xs[v]`, `codes[1][r]` the
    /// last 64's), multiplied by the vector's integers and summed in pairs (`vpmaddubsw`:
    /// at most 2 * 63 * 127, no saturation), each pair times its group's scale and summed
    /// into `dots[v][r]` (`vpdpwssd`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn scaled_dots<const R: usize, const V: usize>(
        dots: &mut [[__m512i; R]; V],
        codes: [[__m512i; R]; 2],
        scales: [[__m512i; R]; 2],
        xs: [*const i8; V],
    ) {
        for v in 0..V {
            for half in 0..2 {
                // SAFETY: the caller's vectors hold 128 integers from `xs[v]`.
                let x = unsafe { _mm512_loadu_si512(xs[v].add(64 * half).cast()) };
                for r in 0..R {
                    let p = _mm512_maddubs_epi16(codes[half][r], x);
                    dots[v][r] = _mm512_dpwssd_epi32(dots[v][r], p, scales[half][r]);
                }
            }
        }
    }

    /// Q4_K's packed scales and mins (`quant::scale_min_k4`), eight bytes each, as
    /// llama.cpp unpacks them: in 32-bit words.
    #[inline(always)]
    unsafe fn scales_mins(p: *const u8) -> (i64, i64) {
        const LOW6: u32 = 0x3f3f_3f3f;
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let word = |i: usize| unsafe { p.add(4 * i).cast::<u32>().read_unaligned() };
        let (a, b, c) = (word(0), word(1), word(2));
        let scales = (a & LOW6) as u64 | ((((c & LOW4) | (((a >> 6) & LOW2) << 4)) as u64) << 32);
        let mins =
            (b & LOW6) as u64 | (((((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4)) as u64) << 32);
        (scales as i64, mins as i64)
    }

    /// Q6_K: sixteen groups of 16 with 8-bit scales; each half of the block (128 values)
    /// a run of 64 bytes of low nibbles and 32 of high bit pairs, read 64 values at a time.
    struct Q6K;

    impl Kernel for Q6K {
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,avx2")]
        unsafe fn tile<const R: usize, const V: usize>(
            rows: [*const u8; R],
            inputs: &Inputs,
            vectors: [usize; V],
        ) -> [[f32; R]; V] {
            let d_in = inputs.d_in;
            let row_bytes = d_in / 256 * 210;
            let (nibbles, pairs) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
            let mut acc = [[_mm512_setzero_ps(); R]; V];
            for block in 0..d_in / 256 {
                unsafe {
                    let mut d = [0.0; R];
                    let mut scales = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let p = rows[r].add(block * 210);
                        fetch(p, row_bytes, 210);
                        d[r] = half(p.add(208));
                        scales[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
                    }
                    let mut dots = [[_mm512_setzero_si512(); R]; V];
                    for half in 0..2 {
                        let mut low = [_mm512_setzero_si512(); R];
                        let mut high = [_mm512_setzero_si512(); R];
                        let mut low_scales = [_mm512_setzero_si512(); R];
                        let mut high_scales = [_mm512_setzero_si512(); R];
                        for r in 0..R {
                            let p = rows[r].add(block * 210);
                            let ql = _mm512_loadu_si512(p.add(64 * half).cast());
                            let qh = _mm256_loadu_si256(p.add(128 + 32 * half).cast());
                            // Values l and l + 32 take bits 0-1 and 2-3 of qh[l]; values
                            // l + 64 and l + 96 bits 4-5 and 6-7.
                            let qh = _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(qh),
                                _mm256_srli_epi16::<2>(qh),
                            );
                            let top = |bits: __m512i| {
                                _mm512_slli_epi16::<4>(_mm512_and_si512(bits, pairs))
                            };
                            low[r] = _mm512_or_si512(_mm512_and_si512(ql, nibbles), top(qh));
                            high[r] = _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), nibbles),
                                top(_mm512_srli_epi16::<4>(qh)),
                            );
                            let all = _mm512_castsi256_si512(scales[r]);
                            low_scales[r] = _mm512_permutexvar_epi16(group_index(2 * half), all);
                            high_scales[r] =
                                _mm512_permutexvar_epi16(group_index(2 * half + 1), all);
                        }
                        let at = block * 256 + 128 * half;
                        let xs = vectors.map(|b| inputs.q256[b * d_in + at..].as_ptr());
                        let scales = [low_scales, high_scales];
                        scaled_dots(&mut dots, [low, high], scales, xs);
                    }
                    for v in 0..V {
                        let k = vectors[v] * d_in / 256 + block;
                        let dx = *inputs.scales256.get_unchecked(k);
                        let sums = _mm256_loadu_si256(inputs.sums16.as_ptr().add(16 * k).cast());
                        for r in 0..R {
                            // The codes' offset of 32: 32 * scale * sum, per group of 16.
                            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(scales[r], sums));
                            let dot = _mm512_sub_epi32(dots[v][r], _mm512_zextsi256_si512(offset));
                            let scale = _mm512_set1_ps(d[r] * dx);
                            acc[v][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[v][r]);
                        }
                    }
                }
            }
            acc.map(|row| row.map(|a| _mm512_reduce_add_ps(a)))
        }
    }

    /// `vpermw` indices spreading Q6_K's sixteen scales (i16) over 64 values' i16 lanes:
    /// quarter `q` of the block, lanes `8k..8k + 8` taking group `4q + k`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn group_index(quarter: usize) -> __m512i {
        let q = 4 * quarter as i16;
        let low =
            _mm512_mask_blend_epi16(0x0000_ff00, _mm512_set1_epi16(q), _mm512_set1_epi16(q + 1));
        let high = _mm512_mask_blend_epi16(
            0xff00_0000,
            _mm512_set1_epi16(q + 2),
            _mm512_set1_epi16(q + 3),
        );
        _mm512_mask_blend_epi16(0xffff_0000, low, high)
    }
}

#[cfg(test)]
mod tests;
