//! How the model keeps each parameter in memory, decided from its f32 values as the record
//! stores them: every projection transposed to the matrix-vector kernel's layout, each
//! matrix bf16 or f32 as [`Weights`] says. One definition for the two ways a model is
//! loaded: from the record, laid out on every start (`load`), and from the weights file
//! the converter lays out once from the same record (`weights::file`): they cannot disagree.

use burn::tensor::{DType, TensorData, bf16};
use rayon::prelude::*;

use kernels::quant::BlockType;

/// How the loader keeps the matrices (projections and the embedding) in memory. The record
/// holds f32; a bf16 checkpoint's values are bf16 values widened, 16 low bits zero, and
/// kept as bf16 they take half the memory and half the bytes a decoded token reads, with
/// the same products (`kernels::stored::Stored`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Weights {
    /// bf16 for each matrix whose every value is one (exact), f32 for any other, so an
    /// f32-trained checkpoint is never rounded silently.
    #[default]
    Auto,
    /// bf16, rounding (to nearest even) any value that is not one.
    Bf16,
    /// f32, as stored.
    F32,
    /// Each projection quantized to these blocks as it loads (ggml's reference quantizer),
    /// where its inputs are a whole number of blocks; the embedding as [`Weights::Auto`]
    /// keeps it.
    Blocks(BlockType),
}

impl Weights {
    /// What `--weights` accepts, for errors and help.
    pub const NAMES: &str = "auto, bf16, f32, q8_0, q4_0, q4_k, q6_k";
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
            Self::Blocks(ty) => ty.lower_name(),
        })
    }
}

impl std::str::FromStr for Weights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "bf16" => Ok(Self::Bf16),
            "f32" => Ok(Self::F32),
            other => (BlockType::KEPT.into_iter())
                .find(|ty| ty.quantizes() && ty.lower_name() == other)
                .map(Self::Blocks)
                .ok_or_else(|| format!("{other:?} is not one of {}", Self::NAMES)),
        }
    }
}

/// What the loader kept each matrix as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kept {
    pub bf16: usize,
    pub f32: usize,
    /// Matrices rounded to bf16 (`Weights::Bf16` on values that are not all bf16).
    pub rounded: usize,
    /// Matrices kept as ggml blocks, and their bytes (the blocks' tensors say only how many
    /// values they hold).
    pub blocks: usize,
    pub block_bytes: usize,
    /// Whether the tensors used where they lie in the weights file are over its map, not
    /// in the process's own memory (`file::WeightsMemory`).
    pub mapped: bool,
}

impl Kept {
    /// Counts one parameter kept as `form` (vectors are not counted: they are always f32).
    pub fn count(&mut self, layout: &Layout, form: Form) {
        if !layout.matrix {
            return;
        }
        match form {
            Form::F32 => self.f32 += 1,
            Form::Bf16 => self.bf16 += 1,
            Form::RoundedBf16 => {
                self.bf16 += 1;
                self.rounded += 1;
            }
            Form::Blocks(_) => self.blocks += 1,
        }
    }
}

/// What one parameter's values are kept as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    F32,
    /// bf16, exactly the stored values (each f32's low 16 bits were zero).
    Bf16,
    /// bf16, rounded to nearest even from f32 values that are not all bf16.
    RoundedBf16,
    /// A projection as rows of ggml blocks (`u8` bytes, `[d_out, row bytes]`).
    Blocks(BlockType),
}

impl Form {
    pub fn dtype(self) -> DType {
        match self {
            Form::F32 => DType::F32,
            Form::Bf16 | Form::RoundedBf16 => DType::BF16,
            Form::Blocks(_) => DType::U8,
        }
    }
}

/// Where one parameter's values go, from its shape and the module type it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// A projection's `(d_in, d_out)`: `[d_in, d_out]` row-major in the record, kept as
    /// `[d_out, d_in]` row-major seen transposed, each output's weights contiguous, as the
    /// matrix-vector kernel reads them.
    pub linear: Option<(usize, usize)>,
    /// The shape of the values as laid out: `[d_out, d_in]` for a projection, the
    /// parameter's own otherwise.
    pub shape: Vec<usize>,
    /// A matrix (projection, embedding), which may be kept as bf16; vectors (norm weights,
    /// biases) are always f32.
    pub matrix: bool,
}

impl Layout {
    /// The layout of a parameter of `shape` that is a field of a module of type `owner`
    /// (`params::ParamInfo::owner`: `Linear`, `Embedding`, `RmsNorm`).
    pub fn of(owner: &str, shape: &[usize]) -> Self {
        let linear = match (owner, shape) {
            ("Linear", &[d_in, d_out]) => Some((d_in, d_out)),
            _ => None,
        };
        Self {
            linear,
            shape: linear.map_or(shape.to_vec(), |(d_in, d_out)| vec![d_out, d_in]),
            matrix: shape.len() == 2,
        }
    }

