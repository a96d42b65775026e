//! Products of many rows (a prompt) with quantized weights (Q8_0, Q4_0, Q4_K, Q6_K), the
//! rows rounded to 8-bit integers first as for decoding (see [`super`]): per 32 for Q8_0
//! and Q4_0, per 256 for the K-quants. The int8 counterpart of [`crate::panels`],
//! on the AVX-512 VNNI tier.
//!
//! Why: an f32 FMA does 16 multiply-adds, a `vpdpbusd` 64. A panel of 16 weight rows over
//! a step of 256 inputs is unpacked once into bytes laid out as `vpdpbusd` reads them
//! (lane `j` holds four consecutive codes of row `j`) and then every row of the prompt
//! passes over it, twelve at a time, each broadcasting four of its bytes per instruction.
//! So the weight's unpacking is paid once per call, not once per row.
//!
//! Every type is `scale * (code - c) - offset` per group of 16 or 32 inputs with unsigned
//! codes: Q8_0 `d * (q + 128 - 128)`, Q4_0 `d * (q - 8)`, Q6_K `(d * sc) * (q - 32)`, Q4_K
//! `(d * sc) * q - dmin * m`. So one kernel takes them all: per group, the integer dot
//! product of codes and inputs starting from `-c` times the inputs' sum (exact), scaled;
//! minus the offset times that sum where there is one (Q4_K); times the inputs' scale.
//!
//! Not exact (the inputs are rounded), and not the decoding kernels' arithmetic either
//! (they scale the integer sums in another order), but a row's result depends only on that
//! row and the weight: not on the rows beside it, their number, or the threads.

use std::cell::{Cell, RefCell};
use std::ops::Range;

use rayon::prelude::*;

use super::Format;
use crate::cpu::{self, Tier};
use crate::quant::{BlockType, scale_min_k4};

/// Weight rows per panel: one register of `i32` lanes.
const NR: usize = 16;
/// Prompt rows per tile: 12 × 2 registers (integer sums, block sums) beside the codes, the
/// scales and the offsets.
const MR: usize = 12;
/// Weight rows (output columns) per task: four panels, whose sums over a tile stay in L2
/// across the blocks.
const GROUP: usize = 4 * NR;
/// Inputs per step: a K-quant block, eight Q8_0 or Q4_0 blocks.
const QK: usize = 256;

/// Whether this CPU runs [`linear_rows`] for `ty` rows of `d_in`: the decoding kernels'
/// types and shapes, on the AVX-512 VNNI tier (elsewhere prompts take the exact path).
pub fn runs(ty: BlockType, d_in: usize) -> bool {
    super::runs(ty, d_in) && cpu::tier() >= Tier::Avx512Vnni
}

