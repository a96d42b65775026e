//! model.mpk read in place: Burn's `NamedMpkFileRecorder` format (MessagePack, structs as
//! maps keyed by field name, each parameter `{id, param: {bytes, shape, dtype}}`), walked
//! over a memory map so a tensor's bytes are read once, straight into the layout the model
//! keeps them in, with no buffer of the whole file and no second copy.
//!
//! Why not Burn's loader: it reads the whole file into memory, decodes every tensor into
//! another buffer, and the model then re-lays each weight out for the matrix-vector kernel;
//! for a 6 GB record that is three passes and twice its size in memory.

use std::ops::Range;
use std::path::Path;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorCreationOptions, TensorData, TensorPrimitive, bf16};
use memmap2::Mmap;
use rayon::prelude::*;

use crate::backend::KernelBackend;
use crate::files::open_regular;
use crate::model::Llama;

/// Deepest nesting a record has is 8 (`item.layers[i].self_attn.q_proj.weight.param.shape`);
/// anything far deeper is corrupt, and is refused before it can exhaust the stack.
const MAX_DEPTH: usize = 32;

/// The format, written by the converter through Burn 0.21's recorder.
const FORMAT: &str = "burn_core::record::file::NamedMpkFileRecorder<burn_core::record::settings::FullPrecisionSettings>";

/// A MessagePack value of the record, with binary payloads as byte ranges of the file.
#[derive(Debug)]
enum Node {
    Map(Vec<(String, Node)>),
    Array(Vec<Node>),
    Bin(Range<usize>),
    Str(String),
    Uint(u64),
    /// Anything else (nil, booleans, signed integers, floats): no parameter field is one.
    Other,
}

/// An open record: the file mapped, its structure parsed.
pub struct Record {
    map: Mmap,
    item: Node,
}

/// One parameter as stored: its Burn id, shape, and little-endian f32 bytes.
pub struct StoredParam<'a> {
    pub id: &'a str,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
    range: Range<usize>,
}

impl Record {
    /// Maps `path` and parses its structure (not its tensors' values).
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = open_regular(path).map_err(|e| e.to_string())?;
        // SAFETY: read-only private mapping; the artifact is not written while it is read
        // (the converter writes a staging directory and renames it into place).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("cannot map it: {e}"))?;
        let mut reader = Reader { bytes: &map, at: 0 };
        let root = reader.node(0)?;
        if reader.at != map.len() {
            return Err(format!("{} bytes follow the record", map.len() - reader.at));
        }
        let Node::Map(fields) = root else {
            return Err("the record is not a map".into());
        };
        let mut metadata = None;
        let mut item = None;
        for (key, value) in fields {
            match key.as_str() {
                "metadata" => metadata = Some(value),
                "item" => item = Some(value),
                _ => {}
            }
        }
        let format = metadata.as_ref().and_then(|m| m.get("format"));
        match format {
            Some(Node::Str(format)) if format == FORMAT => {}
            Some(Node::Str(other)) => return Err(format!("unsupported record format {other}")),
            _ => return Err("the record has no metadata.format".into()),
        }
        let item = item.ok_or("the record has no item")?;
        Ok(Self { map, item })
    }

    /// The parameter at record field path `path` (`layers.0.self_attn.q_proj.weight`).
    pub fn param(&self, path: &str) -> Result<StoredParam<'_>, String> {
        let mut node = &self.item;
        for segment in path.split('.') {
            node = match node {
                Node::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
                _ => node.get(segment),
            }
            .ok_or_else(|| format!("{path} is missing"))?;
        }
        let field = |name: &str| {
            node.get(name)
                .or_else(|| node.get("param").and_then(|p| p.get(name)))
                .ok_or_else(|| format!("{path} has no {name}"))
        };
        let (Node::Str(id), Node::Bin(range), Node::Array(dims), Node::Str(dtype)) = (
            field("id")?,
            field("bytes")?,
            field("shape")?,
            field("dtype")?,
        ) else {
            return Err(format!("{path} is not a stored tensor"));
        };
        if dtype != "F32" {
            return Err(format!("{path} is {dtype}, not F32"));
        }
        let shape = dims
            .iter()
            .map(|d| match d {
                Node::Uint(d) => usize::try_from(*d).ok(),
                _ => None,
            })
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| format!("{path} has a malformed shape"))?;
        let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if elements.and_then(|n| n.checked_mul(4)) != Some(range.len()) {
            return Err(format!(
                "{path} holds {} bytes, its shape {shape:?} needs 4 per element",
                range.len()
            ));
        }
        Ok(StoredParam {
            id,
            shape,
            bytes: &self.map[range.clone()],
            range: range.clone(),
        })
    }

    /// Drops the pages of `param` from this process's memory once its values are copied
    /// (mapped pages count in its RSS): a load holds the model once, not twice.
    pub fn release(&self, param: &StoredParam<'_>) {
        // SAFETY: a read-only private file mapping: dropped pages are read back from the
        // file if touched again, so no reference sees a change.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                param.range.start,
                param.range.len(),
            )
        };
    }
}