    /// `(values per row, rows)` of a matrix as laid out, each row one output's inputs (a
    /// projection's `(d_in, d_out)`) or one token's embedding (`(hidden, vocab)`): what may
    /// be kept as rows of ggml blocks.
    pub fn block_rows(&self) -> Option<(usize, usize)> {
        match self.shape.as_slice() {
            &[rows, per_row] if self.matrix => Some((per_row, rows)),
            _ => None,
        }
    }

    /// What `weights` keeps these values (little-endian f32 bytes) as.
    pub fn form(&self, f32_bytes: &[u8], weights: Weights) -> Form {
        if let Weights::Blocks(ty) = weights {
            return match self.linear {
                Some((d_in, _)) if ty.row_bytes(d_in).is_some() => Form::Blocks(ty),
                _ => self.form(f32_bytes, Weights::Auto),
            };
        }
        if !self.matrix || weights == Weights::F32 {
            Form::F32
        } else if all_bf16(f32_bytes) {
            Form::Bf16
        } else if weights == Weights::Bf16 {
            Form::RoundedBf16
        } else {
            Form::F32
        }
    }

    /// The values (little-endian f32 bytes, as the record stores them) laid out: transposed
    /// for a projection, as `form`'s element type.
    pub fn lay_out(&self, f32_bytes: &[u8], form: Form) -> TensorData {
        let shape = self.shape.clone();
        match form {
            Form::F32 => laid_out(f32_bytes, self.linear, shape, |v| v),
            // The high half of an f32 whose low half is zero is that value's bf16.
            Form::Bf16 => laid_out(f32_bytes, self.linear, shape, |v: f32| {
                bf16::from_bits((v.to_bits() >> 16) as u16)
            }),
            Form::RoundedBf16 => laid_out(f32_bytes, self.linear, shape, bf16::from_f32),
            Form::Blocks(ty) => {
                let (d_in, d_out) = self.linear.expect("only projections are kept as blocks");
                let rows = transposed(f32_bytes, d_in, d_out, |v| v);
                let blocks = quantized(&rows, d_in, ty);
                let row_bytes = blocks.len() / d_out.max(1);
                TensorData::new(blocks, [d_out, row_bytes])
            }
        }
    }
}

/// Rows of `d_in` f32 values quantized to `ty` blocks, row after row, in parallel.
pub fn quantized(rows: &[f32], d_in: usize, ty: BlockType) -> Vec<u8> {
    quantized_from(rows, d_in, ty, |v| v)
}

/// Rows of `d_in` values quantized to `ty` blocks, each row widened to f32 by `widen` into a
/// buffer of its thread's first: no f32 copy of the whole matrix (fresh pages to fault in).
pub fn quantized_from<E: Copy + Sync>(
    rows: &[E],
    d_in: usize,
    ty: BlockType,
    widen: impl Fn(E) -> f32 + Sync,
) -> Vec<u8> {
    let row_bytes = ty.row_bytes(d_in).expect("rows of whole blocks");
    let mut out = vec![0u8; rows.len() / d_in.max(1) * row_bytes];
    (out.par_chunks_mut(row_bytes).zip(rows.par_chunks(d_in))).for_each_init(
        || (vec![0.0f32; d_in], Vec::with_capacity(row_bytes)),
        |(values, blocks), (out, row)| {
            for (v, &e) in values.iter_mut().zip(row) {
                *v = widen(e);
            }
            blocks.clear();
            ty.quantize(values, blocks);
            out.copy_from_slice(blocks);
        },
    );
    out
}

/// bf16 values widened to f32 (exact), in parallel.
pub fn widened(values: &[bf16]) -> Vec<f32> {
    converted(values, bf16::to_f32)
}

/// f32 values as bf16, rounded to nearest even, in parallel: what [`Form::RoundedBf16`]
/// makes of them, or [`Form::Bf16`] if every one was a bf16 value (which rounding leaves
/// as it is), and which of the two it was.
pub fn narrowed(values: &[f32]) -> (Vec<bf16>, Form) {
    let narrow = converted(values, bf16::from_f32);
    let exact = (narrow.par_chunks(1 << 16).zip(values.par_chunks(1 << 16)))
        .all(|(narrow, values)| narrow.iter().zip(values).all(|(n, &v)| n.to_f32() == v));
    (narrow, if exact { Form::Bf16 } else { Form::RoundedBf16 })
}

fn converted<S: Copy + Sync, E: Copy + Default + Send>(
    values: &[S],
    convert: impl Fn(S) -> E + Sync,
) -> Vec<E> {
    let mut out = vec![E::default(); values.len()];
    out.par_chunks_mut(1 << 16)
        .zip(values.par_chunks(1 << 16))
        .for_each(|(out, values)| {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = convert(v);
            }
        });
    out
}

/// `bytes` (little-endian f32) through `convert`, transposed for a projection
/// (`linear: Some((d_in, d_out))`), as one tensor's data.
fn laid_out<E: Copy + Default + Send + burn::tensor::Element>(
    bytes: &[u8],
    linear: Option<(usize, usize)>,
    shape: Vec<usize>,
    convert: impl Fn(f32) -> E + Sync,
) -> TensorData {
    let values = match linear {
        Some((d_in, d_out)) => transposed(bytes, d_in, d_out, convert),
        None => floats(bytes, convert),
    };
    TensorData::new(values, shape)
}

