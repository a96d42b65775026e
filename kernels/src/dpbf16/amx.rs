//! [`super::linear_rows`] on AMX's tiles (the `amx` tier): a `tdpbf16ps` multiplies a tile
//! of sixteen prompt rows' 32 rounded inputs by a tile of sixteen weight rows' 32 values
//! (the panel's layout, pairs interleaved: sixteen of its entries are one tile) into
//! sixteen by sixteen f32 sums, 8192 multiply-adds an instruction where `vdpbf16ps` does
//! 32. The same products of the same rounded inputs as the `vdpbf16ps` kernel, summed in
//! the tile unit's order: a row's result depends only on that row and the weight.
//!
//! The tile products are one block of inline assembly (see [`crate::amx`]): a whole sum
//! and its stores.

use std::arch::asm;
use std::ops::Range;

use half::bf16;
use rayon::prelude::*;

use super::{NR, Panel, round_rows};
use crate::amx::Tiles;
use crate::team::OutPtr;

/// Rows of a tile (prompt rows, or pairs of inputs), and inputs per tile product.
const TILE_ROWS: usize = 16;
const STEP: usize = 32;
/// Weight rows (output columns) per task: eight panels, 64 KiB each at 2048 inputs, kept
/// in L2 while every prompt row passes over them (the prompt's rows, read once per task
/// from L3, are what a smaller group would read more often).
const GROUP: usize = 8 * NR;

/// Whether [`super::linear_rows`] runs here.
pub(super) fn runs() -> bool {
    super::runs() && crate::amx::runs()
}

/// See [`super::linear_rows`]; `x` and `weight` whole rows of `d_in`, neither empty.
pub(super) fn linear_rows(x: &[f32], weight: &[bf16], d_in: usize) -> Vec<f32> {
    assert!(runs(), "no AMX tiles here");
    let (rows, d_out) = (x.len() / d_in, weight.len() / d_in);
    // Rows padded with zeros to pairs of tiles, and each to whole steps; a row of a
    // multiple of 1 KiB one step longer, so that a tile's sixteen rows do not share the
    // L1 sets that addresses 4 KiB apart share.
    let padded = rows.next_multiple_of(2 * TILE_ROWS);
    let mut width = d_in.next_multiple_of(STEP);
    if (width * 2).is_multiple_of(1024) {
        width += STEP;
    }
    let rounded = round_rows(x, d_in, padded, width);
    let steps = d_in.div_ceil(STEP);
    let mut out = vec![0.0f32; rows * d_out];
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..d_out.div_ceil(GROUP))
        .into_par_iter()
        .for_each(|group| {
            let columns = group * GROUP..((group + 1) * GROUP).min(d_out);
            let panels = Panel::all(weight, d_in, columns, steps * STEP / 2);
            // Sums in tiles 0-3, the prompt's rows in 4-5, the panels' in 6-7.
            let _tiles = Tiles::configure([(TILE_ROWS as u8, 64); 8]);
            for block in (0..rows).step_by(2 * TILE_ROWS) {
                let a = rounded[block * width..].as_ptr();
                for pair in panels.chunks(2) {
                    // A lone last panel is paired with itself, its copy's sums dropped.
                    let (first, second) = (&pair[0], pair.last().expect("a panel"));
                    let b = [first.pairs.as_ptr(), second.pairs.as_ptr()].map(|p| p.cast());
                    let sums = Sums {
                        rows: block..rows.min(block + 2 * TILE_ROWS),
                        columns: [first.columns.clone(), second.columns.clone()],
                        single: pair.len() == 1,
                    };
                    // SAFETY: the tier is AMX and `_tiles` configured this thread's tiles;
                    // `a` holds two tiles of rows of `width` (the buffer is padded to
                    // them), each panel `steps` steps; the sums' rows of its columns of
                    // `out` belong to this task alone.
                    unsafe { sums.compute(a, width, b, steps, out_ptr, d_out) };
                }
            }
        });
    out
}

/// Where one call's four tiles of sums go: rows `rows` (two tiles' worth at most) of the
/// two panels' columns.
struct Sums {
    rows: Range<usize>,
    columns: [Range<usize>; 2],
    /// The second panel is the first again: its sums are not stored.
    single: bool,
}