impl Node {
    fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// A bounds-checked MessagePack reader over the mapped file.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<Range<usize>, String> {
        let end = (self.at.checked_add(n))
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| format!("truncated: {n} bytes needed at offset {}", self.at))?;
        let range = self.at..end;
        self.at = end;
        Ok(range)
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        let range = self.take(n)?;
        Ok(self.bytes[range]
            .iter()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b)))
    }

    /// A collection's length, checked against what is left of the file (every element takes
    /// at least one byte) before anything is allocated for it.
    fn count(&mut self, n: usize, per_element: usize) -> Result<usize, String> {
        let count = self.uint(n)? as usize;
        self.check_count(count, per_element)
    }

    fn check_count(&self, count: usize, per_element: usize) -> Result<usize, String> {
        let left = self.bytes.len() - self.at;
        if count.saturating_mul(per_element) > left {
            return Err(format!(
                "a collection of {count} claims more than the {left} bytes left at offset {}",
                self.at
            ));
        }
        Ok(count)
    }

    fn node(&mut self, depth: usize) -> Result<Node, String> {
        if depth > MAX_DEPTH {
            return Err(format!(
                "nested deeper than {MAX_DEPTH} at offset {}",
                self.at
            ));
        }
        let marker = self.bytes[self.take(1)?][0];
        Ok(match marker {
            0x00..=0x7f => Node::Uint(marker.into()),
            0x80..=0x8f => self.map((marker & 0x0f).into(), depth)?,
            0x90..=0x9f => self.array((marker & 0x0f).into(), depth)?,
            0xa0..=0xbf => self.str((marker & 0x1f).into())?,
            0xc4..=0xc6 => {
                let len = self.uint(1 << (marker - 0xc4))? as usize;
                Node::Bin(self.take(len)?)
            }
            0xcc..=0xcf => Node::Uint(self.uint(1 << (marker - 0xcc))?),
            0xd9..=0xdb => {
                let len = self.uint(1 << (marker - 0xd9))? as usize;
                self.str(len)?
            }
            0xdc | 0xdd => {
                let n = self.count(if marker == 0xdc { 2 } else { 4 }, 1)?;
                self.array(n, depth)?
            }
            0xde | 0xdf => {
                let n = self.count(if marker == 0xde { 2 } else { 4 }, 2)?;
                self.map(n, depth)?
            }
            0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => Node::Other,
            0xca => self.skip(4)?,
            0xcb => self.skip(8)?,
            0xd0..=0xd3 => self.skip(1 << (marker - 0xd0))?,
            other => return Err(format!("unexpected MessagePack marker {other:#04x}")),
        })
    }

    fn skip(&mut self, n: usize) -> Result<Node, String> {
        self.take(n)?;
        Ok(Node::Other)
    }

    fn str(&mut self, len: usize) -> Result<Node, String> {
        let range = self.take(len)?;
        let text = std::str::from_utf8(&self.bytes[range]).map_err(|e| e.to_string())?;
        Ok(Node::Str(text.to_string()))
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Node, String> {
        let n = self.check_count(n, 1)?;
        (0..n)
            .map(|_| self.node(depth + 1))
            .collect::<Result<_, _>>()
            .map(Node::Array)
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Node, String> {
        let n = self.check_count(n, 2)?;
        let mut fields = Vec::with_capacity(n);
        for _ in 0..n {
            let Node::Str(key) = self.node(depth + 1)? else {
                return Err(format!(
                    "a map key that is not a string at offset {}",
                    self.at
                ));
            };
            fields.push((key, self.node(depth + 1)?));
        }
        Ok(Node::Map(fields))
    }
}

/// How the loader keeps the matrices (projections and the embedding) in memory. The record
/// holds f32; a bf16 checkpoint's values are bf16 values widened, 16 low bits zero, and
/// kept as bf16 they take half the memory and half the bytes a decoded token reads, with
/// the same products (`kernels::simd::Weight`).
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
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
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
            other => Err(format!("{other:?} is not one of auto, bf16, f32")),
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
}

