//! weights.bin: every parameter as the model keeps it under `Weights::Auto` (projections
//! transposed, bf16 where that is exact, f32 otherwise; a tied lm_head not stored, the
//! loader makes it a view of the embedding), laid out once by `converter convert` from the
//! record through [`crate::layout`]. A start then maps it and hands the model tensors over
//! the map, instead of reading, transposing and narrowing the f32 record every time.
//!
//! The format, little-endian:
//! - a 24-byte header: the magic `RTWEIGHT`, the version (u32), zero (u32), the length of
//!   the index (u64);
//! - the index, JSON ([`Index`]): the record it was laid out from (its length and sha256)
//!   and, per tensor, its record field path, dtype (`f32`, `bf16`), shape as laid out,
//!   offset from the start of the data and length in bytes;
//! - zeros up to the next multiple of [`ALIGN`], where the data starts; each tensor at its
//!   offset, a multiple of [`ALIGN`], in index order, zeros between them; nothing after the
//!   last.
//!
//! Every field is checked when the file is opened ([`WeightsFile::open`]), and the tensors
//! against the model before any is used (`load`), each problem one error.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::files::MappedFile;
use crate::layout::{Form, Layout, Weights};
use crate::params::ParamInfo;
use crate::record::Record;

/// Its name in an artifact directory (`artifact::WEIGHTS_FILE`).
pub const FILE_NAME: &str = "weights.bin";
pub const MAGIC: [u8; 8] = *b"RTWEIGHT";
/// Bumped whenever the layout of the file or of a tensor in it changes.
pub const VERSION: u32 = 1;
const HEADER: usize = 24;
/// Where each tensor starts: a page, so a tensor's bytes over the map are aligned for any
/// element type and vector load, and the pages of one tensor are none of another's.
pub const ALIGN: usize = 4096;

// The tensors are handed to the model as they lie in the file: the host must read
// little-endian as its own order.
const _: () = assert!(cfg!(target_endian = "little"));

/// The JSON index after the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// The record the tensors were laid out from, as the manifest lists it: a weights file
    /// left beside another conversion's record is caught before it is used.
    pub record: RecordId,
    pub tensors: Vec<Entry>,
}

/// A record file by length and sha256 (lower-case hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordId {
    pub bytes: u64,
    pub sha256: String,
}

/// One tensor of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Record field path, `layers.0.self_attn.q_proj.weight`.
    pub path: String,
    pub dtype: Dtype,
    /// As laid out (`layout::Layout::shape`: `[d_out, d_in]` for a projection).
    pub shape: Vec<usize>,
    /// From the start of the data.
    pub offset: u64,
    pub bytes: u64,
}

/// The element types a tensor is stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }

    /// The form a tensor stored as this type is kept in as it is.
    pub fn form(self) -> Form {
        match self {
            Dtype::F32 => Form::F32,
            Dtype::Bf16 => Form::Bf16,
        }
    }
}

impl From<Form> for Dtype {
    fn from(form: Form) -> Self {
        match form {
            Form::F32 => Dtype::F32,
            Form::Bf16 | Form::RoundedBf16 => Dtype::Bf16,
            Form::Blocks(ty) => unreachable!("the converter lays out as Weights::Auto, not {ty}"),
        }
    }
}

/// An open weights file: mapped, its index checked.
pub struct WeightsFile {
    /// The whole file; each tensor handed out is a slice of it, which keeps the map alive.
    map: bytes::Bytes,
    index: Index,
    by_path: HashMap<String, usize>,
    data_start: usize,
}

impl WeightsFile {
    /// Maps `path` and checks its header and index: every tensor within the file, aligned,
    /// in order and not overlapping, its length what its shape and dtype need. Every page
    /// is mapped now (`MappedFile::populate`): the tensors are used where they lie.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = MappedFile::open(path).map_err(|e| e.to_string())?;
        // The map starts on a page; a tensor's alignment within the file is its alignment.
        if !(file.bytes().as_ptr() as usize).is_multiple_of(ALIGN) {
            return Err(format!("the map does not start on a {ALIGN}-byte boundary"));
        }
        let (index, data_start) = parse(file.bytes())?;
        file.populate();
        let map = bytes::Bytes::from_owner(file);
        let mut by_path = HashMap::new();
        for (i, entry) in index.tensors.iter().enumerate() {
            if by_path.insert(entry.path.clone(), i).is_some() {
                return Err(format!("{} is listed twice", entry.path));
            }
        }
        Ok(Self {
            map,
            index,
            by_path,
            data_start,
        })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn entry(&self, path: &str) -> Option<&Entry> {
        self.by_path.get(path).map(|&i| &self.index.tensors[i])
    }

    /// The bytes of `entry`, over the map (no copy; they keep it alive).
    pub fn bytes(&self, entry: &Entry) -> bytes::Bytes {
        let start = self.data_start + entry.offset as usize;
        self.map.slice(start..start + entry.bytes as usize)
    }

    /// The file against the record the manifest lists (length and sha256).
    pub fn check_record(&self, bytes: u64, sha256: &str) -> Result<(), String> {
        let record = &self.index.record;
        if record.bytes != bytes || record.sha256 != sha256 {
            return Err(format!(
                "it was laid out from a record of {} bytes (sha256 {}), the manifest lists one of {bytes} bytes (sha256 {sha256}): it is left from another conversion; convert again",
                record.bytes, record.sha256
            ));
        }
        Ok(())
    }
}

/// The parameter a tied model does not store: the loader makes it a view of the embedding.
pub const TIED_LM_HEAD: &str = "lm_head.weight";

