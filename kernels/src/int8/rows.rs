//! Products of many rows (a prompt) with quantized weights (Q8_0, Q4_0, Q4_K, Q6_K), the
//! rows rounded to 8-bit integers first as for decoding (see [`super`]): per 32 for Q8_0
//! and Q4_0, per 256 for the K-quants. The int8 counterpart of [`crate::panels`]: on the
//! AVX-512 VNNI tier every type, below it (`avx2.rs`) the types whose codes take at most 6
//! bits.
//!
//! Why: an f32 FMA does 16 multiply-adds, a `vpdpbusd` 64. A panel of 16 weight rows over
//! a step of 256 inputs is unpacked once into bytes laid out as `vpdpbusd` reads them
//! (lane `j` holds four consecutive codes of row `j`) and then every row of the prompt
//! passes over it, fourteen at a time, each broadcasting four of its bytes per instruction.
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

use std::cell::{Cell, OnceCell, RefCell};
use std::ops::Range;

use rayon::prelude::*;

use super::{Format, Kernels};
use crate::cpu::multiversioned;
use crate::quant::{BlockType, scale_min_k4};
use crate::team::OutPtr;

/// Weight rows per panel: one register of `i32` lanes.
const NR: usize = 16;
/// Prompt rows per tile: 14 × 2 registers (integer sums, block sums) beside the codes, the
/// scales and the offsets, 31 of the 32 (12 was 10% slower: the loads of the codes and the
/// work between groups are shared by fewer rows).
const MR: usize = 14;
/// Weight rows (output columns) per task: four panels, whose sums over a tile stay in L2
/// across the blocks.
const GROUP: usize = 4 * NR;
/// Inputs per step: a K-quant block, eight Q8_0 or Q4_0 blocks.
const QK: usize = 256;

/// Whether this CPU runs [`linear_rows`] for `ty` rows of `d_in`: the decoding kernels'
/// types and shapes, on the AVX-512 VNNI tier; below it, those whose codes take at most 6
/// bits (elsewhere prompts take the exact path).
pub fn runs(ty: BlockType, d_in: usize) -> bool {
    runs_on(ty, d_in, Kernels::here())
}

/// [`runs`] with the kernels `kernels`.
pub(super) fn runs_on(ty: BlockType, d_in: usize, kernels: Kernels) -> bool {
    super::runs(ty, d_in)
        && match kernels {
            Kernels::Vnni => true,
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2 => avx2::takes(ty),
            #[cfg(not(target_arch = "x86_64"))]
            Kernels::Avx2 => false,
        }
}

/// `x` (`rows` rows of `d_in`) times the weight whose rows are `ty` blocks in `weight`:
/// `rows` rows of `d_out`, each row of x rounded to 8-bit integers first.
///
/// # Panics
/// Unless [`runs`]`(ty, d_in)` and `weight` is whole rows.
pub fn linear_rows(x: &[f32], ty: BlockType, weight: &[u8], d_in: usize) -> Vec<f32> {
    Prompt::new(x, d_in).linear(ty, weight)
}

/// A prompt's rows (`x`, rows of `d_in`), rounded to 8-bit integers as the weights'
/// types need them, once for all the weights that take the same rounding (q, k and v;
/// gate and up).
pub struct Prompt<'x> {
    x: &'x [f32],
    d_in: usize,
    /// The build of the kernel that runs (the fastest here; tests choose).
    kernels: Kernels,
    /// Per 32 values, per 256.
    rounded: [OnceCell<Rounded>; 2],
}

impl<'x> Prompt<'x> {
    pub fn new(x: &'x [f32], d_in: usize) -> Self {
        Prompt::for_kernels(x, d_in, Kernels::here())
    }

    pub(super) fn for_kernels(x: &'x [f32], d_in: usize, kernels: Kernels) -> Self {
        assert!(d_in > 0 && x.len().is_multiple_of(d_in));
        Prompt {
            x,
            d_in,
            kernels,
            rounded: Default::default(),
        }
    }