/// Fills `model` (built by `LlamaConfig::init`, nothing allocated) from `record`, each
/// parameter copied once from the map into the layout the model keeps it in: every
/// projection column-major (what `Llama::with_matvec_layout` makes), matrices as `weights`
/// says where the backend computes on bf16 (f32 where it does not), and with `tied`
/// embeddings lm_head a view of the embedding, its stored copy not read.
pub fn load_into<B: KernelBackend>(
    record: &Record,
    model: Llama<B>,
    tied: bool,
    weights: Weights,
    device: &B::Device,
) -> Result<(Llama<B>, Kept), String> {
    let weights = if B::BF16_WEIGHTS {
        weights
    } else {
        Weights::F32
    };
    let mut loader = Loader {
        record,
        tied,
        weights,
        kept: Kept::default(),
        device: device.clone(),
        path: Vec::new(),
        embedding: None,
        error: None,
    };
    let model = model.map(&mut loader);
    match loader.error {
        Some(error) => Err(error),
        None => Ok((model, loader.kept)),
    }
}

struct Loader<'a, B: Backend> {
    record: &'a Record,
    tied: bool,
    weights: Weights,
    kept: Kept,
    device: B::Device,
    /// Field names entered so far, with the type of the module each is a field of.
    path: Vec<(String, String)>,
    /// The embedding, `[vocab, hidden]`, for a tied lm_head.
    embedding: Option<TensorPrimitive<B>>,
    /// `ModuleMapper` can't return errors: the first one is kept here.
    error: Option<String>,
}

impl<B: Backend> Loader<'_, B> {
    fn tensor<const D: usize>(
        &mut self,
        path: &str,
        owner: &str,
        expected: &[usize],
    ) -> Result<(ParamId, Tensor<B, D>), String> {
        let stored = self.record.param(path)?;
        if stored.shape != expected {
            return Err(format!(
                "{path} has shape {:?}, config.json implies {expected:?}",
                stored.shape
            ));
        }
        let id = ParamId::try_deserialize(stored.id)
            .ok_or_else(|| format!("{path} has a corrupt parameter id"))?;
        if self.tied && path == "lm_head.weight" {
            let embedding = (self.embedding.clone()).ok_or("lm_head comes before the embedding")?;
            let view = Tensor::<B, 2>::from_primitive(embedding).transpose();
            return Ok((id, Tensor::from_primitive(view.into_primitive())));
        }
        let exact = expected.len() == 2 && self.weights != Weights::F32 && all_bf16(stored.bytes);
        let as_bf16 = exact || (expected.len() == 2 && self.weights == Weights::Bf16);
        self.kept.rounded += usize::from(as_bf16 && !exact);
        if expected.len() == 2 {
            if as_bf16 {
                self.kept.bf16 += 1;
            } else {
                self.kept.f32 += 1;
            }
        }
        // A projection, `[d_in, d_out]` stored row-major, is kept as `[d_out, d_in]`
        // row-major seen transposed: each output's weights contiguous, as the matrix-vector
        // kernel reads them.
        let linear = match (owner, expected) {
            ("Linear", &[d_in, d_out]) => Some((d_in, d_out)),
            _ => None,
        };
        let shape = linear.map_or(expected.to_vec(), |(d_in, d_out)| vec![d_out, d_in]);
        let bytes = stored.bytes;
        let (data, dtype) = match (as_bf16, exact) {
            (false, _) => (laid_out(bytes, linear, shape, |v| v), DType::F32),
            // The high half of an f32 whose low half is zero is that value's bf16.
            (true, true) => {
                let narrow = |v: f32| bf16::from_bits((v.to_bits() >> 16) as u16);
                (laid_out(bytes, linear, shape, narrow), DType::BF16)
            }
            (true, false) => (laid_out(bytes, linear, shape, bf16::from_f32), DType::BF16),
        };
        let tensor = self.tensor_of::<D>(data, dtype);
        let tensor = if linear.is_some() {
            tensor.transpose()
        } else {
            tensor
        };
        self.record.release(&stored);
        if path == "embed_tokens.weight" {
            self.embedding = Some(tensor.clone().into_primitive());
        }
        Ok((id, tensor))
    }

    fn tensor_of<const D: usize>(&self, data: TensorData, dtype: DType) -> Tensor<B, D> {
        let options = TensorCreationOptions::new(self.device.clone()).with_dtype(dtype);
        Tensor::from_data(data, options)
    }
}

impl<B: Backend> ModuleMapper<B> for Loader<'_, B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        let owner = container_type.rsplit(':').next().unwrap_or(container_type);
        self.path.push((name.to_string(), owner.to_string()));
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let path = (self.path.iter().map(|(name, _)| name.as_str()))
            .collect::<Vec<_>>()
            .join(".");
        let owner = (self.path.last())
            .map(|(_, owner)| owner.clone())
            .unwrap_or_default();
        let expected = param.lazy_shape().to_vec();
        match self.tensor::<D>(&path, &owner, &expected) {
            Ok((id, tensor)) => Param::initialized(id, tensor),
            Err(error) => {
                self.error = Some(error);
                param
            }
        }
    }
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
}