/// `x` (`rows` rows of `d_in`) times the weight whose rows are `ty` blocks in `weight`:
/// `rows` rows of `d_out`, each row of x rounded to 8-bit integers first.
///
/// # Panics
/// Unless [`runs`]`(ty, d_in)` and `weight` is whole rows.
pub fn linear_rows(x: &[f32], ty: BlockType, weight: &[u8], d_in: usize) -> Vec<f32> {
    assert!(
        runs(ty, d_in),
        "no int8 prompt kernel for {ty} rows of {d_in} here"
    );
    let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
    assert!(x.len().is_multiple_of(d_in) && weight.len().is_multiple_of(row_bytes));
    let (rows, d_out) = (x.len() / d_in, weight.len() / row_bytes);
    let mut out = vec![0.0f32; rows * d_out];
    if rows == 0 || d_out == 0 {
        return out;
    }
    let x = Rounded::new(x, d_in, super::Format::of(ty).expect("an int8 type"));
    let groups = d_out.div_ceil(GROUP);
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..groups).into_par_iter().for_each(|group| {
        let columns = group * GROUP..((group + 1) * GROUP).min(d_out);
        let panels: Vec<Range<usize>> = (columns.clone().step_by(NR))
            .map(|first| first..(first + NR).min(columns.end))
            .collect();
        let mut packed: Vec<Box<Packed>> = panels.iter().map(|_| Packed::new()).collect();
        // The group's outputs, summed here (rows GROUP apart, in cache) rather than in
        // `out`, whose rows lie d_out apart: a page per row, and a TLB miss per tile row.
        let mut sums = SUMS.take();
        sums.clear();
        sums.resize(x.rows * GROUP, 0.0);
        // A step's blocks: one K-quant block, or up to eight of 32 values.
        let step_bytes = QK / ty.values() * ty.bytes();
        for step in 0..d_in.div_ceil(QK) {
            let bytes = step * step_bytes..((step + 1) * step_bytes).min(row_bytes);
            for (panel, packed) in panels.iter().zip(&mut packed) {
                packed.fill(
                    ty,
                    panel
                        .clone()
                        .map(|j| &weight[j * row_bytes..][bytes.clone()]),
                );
            }
            for tile in (0..rows).step_by(MR) {
                let valid = MR.min(rows - tile);
                for (p, (panel, packed)) in panels.iter().zip(&packed).enumerate() {
                    let at = tile * GROUP + p * NR;
                    // SAFETY: `runs` checked the CPU; `sums` holds the tile's rows.
                    unsafe {
                        let sums = sums[at..].as_mut_ptr();
                        x.tile(ty, packed, step, tile, sums, GROUP, (valid, panel.len()));
                    }
                }
            }
        }
        for (row, sums) in sums.chunks_exact(GROUP).take(rows).enumerate() {
            // SAFETY: the group's columns of out's rows belong to this task alone.
            unsafe {
                let out = out_ptr.at(row * d_out + columns.start);
                std::ptr::copy_nonoverlapping(sums.as_ptr(), out, columns.len());
            }
        }
        SUMS.set(sums);
    });
    out
}

/// A prompt rounded as a weight type needs it, grouped by step: step `s` (inputs
/// `256 s..`) of every row together, rows padded with zeros to a whole number of tiles and
/// to a whole number of steps.
struct Rounded {
    /// Rows, padded to a multiple of MR.
    rows: usize,
    /// Per 32 values or per 256.
    format: Format,
    /// The integers: `[step][row][256]`.
    q: Vec<i8>,
    /// Each row's scales: `[step][row][8]` (per 32) or `[step][row]` (per 256).
    d: Vec<f32>,
    /// Sums of each group of 16 integers: `[step][row][16]`.
    sums16: Vec<i32>,
    /// Sums of each group of 32: `[step][row][8]`.
    sums32: Vec<i32>,
}

impl Rounded {
    fn new(x: &[f32], d_in: usize, format: Format) -> Self {
        let (real, steps) = (x.len() / d_in, d_in.div_ceil(QK));
        let rows = real.next_multiple_of(MR);
        let scales = match format {
            Format::Blocks32 => QK / 32,
            Format::Blocks256 => 1,
        };
        let mut r = Rounded {
            rows,
            format,
            q: vec![0; steps * rows * QK],
            d: vec![0.0; steps * rows * scales],
            sums16: vec![0; steps * rows * 16],
            sums32: vec![0; steps * rows * 8],
        };
        (r.q.par_chunks_mut(QK))
            .zip(r.d.par_chunks_mut(scales))
            .zip(r.sums16.par_chunks_mut(16).zip(r.sums32.par_chunks_mut(8)))
            .enumerate()
            .for_each(|(i, ((q, d), (sums16, sums32)))| {
                let (step, row) = (i / rows, i % rows);
                if row >= real {
                    return;
                }
                // Past d_in: zeros, which add nothing.
                let x = &x[row * d_in..][step * QK..d_in.min((step + 1) * QK)];
                let width = x.len().next_multiple_of(32);
                let chunks = x
                    .chunks(QK / scales)
                    .zip(q[..width].chunks_exact_mut(QK / scales));
                for (d, (x, q)) in d.iter_mut().zip(chunks) {
                    *d = super::round_block(x, q);
                }
                for (sum, q) in sums16.iter_mut().zip(q.chunks_exact(16)) {
                    *sum = q.iter().map(|&q| i32::from(q)).sum();
                }
                for (g, sum) in sums32.iter_mut().enumerate() {
                    *sum = sums16[2 * g] + sums16[2 * g + 1];
                }
            });
        r
    }