/// The header and index of `file`, checked; and where the data starts.
fn parse(file: &[u8]) -> Result<(Index, usize), String> {
    let len = file.len();
    if len < HEADER {
        return Err(format!(
            "truncated: {len} bytes, shorter than the {HEADER}-byte header"
        ));
    }
    if file[..8] != MAGIC {
        return Err("not a weights file (it does not start with RTWEIGHT)".into());
    }
    let word = |at: usize| u32::from_le_bytes(file[at..at + 4].try_into().expect("4 bytes"));
    let version = word(8);
    if version != VERSION {
        return Err(format!(
            "version {version}, this runtime reads version {VERSION}: convert again"
        ));
    }
    if word(12) != 0 {
        return Err("bytes 12..16 of the header are not zero".into());
    }
    let index_len = u64::from_le_bytes(file[16..24].try_into().expect("8 bytes"));
    let index_end = (HEADER as u64)
        .checked_add(index_len)
        .filter(|&end| end <= len as u64)
        .ok_or_else(|| {
            format!(
                "truncated: the header announces a {index_len}-byte index, {} bytes follow it",
                len - HEADER
            )
        })? as usize;
    let index: Index = serde_json::from_slice(&file[HEADER..index_end])
        .map_err(|e| format!("its index is not valid: {e}"))?;
    let data_start = index_end.next_multiple_of(ALIGN);
    let mut end = 0u64; // of the data so far, from its start
    for entry in &index.tensors {
        let path = &entry.path;
        let elements = entry
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        let needed = elements.and_then(|n| n.checked_mul(entry.dtype.size() as u64));
        if needed != Some(entry.bytes) {
            return Err(format!(
                "{path} holds {} bytes, its shape {:?} of {:?} needs {}",
                entry.bytes,
                entry.shape,
                entry.dtype,
                needed.map_or("more than 2^64".into(), |n| n.to_string())
            ));
        }
        if !matches!(entry.shape.len(), 1 | 2) {
            return Err(format!(
                "{path} has {} dimensions; parameters have 1 or 2",
                entry.shape.len()
            ));
        }
        if entry.dtype != Dtype::F32 && entry.shape.len() != 2 {
            return Err(format!("{path} is a vector stored as {:?}", entry.dtype));
        }
        if !entry.offset.is_multiple_of(ALIGN as u64) {
            return Err(format!(
                "{path} starts at offset {}, not a multiple of {ALIGN}",
                entry.offset
            ));
        }
        if entry.offset < end {
            return Err(format!(
                "{path} starts at offset {}, inside the tensor before it (which ends at {end})",
                entry.offset
            ));
        }
        let data = (len as u64).saturating_sub(data_start as u64);
        end = (entry.offset.checked_add(entry.bytes))
            .filter(|&end| end <= data)
            .ok_or_else(|| {
                format!(
                    "truncated: {path} ends past the file ({} bytes from offset {} of the data, which has {data})",
                    entry.bytes, entry.offset
                )
            })?;
    }
    let expected = data_start as u64 + end;
    if len as u64 != expected {
        return Err(match (len as u64).checked_sub(expected) {
            Some(more) => format!("{more} bytes follow the last tensor"),
            None => format!("truncated: {len} bytes, the index implies {expected}"),
        });
    }
    Ok((index, data_start))
}

/// Writes the weights file of a model with parameters `params` (`params::params`, in
/// declaration order) from `record` (`record_id` its length and sha256): each parameter
/// laid out as [`Weights::Auto`] keeps it, through the loader's own [`Layout`]; with `tied`
/// embeddings lm_head is not stored. Reads the record twice (which form each matrix takes,
/// then its values), each tensor's mapped pages dropped once read.
pub fn write(
    record: &Record,
    record_id: RecordId,
    params: &[ParamInfo],
    tied: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    let stored: Vec<&ParamInfo> = (params.iter())
        .filter(|p| !(tied && p.path == TIED_LM_HEAD))
        .collect();
    let mut forms = Vec::new();
    let mut tensors = Vec::new();
    let mut end = 0u64;
    for param in &stored {
        let values = record.param(&param.path)?;
        if values.shape != param.shape {
            return Err(format!(
                "{} has shape {:?} in the record, the model {:?}",
                param.path, values.shape, param.shape
            ));
        }
        let layout = Layout::of(&param.owner, &param.shape);
        let form = layout.form(values.bytes, Weights::Auto);
        record.release(&values);
        let dtype = Dtype::from(form);
        let offset = end.next_multiple_of(ALIGN as u64);
        let bytes = (layout.shape.iter().product::<usize>() * dtype.size()) as u64;
        end = offset + bytes;
        tensors.push(Entry {
            path: param.path.clone(),
            dtype,
            shape: layout.shape.clone(),
            offset,
            bytes,
        });
        forms.push((layout, form));
    }
    let index = serde_json::to_vec(&Index {
        record: record_id,
        tensors,
    })
    .expect("an index always serializes");
    let io = |e: std::io::Error| format!("cannot write the weights file: {e}");
    out.write_all(&MAGIC).map_err(io)?;
    out.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    out.write_all(&0u32.to_le_bytes()).map_err(io)?;
    out.write_all(&(index.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&index).map_err(io)?;
    let header_end = HEADER + index.len();
    let mut written = 0u64; // of the data
    out.write_all(&vec![0; header_end.next_multiple_of(ALIGN) - header_end])
        .map_err(io)?;
    for (param, (layout, form)) in stored.iter().zip(forms) {
        let values = record.param(&param.path)?;
        let offset = written.next_multiple_of(ALIGN as u64);
        out.write_all(&vec![0; (offset - written) as usize])
            .map_err(io)?;
        let data = layout.lay_out(values.bytes, form);
        record.release(&values);
        out.write_all(data.as_bytes()).map_err(io)?;
        written = offset + data.as_bytes().len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
