//! A Hugging Face checkpoint directory: config.json, tokenizer files and safetensors weights,
//! in one `model.safetensors` or in shards listed by `model.safetensors.index.json`.
//!
//! Files are memory-mapped and headers validated at open (the safetensors crate checks that
//! offsets are in range, contiguous and agree with dtype × shape); tensor data is decoded
//! only when asked for, one tensor at a time.
//!
//! Or a GGUF's tensors, as the model.safetensors `import-gguf` writes would hold them
//! (`Checkpoint::of_gguf`), each dequantized when asked for: `convert` of a GGUF in one step.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use runtime::util::files::read_text_bounded;
use runtime::weights::manifest::is_plain_file_name;

use runtime::util::files::MappedFile;

use crate::finite;
use crate::import::Imported;
use crate::names::Transform;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Largest shard index we read (a 405B model's is a few hundred KB).
const INDEX_LIMIT: u64 = 16 << 20;

/// Shape, dtype and location of one tensor.
#[derive(Debug, Clone)]
pub struct TensorMeta {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    shard: usize,
    /// Absolute byte range in the shard.
    start: usize,
    end: usize,
}

/// The weights of a checkpoint, by Hugging Face tensor name.
pub struct Checkpoint {
    store: Store,
    /// File names (within the checkpoint dir) of everything read: index and shards.
    pub files: Vec<String>,
    pub tensors: BTreeMap<String, TensorMeta>,
}

/// Where a checkpoint's tensors are.
enum Store {
    /// Safetensors files, by [`TensorMeta::shard`].
    Shards(Vec<MappedFile>),
    /// The checkpoint `import-gguf` would write of a GGUF, never written: each tensor
    /// (its index in [`Imported::tensors`] as its shard) made when read.
    Gguf(Box<Imported>),
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let (index_files, shard_names, weight_map) = if index_path.exists() {
            let text = read_text_bounded(&index_path, INDEX_LIMIT)?;
            let index: ShardIndex = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a valid shard index", index_path.display()))?;
            let mut shards: Vec<String> = index.weight_map.values().cloned().collect();
            shards.sort();
            shards.dedup();
            for shard in &shards {
                if !is_plain_file_name(shard) {
                    bail!(
                        "{}: shard name {shard:?} is not a plain file name",
                        index_path.display()
                    );
                }
            }
            (vec![INDEX_FILE.to_string()], shards, Some(index.weight_map))
        } else if dir.join(SINGLE_FILE).exists() {
            (vec![], vec![SINGLE_FILE.to_string()], None)
        } else {
            bail!("{}: no {SINGLE_FILE} or {INDEX_FILE}", dir.display());
        };

        let mut shards = Vec::new();
        let mut tensors = BTreeMap::new();
        for (shard, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            let file = MappedFile::open(&path)?;
            let header = read_header(file.bytes(), shard).map_err(|e| {
                anyhow::anyhow!("{}: invalid safetensors file: {e}", path.display())
            })?;
            for (tensor, meta) in header {
                if tensors.insert(tensor.clone(), meta).is_some() {
                    bail!("tensor {tensor} appears in more than one shard");
                }
            }
            shards.push(file);
        }
        if let Some(weight_map) = weight_map {
            for (tensor, shard) in &weight_map {
                let found = tensors.get(tensor).map(|m| shard_names[m.shard].as_str());
                if found != Some(shard.as_str()) {
                    bail!("{INDEX_FILE} puts tensor {tensor} in {shard}, but it is not there");
                }
            }
        }
        let files = index_files.into_iter().chain(shard_names).collect();
        Ok(Self {
            store: Store::Shards(shards),
            files,
            tensors,
        })
    }

    /// The checkpoint `import-gguf` would write of `gguf` (its model.safetensors: the
    /// blocks beside it are `BlocksFile::of_gguf`'s), read without writing it.
    pub fn of_gguf(gguf: Imported) -> Self {
        let tensors = (gguf.tensors().iter().enumerate())
            .map(|(index, tensor)| {
                let meta = TensorMeta {
                    dtype: tensor.dtype,
                    shape: tensor.shape.clone(),
                    shard: index,
                    start: 0,
                    end: tensor.bytes(),
                };
                (tensor.hf_name.clone(), meta)
            })
            .collect();
        Self {
            store: Store::Gguf(Box::new(gguf)),
            files: vec![SINGLE_FILE.to_string()],
            tensors,
        }
    }

    /// The GGUF this checkpoint is read from, if it is one.
    pub fn gguf(&self) -> Option<&Imported> {
        match &self.store {
            Store::Gguf(gguf) => Some(gguf),
            Store::Shards(_) => None,
        }
    }

    /// Names every tensor `prefix` + its name when none has the prefix: a base model saved
    /// on its own (transformers' `LlamaModel`, a sentence-transformers checkpoint) names its
    /// tensors `layers.0...`, where a `LlamaForCausalLM` has `model.layers.0...`.
    pub fn add_missing_prefix(&mut self, prefix: &str) {
        if self.tensors.keys().any(|name| name.starts_with(prefix)) {
            return;
        }
        let tensors = std::mem::take(&mut self.tensors);
        self.tensors = (tensors.into_iter())
            .map(|(name, meta)| (format!("{prefix}{name}"), meta))
            .collect();
    }

    /// Writes tensor `name`'s values into `out` as little-endian f32 (bf16 and f16 widen
    /// exactly), through `transform` (a `[rows, cols]` matrix transposed to `[cols, rows]`,
    /// or 1 added to each value); with `rows`, only those rows of a matrix (a block of a
    /// fused projection).
    ///
    /// A block at a time: memory holds a few MB of output and the tensor's mapped pages,
    /// which are dropped when it is done, not a tensor's worth of f32 (an embedding of
    /// 128k × 2048 is a GB, its transposed copy for lm_head another).
    pub fn write_f32(
        &self,
        name: &str,
        rows: Option<Range<usize>>,
        transform: Transform,
        out: &mut impl Write,
    ) -> Result<()> {
        let meta = self
            .tensors
            .get(name)
            .with_context(|| format!("tensor {name} is missing"))?;
        let meta = match rows {
            Some(rows) => &meta.rows(name, rows)?,
            None => meta,
        };
        match &self.store {
            Store::Shards(shards) => {
                let shard = &shards[meta.shard];
                write_tensor(name, meta, shard.bytes(), transform, BLOCK, out)?;
                shard.release(meta.start..meta.end);
            }
            Store::Gguf(gguf) => {
                // The whole tensor, as model.safetensors would hold it (`meta` its range).
                let values = gguf.values(&gguf.tensors()[meta.shard])?;
                write_tensor(name, meta, values.bytes(), transform, BLOCK, out)?;
            }
        }
        Ok(())
    }
}