    /// The prompt times the weight whose rows are `ty` blocks in `weight`, as
    /// [`linear_rows`].
    ///
    /// # Panics
    /// Unless [`runs`]`(ty, d_in)` and `weight` is whole rows.
    pub fn linear(&self, ty: BlockType, weight: &[u8]) -> Vec<f32> {
        let d_in = self.d_in;
        assert!(
            runs_on(ty, d_in, self.kernels),
            "no int8 prompt kernel for {ty} rows of {d_in} here"
        );
        let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
        assert!(weight.len().is_multiple_of(row_bytes));
        let (rows, d_out) = (self.x.len() / d_in, weight.len() / row_bytes);
        if rows == 0 || d_out == 0 {
            return vec![0.0; rows * d_out];
        }
        let format = Format::of(ty).expect("an int8 type");
        let x = self.rounded[format as usize].get_or_init(|| Rounded::new(self.x, d_in, format));
        products(x, &Terms::new(x, ty), ty, weight, d_in, self.kernels)
    }
}

/// See [`Prompt::linear`]: `x` rounded for `ty`, `terms` its groups' terms.
fn products(
    x: &Rounded,
    terms: &Terms,
    ty: BlockType,
    weight: &[u8],
    d_in: usize,
    kernels: Kernels,
) -> Vec<f32> {
    let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
    let (rows, d_out) = (x.real, weight.len() / row_bytes);
    // Every value is stored by a last step's tile before `set_len` below.
    let mut out: Vec<f32> = Vec::with_capacity(rows * d_out);
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
        // The last step's tiles store their totals in `out`, where the stores' misses
        // overlap the products (a copy afterwards waited on each row's).
        // The first step's tiles start from zero, not from these (left from the last group).
        let mut sums = SUMS.take();
        if sums.len() < x.rows * GROUP {
            sums.resize(x.rows * GROUP, 0.0);
        }
        // A step's blocks: one K-quant block, or up to eight of 32 values.
        let step_bytes = QK / ty.values() * ty.bytes();
        let steps = d_in.div_ceil(QK);
        for step in 0..steps {
            let bytes = step * step_bytes..((step + 1) * step_bytes).min(row_bytes);
            for (panel, packed) in panels.iter().zip(&mut packed) {
                packed.fill(
                    kernels,
                    ty,
                    panel
                        .clone()
                        .map(|j| &weight[j * row_bytes..][bytes.clone()]),
                );
            }
            // The next step's blocks, fetched while this step's tiles run (rows row_bytes
            // apart are too far apart for the hardware to guess); after the last step, the
            // first of the next group's, which this thread most often takes next (rayon
            // splits the groups into contiguous ranges).
            let (next_step, next_columns) = if step + 1 < steps {
                (step + 1, columns.clone())
            } else {
                (0, columns.end..(columns.end + GROUP).min(d_out))
            };
            let next = next_step * step_bytes..((next_step + 1) * step_bytes).min(row_bytes);
            for j in next_columns {
                prefetch(&weight[j * row_bytes..][next.clone()]);
            }
            for tile in (0..rows).step_by(MR) {
                let valid = MR.min(rows - tile);
                for (p, (panel, packed)) in panels.iter().zip(&packed).enumerate() {
                    let at = tile * GROUP + p * NR;
                    let from = sums[at..].as_mut_ptr();
                    let to = if step + 1 == steps {
                        (out_ptr.at(tile * d_out + panel.start), d_out)
                    } else {
                        (from, GROUP)
                    };
                    let from = if step == 0 { std::ptr::null() } else { from };
                    let sums = Accumulate {
                        from: (from, GROUP),
                        to,
                    };
                    // SAFETY: `runs` checked the CPU; `sums` holds the tile's rows, and the
                    // panel's columns of out's rows belong to this task alone.
                    unsafe {
                        x.tile(
                            kernels,
                            terms,
                            ty,
                            packed,
                            step,
                            tile,
                            sums,
                            (valid, panel.len()),
                        )
                    };
                }
            }
        }
        SUMS.set(sums);
    });
    // SAFETY: the groups' last steps stored every row's every column (the panels cover
    // the columns, the tiles the rows).
    unsafe { out.set_len(rows * d_out) };
    out
}

/// A prompt rounded per 32 or per 256 values, grouped by step: step `s` (inputs
/// `256 s..`) of every row together, rows padded with zeros to a whole number of tiles and
/// to a whole number of steps.
struct Rounded {
    /// Rows, and rows padded to a multiple of MR.
    real: usize,
    rows: usize,
    format: Format,
    /// The integers: `[step][row][256]`.
    q: Vec<i8>,
    /// Each row's scales: `[step][row][8]` (per 32) or `[step][row]` (per 256).
    d: Vec<f32>,
    /// Sums of each 16 integers: `[step][row][16]`.
    sums16: Vec<i32>,
}