/// Whether every little-endian f32 of `bytes` is a bf16 value (its low 16 bits zero).
fn all_bf16(bytes: &[u8]) -> bool {
    // Branch-free within a chunk (an OR of the low halves), so it vectorizes.
    bytes.par_chunks(4 << 16).all(|chunk| {
        let low = chunk
            .chunks_exact(4)
            .fold(0u16, |low, b| low | u16::from_le_bytes([b[0], b[1]]));
        low == 0
    })
}

/// Little-endian f32 `bytes` as values, each through `convert`.
fn floats<E: Copy + Default + Send>(bytes: &[u8], convert: impl Fn(f32) -> E + Sync) -> Vec<E> {
    let mut values = vec![E::default(); bytes.len() / 4];
    values
        .par_chunks_mut(1 << 16)
        .zip(bytes.par_chunks(4 << 16))
        .for_each(|(values, bytes)| {
            for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
                *v = convert(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        });
    values
}

/// Little-endian f32 `bytes` of a row-major `[rows, cols]` matrix as the values (through
/// `convert`) of its transpose, `[cols, rows]` row-major. Blocks of output rows in
/// parallel; within a block, tiles of source rows so the output lines written stay in cache.
fn transposed<E: Copy + Default + Send>(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    convert: impl Fn(f32) -> E + Sync,
) -> Vec<E> {
    const TILE: usize = 32;
    let mut out = vec![E::default(); rows * cols];
    if rows == 0 {
        return out;
    }
    out.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(block, out)| {
            let (first, n) = (block * TILE, out.len() / rows);
            for r0 in (0..rows).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    let source = &bytes[(r * cols + first) * 4..][..n * 4];
                    for (c, b) in source.chunks_exact(4).enumerate() {
                        out[c * rows + r] = convert(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    }
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `quantized`, which quantizes rows in parallel, makes the bytes `quantize` makes row
    /// after row, whatever the thread count (on the kernels' hard quantizer inputs).
    #[test]
    fn rows_quantized_in_parallel_equal_one_by_one() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../kernels/tests/data/quant/quantize.f32"
        );
        let bytes = std::fs::read(path).unwrap();
        let values: Vec<f32> = (bytes.chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let d_in = 64;
        for ty in [BlockType::Q8_0, BlockType::Q4_0] {
            let mut one_by_one = Vec::new();
            for row in values.chunks_exact(d_in) {
                ty.quantize(row, &mut one_by_one);
            }
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                let parallel = pool.unwrap().install(|| quantized(&values, d_in, ty));
                assert!(parallel == one_by_one, "{ty}, {threads} threads");
            }
        }
    }

    #[test]
    fn transposed_moves_every_element() {
        for (rows, cols) in [(37, 70), (64, 32), (1, 5), (5, 1)] {
            let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(floats(&bytes, |v| v), values);
            let t = transposed(&bytes, rows, cols, |v| v);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(t[c * rows + r], values[r * cols + c]);
                }
            }
        }
    }

    /// Each `Weights` on a matrix of bf16 values, one of other values, and a vector.
    #[test]
    fn forms_follow_the_weights_asked_for() {
        let bytes =
            |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let (exact, inexact) = (
            bytes(&[1.0, -0.5, 3.0, 0.25]),
            bytes(&[1.0, 0.1, 3.0, 0.25]),
        );
        let (matrix, vector) = (Layout::of("Linear", &[2, 2]), Layout::of("RmsNorm", &[4]));
        let cases = [
            (Weights::Auto, [Form::Bf16, Form::F32, Form::F32]),
            (Weights::Bf16, [Form::Bf16, Form::RoundedBf16, Form::F32]),
            (Weights::F32, [Form::F32, Form::F32, Form::F32]),
        ];
        for (weights, forms) in cases {
            let found = [
                matrix.form(&exact, weights),
                matrix.form(&inexact, weights),
                vector.form(&exact, weights),
            ];
            assert_eq!(found, forms, "{weights}");
        }
        assert_eq!(matrix.shape, [2, 2]);
        assert_eq!(Layout::of("Linear", &[3, 5]).shape, [5, 3]);
        assert_eq!(Layout::of("Embedding", &[3, 5]).linear, None);
        // Rounding is bf16's own, and widening undoes an exact narrowing.
        let laid = matrix.lay_out(&inexact, Form::RoundedBf16);
        let values = laid.into_vec::<bf16>().unwrap();
        let (narrow, form) = narrowed(&[1.0, 3.0, 0.1, 0.25]);
        assert_eq!((values, Form::RoundedBf16), (narrow, form));
        let laid = matrix
            .lay_out(&exact, Form::Bf16)
            .into_vec::<bf16>()
            .unwrap();
        assert_eq!(widened(&laid), [1.0, 3.0, -0.5, 0.25]);
        assert_eq!(narrowed(&[1.0, 3.0, -0.5, 0.25]), (laid, Form::Bf16));
    }
}