    /// Adds the products of rows `tile..tile + MR` over step `step` with the weight rows
    /// packed in `packed` to `out` (rows `stride` apart), for the first `valid` rows and `n`
    /// columns.
    ///
    /// # Safety
    /// [`super::runs`] for `ty`; `out` points at `valid` rows of at least `n` values, `stride`
    /// apart, that nothing else touches meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        &self,
        ty: BlockType,
        packed: &Packed,
        step: usize,
        tile: usize,
        out: *mut f32,
        stride: usize,
        (valid, n): (usize, usize),
    ) {
        assert!(tile + MR <= self.rows && valid <= MR && n <= NR);
        let at = step * self.rows + tile;
        let x = &self.q[at * QK..][..MR * QK];
        let (sums16, sums32) = (
            &self.sums16[at * 16..][..MR * 16],
            &self.sums32[at * 8..][..MR * 8],
        );
        let d = match self.format {
            Format::Blocks32 => &self.d[at * 8..][..MR * 8],
            Format::Blocks256 => &self.d[at..][..MR],
        };
        let shape = (valid, n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; the slices hold the tile's MR rows.
        unsafe {
            use avx512::tile as run;
            match ty {
                BlockType::Q8_0 => run::<8, 128, true>(packed, x, sums32, d, out, stride, shape),
                BlockType::Q4_0 => run::<8, 8, true>(packed, x, sums32, d, out, stride, shape),
                BlockType::Q4K => run::<8, 0, false>(packed, x, sums32, d, out, stride, shape),
                BlockType::Q6K => run::<4, 32, false>(packed, x, sums16, d, out, stride, shape),
                other => unreachable!("no int8 kernel for {other}"),
            }
        }
    }
}

/// Sixteen weight rows' step of 256 inputs, unpacked for the kernel.
#[repr(C, align(64))]
struct Packed {
    /// The codes as `vpdpbusd` takes them: for each four inputs, sixteen rows' four codes.
    codes: [u8; QK * NR],
    /// Each group's scale for each row: `[group][row]` (16 groups at most).
    scales: [f32; 16 * NR],
    /// Each group's offset for each row, where the type has one apart from its codes'
    /// (Q4_K's `dmin * m`).
    offsets: [f32; 16 * NR],
}

impl Packed {
    fn new() -> Box<Self> {
        Box::new(Packed {
            codes: [0; QK * NR],
            scales: [0.0; 16 * NR],
            offsets: [0.0; 16 * NR],
        })
    }