impl Rounded {
    fn new(x: &[f32], d_in: usize, format: Format) -> Self {
        let (real, steps) = (x.len() / d_in, d_in.div_ceil(QK));
        let rows = real.next_multiple_of(MR);
        let scales = match format {
            Format::Blocks32 => QK / 32,
            Format::Blocks256 => 1,
        };
        let mut q = vec![0; steps * rows * QK];
        let mut d = vec![0.0; steps * rows * scales];
        let mut sums16 = vec![0; steps * rows * 16];
        (q.par_chunks_mut(QK))
            .zip(d.par_chunks_mut(scales))
            .zip(sums16.par_chunks_mut(16))
            .enumerate()
            .for_each(|(i, ((q, d), sums16))| {
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
                sums_of_16(q, sums16);
            });
        Rounded {
            real,
            rows,
            format,
            q,
            d,
            sums16,
        }
    }

    /// Adds the products of rows `tile..tile + MR` over step `step` with the weight rows
    /// packed in `packed` to `sums`, for the first `valid` rows and `n` columns.
    ///
    /// # Safety
    /// [`super::runs`] for `ty`; `sums` as [`Accumulate`] says, for `valid` rows of `n`
    /// values.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        &self,
        kernels: Kernels,
        terms: &Terms,
        ty: BlockType,
        packed: &Packed,
        step: usize,
        tile: usize,
        sums: Accumulate,
        (valid, n): (usize, usize),
    ) {
        assert!(tile + MR <= self.rows && valid <= MR && n <= NR);
        let at = step * self.rows + tile;
        let x = &self.q[at * QK..][..MR * QK];
        let (group, _) = groups(ty);
        let span = at * (QK / group)..(at + MR) * (QK / group);
        let terms = if terms.starts.is_empty() {
            (&[][..], &terms.sums[span])
        } else {
            (&terms.starts[span], &[][..])
        };
        let d = match self.format {
            Format::Blocks32 => &self.d[at * 8..][..MR * 8],
            Format::Blocks256 => &self.d[at..][..MR],
        };
        let shape = (valid, n);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; the slices hold the tile's MR rows.
        unsafe {
            match kernels {
                Kernels::Vnni => {
                    use avx512::tile as run;
                    match ty {
                        BlockType::Q8_0 => run::<8, 128, true>(packed, x, terms, d, sums, shape),
                        BlockType::Q4_0 => run::<8, 8, true>(packed, x, terms, d, sums, shape),
                        BlockType::Q4K => run::<8, 0, false>(packed, x, terms, d, sums, shape),
                        BlockType::Q6K => run::<4, 32, false>(packed, x, terms, d, sums, shape),
                        other => unreachable!("no int8 kernel for {other}"),
                    }
                }
                Kernels::Avx2 => {
                    use avx2::tile as run;
                    match ty {
                        BlockType::Q4_0 => run::<8, 8, true, 8>(packed, x, terms, d, sums, shape),
                        BlockType::Q4K => run::<8, 0, false, 8>(packed, x, terms, d, sums, shape),
                        BlockType::Q6K => run::<4, 32, false, 2>(packed, x, terms, d, sums, shape),
                        other => unreachable!("no AVX2 int8 prompt kernel for {other}"),
                    }
                }
            }
        }
    }
}

multiversioned! {
    /// Each 16 integers' sum: `sums[k]` of `q[16 k..16 k + 16]`.
    fn sums_of_16(q: &[i8], sums: &mut [i32]) {
        for (sum, q) in sums.iter_mut().zip(q.chunks_exact(16)) {
            *sum = q.iter().map(|&q| i32::from(q)).sum();
        }
    }
}

/// What each group of a weight type's inputs (16 or 32) adds through its sum of integers
/// `s`, ready for the kernel to broadcast from memory: `[step][row][group]`. Where the codes
/// are offset by `c` (Q8_0, Q4_0, Q6_K), the group's dot product starts at `-c s`
/// (`starts`); Q4_K, whose offsets are floats, takes `s` as an f32 (`sums`, exact).
struct Terms {
    starts: Vec<i32>,
    sums: Vec<f32>,
}

impl Terms {
    fn new(x: &Rounded, ty: BlockType) -> Self {
        let (group, offset) = groups(ty);
        let sums = x
            .sums16
            .chunks_exact(group / 16)
            .map(|s| s.iter().sum::<i32>());
        if offset == 0 {
            let sums = sums.map(|s| s as f32).collect();
            Terms {
                starts: Vec::new(),
                sums,
            }
        } else {
            let starts = sums.map(|s| -offset * s).collect();
            Terms {
                starts,
                sums: Vec::new(),
            }
        }
    }
}