impl Sums {
    /// Rows `a..` (two tiles, `width` bf16 values apart) times the panels `b` (`steps`
    /// tiles each), stored into `out` (rows of `d_out`): straight from the tiles when the
    /// four are whole, else through a buffer.
    ///
    /// # Safety
    /// As at the call in `linear_rows`.
    unsafe fn compute(
        &self,
        a: *const bf16,
        width: usize,
        b: [*const u8; 2],
        steps: usize,
        out: OutPtr,
        d_out: usize,
    ) {
        let whole = self.rows.len() == 2 * TILE_ROWS
            && !self.single
            && self.columns.iter().all(|c| c.len() == NR);
        if whole {
            let at =
                |r: usize, p: usize| out.at((self.rows.start + r) * d_out + self.columns[p].start);
            let c = [at(0, 0), at(0, 1), at(TILE_ROWS, 0), at(TILE_ROWS, 1)];
            // SAFETY: the caller's promise; the four tiles lie in `out`'s rows.
            unsafe { products(a, width * 2, b, steps, c, d_out * 4) };
            return;
        }
        let mut buffer = [[0.0f32; TILE_ROWS * NR]; 4];
        let c = [0, 1, 2, 3].map(|t| buffer[t].as_mut_ptr());
        // SAFETY: the caller's promise; each buffer holds a tile.
        unsafe { products(a, width * 2, b, steps, c, NR * 4) };
        let panels = if self.single { 1 } else { 2 };
        for (r, row) in self.rows.clone().enumerate() {
            for (p, columns) in self.columns.iter().enumerate().take(panels) {
                let tile = &buffer[(r / TILE_ROWS) * 2 + p][(r % TILE_ROWS) * NR..];
                let to = out.at(row * d_out + columns.start);
                // SAFETY: the row's columns in `out`, this task's alone.
                unsafe { std::ptr::copy_nonoverlapping(tile.as_ptr(), to, columns.len()) };
            }
        }
    }
}

/// Two tiles of prompt rows (`a`, rows `a_stride` bytes apart, the second tile sixteen
/// rows on) times two panels (`b`, 1 KiB a step), over `steps` steps of 32 inputs: four
/// tiles of sums, stored at `c` (rows of tile 0 and 1 are panels 0 and 1 of the first
/// sixteen prompt rows, tiles 2 and 3 of the next), rows `c_stride` bytes apart.
///
/// # Safety
/// The AMX tier, tiles configured as `linear_rows` does; `steps` ≥ 1; the reads and
/// writes described lie in memory this call may use.
unsafe fn products(
    a: *const bf16,
    a_stride: usize,
    b: [*const u8; 2],
    steps: usize,
    c: [*mut f32; 4],
    c_stride: usize,
) {
    assert!(steps >= 1);
    // SAFETY: the caller's promises. Tiles 0-3 sum, 4-5 hold the prompt's, 6-7 the
    // panels'.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a0} + {sa}*1]",
            "tileloadd tmm6, [{b0} + {sb}*1]",
            "tileloadd tmm7, [{b1} + {sb}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a1} + {sa}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a0}, 64",
            "add {a1}, 64",
            "add {b0}, 1024",
            "add {b1}, 1024",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c1} + {sc}*1], tmm1",
            "tilestored [{c2} + {sc}*1], tmm2",
            "tilestored [{c3} + {sc}*1], tmm3",
            a0 = inout(reg) a => _,
            a1 = inout(reg) a.byte_add(TILE_ROWS * a_stride) => _,
            sa = in(reg) a_stride,
            b0 = inout(reg) b[0] => _,
            b1 = inout(reg) b[1] => _,
            sb = in(reg) 64usize,
            steps = inout(reg) steps => _,
            c0 = in(reg) c[0],
            c1 = in(reg) c[1],
            c2 = in(reg) c[2],
            c3 = in(reg) c[3],
            sc = in(reg) c_stride,
            out("tmm0") _,
            out("tmm1") _,
            out("tmm2") _,
            out("tmm3") _,
            out("tmm4") _,
            out("tmm5") _,
            out("tmm6") _,
            out("tmm7") _,
            options(nostack),
        );
    }
}
