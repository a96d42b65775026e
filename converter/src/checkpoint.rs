//! A Hugging Face checkpoint directory: config.json, tokenizer files and safetensors weights,
//! in one `model.safetensors` or in shards listed by `model.safetensors.index.json`.
//!
//! Files are memory-mapped and headers validated at open (the safetensors crate checks that
//! offsets are in range, contiguous and agree with dtype × shape); tensor data is decoded
//! only when asked for, one tensor at a time.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use runtime::artifact::is_plain_file_name;
use runtime::files::read_text_bounded;

use crate::mmap::MappedFile;

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
    shards: Vec<MappedFile>,
    /// File names (within the checkpoint dir) of everything read: index and shards.
    pub files: Vec<String>,
    pub tensors: BTreeMap<String, TensorMeta>,
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
            shards,
            files,
            tensors,
        })
    }

    /// The tensor's values as f32 (bf16 and f16 widen exactly).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let meta = self
            .tensors
            .get(name)
            .with_context(|| format!("tensor {name} is missing"))?;
        let shard = &self.shards[meta.shard];
        let values = decode_f32(name, meta, shard.bytes());
        shard.release(meta.start..meta.end);
        values
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

/// The values of tensor `name` (found by [`read_header`] in `shard_bytes`) as f32.
pub fn decode_f32(name: &str, meta: &TensorMeta, shard_bytes: &[u8]) -> Result<Vec<f32>> {
    let bytes = &shard_bytes[meta.start..meta.end];
    Ok(match meta.dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            bail!("tensor {name} has unsupported dtype {other:?} (supported: F32, BF16, F16)")
        }
    })
}