impl TensorMeta {
    /// Rows `rows` of this matrix, which are contiguous in the file.
    pub fn rows(&self, name: &str, rows: Range<usize>) -> Result<Self> {
        let &[all, cols] = self.shape.as_slice() else {
            bail!("tensor {name} is not a matrix: shape {:?}", self.shape);
        };
        ensure!(
            rows.start <= rows.end && rows.end <= all,
            "tensor {name} has {all} rows, not {rows:?}"
        );
        let row_bytes = cols * dtype_width(name, self.dtype)?;
        Ok(Self {
            dtype: self.dtype,
            shape: vec![rows.len(), cols],
            shard: self.shard,
            start: self.start + rows.start * row_bytes,
            end: self.start + rows.end * row_bytes,
        })
    }
}

/// [`Checkpoint::write_f32`] for tensor `name` (found by [`read_header`] in `shard_bytes`),
/// `block` output elements at a time.
pub fn write_tensor(
    name: &str,
    meta: &TensorMeta,
    shard_bytes: &[u8],
    transform: Transform,
    block: usize,
    out: &mut impl Write,
) -> Result<()> {
    let bytes = &shard_bytes[meta.start..meta.end];
    let transpose = transform == Transform::Transpose;
    let width = dtype_width(name, meta.dtype)?;
    let mut values = Vec::with_capacity(block);
    let mut encoded = Vec::with_capacity(block * 4);
    let mut emit = |values: &[f32]| {
        encoded.clear();
        encoded.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        out.write_all(&encoded)
    };
    // Each value is checked finite as it is read, named by its place in the source tensor.
    let row_len = meta.shape.last().copied().unwrap_or(1);
    let check = |values: &[f32], first: usize| {
        finite::check_values(values, first, row_len).with_context(|| format!("tensor {name}"))
    };
    if !transpose {
        for (i, chunk) in bytes.chunks(block * width).enumerate() {
            values.clear();
            decode_into(meta.dtype, chunk, &mut values);
            check(&values, i * block)?;
            if transform == Transform::AddOne {
                // As transformers' `1.0 + weight.float()`: the sum of the f32 values.
                values.iter_mut().for_each(|v| *v += 1.0);
            }
            emit(&values)?;
        }
        return Ok(());
    }
    let &[rows, cols] = meta.shape.as_slice() else {
        bail!("tensor {name} is not a matrix: shape {:?}", meta.shape);
    };
    // Output rows `first..first + n` are source columns: gathered from every source row,
    // `n` contiguous elements of each.
    let n_per_block = (block / rows.max(1)).clamp(1, cols.max(1));
    let mut row = Vec::with_capacity(n_per_block);
    for first in (0..cols).step_by(n_per_block) {
        let n = n_per_block.min(cols - first);
        values.clear();
        values.resize(n * rows, 0.0);
        for r in 0..rows {
            let at = (r * cols + first) * width;
            row.clear();
            decode_into(meta.dtype, &bytes[at..at + n * width], &mut row);
            check(&row, r * cols + first)?;
            for (c, &v) in row.iter().enumerate() {
                values[c * rows + r] = v;
            }
        }
        emit(&values)?;
    }
    Ok(())
}