    /// Unpacks a step (one K-quant block, or up to eight of 32 values) of each of up to NR
    /// rows; rows and groups past them: zeros.
    fn fill<'w>(&mut self, ty: BlockType, steps: impl Iterator<Item = &'w [u8]>) {
        ROWS.with_borrow_mut(|codes| {
            codes.fill(0);
            self.scales.fill(0.0);
            self.offsets.fill(0.0);
            let half = |b: &[u8], i: usize| half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
            for (j, step) in steps.enumerate() {
                let codes = &mut codes[j * QK..][..QK];
                match ty {
                    BlockType::Q4K => {
                        let (d, dmin) = (half(step, 0), half(step, 2));
                        let (scales, mins) = scale_min_k4(&step[4..16]);
                        for g in 0..8 {
                            self.scales[g * NR + j] = d * f32::from(scales[g]);
                            self.offsets[g * NR + j] = dmin * f32::from(mins[g]);
                        }
                    }
                    BlockType::Q6K => {
                        let d = half(step, 208);
                        for (g, &scale) in step[192..208].iter().enumerate() {
                            self.scales[g * NR + j] = d * f32::from(scale as i8);
                        }
                    }
                    _ => {
                        for (g, block) in step.chunks_exact(ty.bytes()).enumerate() {
                            self.scales[g * NR + j] = half(block, 0);
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `runs` checked the CPU; `step` is whole blocks of `ty`.
                unsafe {
                    avx512::codes(ty, step, codes)
                };
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            unsafe {
                avx512::transpose(codes, &mut self.codes)
            };
        });
    }
}

/// The output buffer, shared by tasks that write disjoint columns of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: each task writes only its own panels' columns (see `linear_rows`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The output's value `i` (a method, so that closures capture the whole `OutPtr`).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

thread_local! {
    /// The calling thread's sums for a group, reused by its next group (a fresh buffer of
    /// this size is a fresh mapping, page faults and all, each time).
    static SUMS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's unpacked rows, before the transpose into a panel.
    static ROWS: RefCell<[u8; QK * NR]> = const { RefCell::new([0; QK * NR]) };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MR, NR, Packed, QK};
    use crate::quant::BlockType;
    use crate::simd::avx512::transpose as transpose16;

    /// A step's codes (`step`: whole blocks of `ty`) in input order, unsigned (Q8_0's plus
    /// 128, Q4_0's and Q4_K's 4 bits, Q6_K's 6), into `codes`.
    ///
    /// # Safety
    /// AVX-512F, BW and AVX2 present.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) unsafe fn codes(ty: BlockType, step: &[u8], codes: &mut [u8]) {
        let blocks = step.len() / ty.bytes();
        assert!(step.len() == blocks * ty.bytes() && blocks * ty.values() <= QK);
        assert!(codes.len() >= QK);
        let nibbles = _mm256_set1_epi8(0x0f);
        // SAFETY (whole body): the asserts keep every read inside `step` (32 bytes read at
        // most 32 bytes before a block's end) and every write inside `codes`.
        unsafe {
            let load = |at: usize| _mm256_loadu_si256(step.as_ptr().add(at).cast());
            let to = codes.as_mut_ptr();
            let store = |at: usize, v: __m256i| _mm256_storeu_si256(to.add(at).cast(), v);
            match ty {
                BlockType::Q8_0 => {
                    for b in 0..blocks {
                        let q = load(b * ty.bytes() + 2);
                        store(32 * b, _mm256_xor_si256(q, _mm256_set1_epi8(-128)));
                    }
                }
                BlockType::Q4_0 => {
                    // Values 0..16 in the low nibbles, 16..32 in the high.
                    let nibbles = _mm_set1_epi8(0x0f);
                    for b in 0..blocks {
                        let q = _mm_loadu_si128(step.as_ptr().add(b * ty.bytes() + 2).cast());
                        let low = _mm_and_si128(q, nibbles);
                        let high = _mm_and_si128(_mm_srli_epi16(q, 4), nibbles);
                        _mm_storeu_si128(to.add(32 * b).cast(), low);
                        _mm_storeu_si128(to.add(32 * b + 16).cast(), high);
                    }
                }
                BlockType::Q4K => {
                    // Bytes 32c..32c + 32 hold group 2c in their low nibbles, 2c + 1 in the
                    // high.
                    for c in 0..4 {
                        let q = load(16 + 32 * c);
                        store(64 * c, _mm256_and_si256(q, nibbles));
                        store(
                            64 * c + 32,
                            _mm256_and_si256(_mm256_srli_epi16(q, 4), nibbles),
                        );
                    }
                }
                BlockType::Q6K => {
                    // As `quant::q6_k` reads them, 32 values at a time.
                    let twos = _mm256_set1_epi8(0x30);
                    for c in 0..8 {
                        let (half, quarter) = (c / 4, c % 4);
                        let low = load(half * 64 + (quarter % 2) * 32);
                        let low = if quarter / 2 == 1 {
                            _mm256_srli_epi16(low, 4)
                        } else {
                            low
                        };
                        let high = load(128 + half * 32);
                        // The two bits at 2 * quarter, moved to bits 4 and 5.
                        let high = match quarter {
                            0 => _mm256_slli_epi16(high, 4),
                            1 => _mm256_slli_epi16(high, 2),
                            2 => high,
                            _ => _mm256_srli_epi16(high, 2),
                        };
                        let code = _mm256_or_si256(
                            _mm256_and_si256(low, nibbles),
                            _mm256_and_si256(high, twos),
                        );
                        store(32 * c, code);
                    }
                }
                other => unreachable!("no int8 kernel for {other}"),
            }
        }
    }

    /// NR rows of 256 codes (`rows[j * 256..]`) into `codes`, each four codes of a row
    /// beside the same four of the other rows: a transpose of 32-bit words.
    ///
    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose(rows: &[u8; QK * NR], codes: &mut [u8; QK * NR]) {
        // SAFETY: 16 rows of 64 bytes read at each of the 4 offsets, 16 × 64 written.
        unsafe {
            for c in 0..4 {
                let block: [__m512; 16] = std::array::from_fn(|j| {
                    _mm512_loadu_ps(rows.as_ptr().add(j * QK + 64 * c).cast())
                });
                for (k, words) in transpose16(block).into_iter().enumerate() {
                    _mm512_storeu_ps(codes.as_mut_ptr().add((16 * c + k) * 64).cast(), words);
                }
            }
        }
    }

    /// See `Rounded::tile`. `G`: four-input steps per group (8, or 4 for Q6_K); `C`: the
    /// codes' offset (`-C` times a group's sum of inputs starts its dot product; 0 for Q4_K,
    /// whose float offsets are taken off instead); `PER_GROUP`: the inputs' scales are per
    /// group (`d[row][group]`), not per step (`d[row]`). `x` holds the tile's MR rows of 256
    /// integers, `sums` their groups' sums.
    ///
    /// # Safety
    /// AVX-512F, BW, VNNI and FMA present; `out` as `Rounded::tile` says.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) unsafe fn tile<const G: usize, const C: i32, const PER_GROUP: bool>(
        packed: &Packed,
        x: &[i8],
        sums: &[i32],
        d: &[f32],
        out: *mut f32,
        stride: usize,
        (valid, n): (usize, usize),
    ) {
        let groups = QK / 4 / G;
        let scales = if PER_GROUP { groups } else { 1 };
        assert!(x.len() >= MR * QK && sums.len() >= MR * groups && d.len() >= MR * scales);
        let mask: __mmask16 = if n >= NR { !0 } else { (1u16 << n) - 1 };
        // SAFETY (whole body): the asserts and the caller's promises keep every read inside
        // the slices and every write inside out's tile.
        unsafe {
            let codes = packed.codes.as_ptr();
            let xs = x.as_ptr();
            let mut block = [_mm512_setzero_ps(); MR];
            for g in 0..groups {
                let mut dots: [__m512i; MR] = std::array::from_fn(|r| {
                    if C == 0 {
                        _mm512_setzero_si512()
                    } else {
                        _mm512_set1_epi32(-C * *sums.get_unchecked(r * groups + g))
                    }
                });
                for k in g * G..(g + 1) * G {
                    let w = _mm512_load_si512(codes.add(k * NR * 4).cast());
                    for (r, dot) in dots.iter_mut().enumerate() {
                        let four = xs.add(r * QK + 4 * k).cast::<i32>().read_unaligned();
                        *dot = _mm512_dpbusd_epi32(*dot, w, _mm512_set1_epi32(four));
                    }
                }
                let scale = _mm512_load_ps(packed.scales.as_ptr().add(g * NR));
                let offset = _mm512_load_ps(packed.offsets.as_ptr().add(g * NR));
                for r in 0..MR {
                    let scale = if PER_GROUP {
                        _mm512_mul_ps(scale, _mm512_set1_ps(*d.get_unchecked(r * groups + g)))
                    } else {
                        scale
                    };
                    block[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), scale, block[r]);
                    if C == 0 {
                        let sum = *sums.get_unchecked(r * groups + g) as f32;
                        block[r] = _mm512_fnmadd_ps(offset, _mm512_set1_ps(sum), block[r]);
                    }
                }
            }
            for (r, block) in block.iter().enumerate().take(valid) {
                let out = out.add(r * stride);
                let acc = _mm512_maskz_loadu_ps(mask, out);
                let acc = if PER_GROUP {
                    _mm512_add_ps(acc, *block)
                } else {
                    _mm512_fmadd_ps(*block, _mm512_set1_ps(d[r]), acc)
                };
                _mm512_mask_storeu_ps(out, mask, acc);
            }
        }
    }
}