/// A weight type's groups, as the kernel takes them: the inputs per scale (16 for Q6_K, 32
/// for the others) and the offset `c` of its unsigned codes (`scale * (code - c)`; 0 for
/// Q4_K, whose offsets are separate floats).
fn groups(ty: BlockType) -> (usize, i32) {
    match ty {
        BlockType::Q8_0 => (32, 128),
        BlockType::Q4_0 => (32, 8),
        BlockType::Q4K => (32, 0),
        BlockType::Q6K => (16, 32),
        other => unreachable!("no int8 kernel for {other}"),
    }
}

/// Where a tile's sums so far are (null: none yet, the first step) and where its new sums
/// go, each as its first row and the distance between rows: the same place, or the output
/// for the last step.
#[derive(Clone, Copy)]
struct Accumulate {
    from: (*const f32, usize),
    to: (*mut f32, usize),
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
    fn fill<'w>(&mut self, kernels: Kernels, ty: BlockType, steps: impl Iterator<Item = &'w [u8]>) {
        ROWS.with_borrow_mut(|codes| {
            self.scales.fill(0.0);
            self.offsets.fill(0.0);
            let half = |b: &[u8], i: usize| half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
            let mut rows = 0;
            for (j, step) in steps.enumerate() {
                rows = j + 1;
                let codes = &mut codes[j * QK..][..QK];
                // Past a short step's blocks (the end of a row not a multiple of 256).
                codes[step.len() / ty.bytes() * ty.values()..].fill(0);
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
                    avx2::codes(ty, step, codes)
                };
            }
            // Past the weight's last row.
            codes[rows * QK..].fill(0);
            match kernels {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                Kernels::Vnni => unsafe { avx512::transpose(codes, &mut self.codes) },
                _ => transpose_words(codes, &mut self.codes),
            }
        });
    }
}

/// NR rows of 256 codes (`rows[j * 256..]`) into `codes`, each four codes of a row beside
/// the same four of the other rows (what `avx512::transpose` does in registers).
fn transpose_words(rows: &[u8; QK * NR], codes: &mut [u8; QK * NR]) {
    for (k, words) in codes.chunks_exact_mut(4 * NR).enumerate() {
        for (j, word) in words.chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&rows[j * QK + 4 * k..][..4]);
        }
    }
}

/// Asks for `bytes` to be brought into the cache (L2): a hint, done when convenient.
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        // SAFETY: a prefetch only hints; it reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
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
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Accumulate, MR, NR, Packed, QK};
    use crate::simd::avx512::transpose as transpose16;

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
    /// integers; `starts` (if `C` is not 0) or `totals` (if it is) their groups' terms (see
    /// `Rounded`), each broadcast from memory by the instruction that uses it.
    ///
    /// # Safety
    /// AVX-512F, BW, VNNI and FMA present; `sums` as `Rounded::tile` says.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) unsafe fn tile<const G: usize, const C: i32, const PER_GROUP: bool>(
        packed: &Packed,
        x: &[i8],
        (starts, totals): (&[i32], &[f32]),
        d: &[f32],
        sums: Accumulate,
        (valid, n): (usize, usize),
    ) {
        let groups = QK / 4 / G;
        let scales = if PER_GROUP { groups } else { 1 };
        let terms = if C == 0 { totals.len() } else { starts.len() };
        assert!(x.len() >= MR * QK && terms >= MR * groups && d.len() >= MR * scales);
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
                        _mm512_set1_epi32(*starts.get_unchecked(r * groups + g))
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
                        let sum = _mm512_set1_ps(*totals.get_unchecked(r * groups + g));
                        block[r] = _mm512_fnmadd_ps(offset, sum, block[r]);
                    }
                }
            }
            let (from, to) = (sums.from, sums.to);
            for (r, block) in block.iter().enumerate().take(valid) {
                let acc = if from.0.is_null() {
                    _mm512_setzero_ps()
                } else {
                    _mm512_maskz_loadu_ps(mask, from.0.add(r * from.1))
                };
                let acc = if PER_GROUP {
                    _mm512_add_ps(acc, *block)
                } else {
                    _mm512_fmadd_ps(*block, _mm512_set1_ps(d[r]), acc)
                };
                _mm512_mask_storeu_ps(to.0.add(r * to.1), mask, acc);
            }
        }
    }
}