/// Output elements per write in [`Checkpoint::write_f32`] (16 MB of f32).
const BLOCK: usize = 1 << 22;

/// Bytes per element of the dtypes the converter reads.
fn dtype_width(name: &str, dtype: Dtype) -> Result<usize> {
    Ok(match dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => {
            bail!("tensor {name} has unsupported dtype {other:?} (supported: F32, BF16, F16)")
        }
    })
}

/// Appends the elements of `bytes` (of a dtype [`dtype_width`] accepts) to `out` as f32.
fn decode_into(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
    match dtype {
        Dtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        Dtype::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        Dtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        _ => unreachable!("dtype_width accepts only F32, BF16 and F16"),
    }
}

/// The tensors of one safetensors file `bytes` (shard number `shard`), with absolute byte
/// ranges. The safetensors crate checks the header against the file: its length, the JSON,
/// and that offsets are contiguous, in range and agree with dtype × shape.
pub fn read_header(
    bytes: &[u8],
    shard: usize,
) -> Result<Vec<(String, TensorMeta)>, safetensors::SafeTensorError> {
    let (header_len, metadata) = SafeTensors::read_metadata(bytes)?;
    let data_start = 8 + header_len;
    Ok(metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let meta = TensorMeta {
                dtype: info.dtype,
                shape: info.shape.clone(),
                shard,
                start: data_start + info.data_offsets.0,
                end: data_start + info.data_offsets.1,
            };
            (name, meta)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element lands where a transpose puts it, for each dtype, with blocks of one
    /// column, several and all; as stored, the bytes are the values in order.
    #[test]
    fn writes_values_as_stored_and_transposed() {
        let (rows, cols) = (37, 70);
        // Small integers: exact in every dtype, and no two neighbours equal.
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7) % 251) as f32 - 125.0)
            .collect();
        for (dtype, bytes) in [
            (
                Dtype::F32,
                values
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
            (
                Dtype::BF16,
                values
                    .iter()
                    .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
            (
                Dtype::F16,
                values
                    .iter()
                    .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
        ] {
            let meta = TensorMeta {
                dtype,
                shape: vec![rows, cols],
                shard: 0,
                start: 0,
                end: bytes.len(),
            };
            let written = |transpose, block| {
                let mut out = Vec::new();
                let transform = match transpose {
                    true => Transform::Transpose,
                    false => Transform::Keep,
                };
                write_tensor("t", &meta, &bytes, transform, block, &mut out).unwrap();
                let floats: Vec<f32> = out
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                floats
            };
            for block in [1, 100, 37 * 3, 1 << 20] {
                assert!(written(false, block) == values, "{dtype:?}, block {block}");
                let t = written(true, block);
                for r in 0..rows {
                    for c in 0..cols {
                        assert_eq!(t[c * rows + r], values[r * cols + c], "{dtype:?}");
                    }
                }
            }
        }
    }
}
