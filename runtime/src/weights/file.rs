//! weights.bin: every parameter as the model keeps it under `Weights::Auto` (projections
//! transposed, bf16 where that is exact, f32 otherwise; a tied lm_head not stored, the
//! loader makes it a view of the embedding), laid out once by `converter convert` from the
//! record through [`crate::weights::layout`]. A start then maps it and hands the model tensors over
//! the map, instead of reading, transposing and narrowing the f32 record every time.
//! A projection imported from a quantized GGUF is stored as that file's ggml blocks,
//! verbatim ([`StoredBlocks`]), which decode to exactly the record's values: `Auto` keeps
//! them as blocks, over the map.
//!
//! The format, little-endian:
//! - a 24-byte header: the magic `RTWEIGHT`, the version (u32: 1 without blocks, 2 with), zero (u32), the length of
//!   the index (u64);
//! - the index, JSON ([`Index`]): the record it was laid out from (its length and sha256)
//!   and, per tensor, its record field path, dtype ([`Dtype`]: `f32`, `bf16`, or a block
//!   type, `q8_0`, `q4_0`, `q5_0`, `q4_k`, `q6_k`), shape as laid out, offset from the
//!   start of the data and length in bytes. A block type's tensor is a projection
//!   `[d_out, d_in]` stored as `d_out` rows of `d_in / values` blocks each, the rows ggml
//!   and `quant::BlockType` read;
//! - zeros up to the next multiple of [`ALIGN`], where the data starts; each tensor at its
//!   offset, a multiple of [`ALIGN`], in index order, zeros between them; nothing after the
//!   last.
//!
//! Every field is checked when the file is opened ([`WeightsFile::open`]), every block's
//! scales too (a NaN or infinite one is refused), and the tensors against the model before
//! any is used (`load`), each problem one error naming the tensor.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use kernels::quant::BlockType;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::model::params::ParamInfo;
use crate::util::files::MappedFile;
use crate::weights::layout::{Form, Layout, Weights};
use crate::weights::record::Record;

pub const MAGIC: [u8; 8] = *b"RTWEIGHT";
/// Bumped whenever the layout of the file or of a tensor in it changes. Version 2 added
/// the block types; a version 1 file is a version 2 file without them, and is read.
pub const VERSION: u32 = 2;
const OLDEST_READ: u32 = 1;
/// The version a file without blocks is written as: the lowest that holds its tensors, so a
/// model with none converts to the bytes it always did (its manifest unchanged) and older
/// runtimes read it.
const WITHOUT_BLOCKS: u32 = 1;
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
#[serde(deny_unknown_fields, try_from = "StoredEntry")]
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

/// An [`Entry`] as the index spells it: its dtype a name, read with the tensor's path at
/// hand so that a name this runtime does not know is refused naming the tensor.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredEntry {
    path: String,
    dtype: String,
    shape: Vec<usize>,
    offset: u64,
    bytes: u64,
}

impl TryFrom<StoredEntry> for Entry {
    type Error = String;

    fn try_from(entry: StoredEntry) -> Result<Self, String> {
        let dtype = Dtype::from_name(&entry.dtype).ok_or_else(|| {
            let names: Vec<&str> = Dtype::all().map(|d| d.name()).collect();
            format!(
                "{} has dtype {:?}, which this runtime does not read (it reads {})",
                entry.path,
                entry.dtype,
                names.join(", ")
            )
        })?;
        Ok(Self {
            path: entry.path,
            dtype,
            shape: entry.shape,
            offset: entry.offset,
            bytes: entry.bytes,
        })
    }
}

/// The types a tensor is stored as: an element type, or rows of ggml blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
    /// A projection `[d_out, d_in]` as `d_out` rows of `d_in` values in blocks of this type.
    Blocks(BlockType),
}

impl Dtype {
    /// Every type, as the index names them: the element types, then the kept block types.
    pub fn all() -> impl Iterator<Item = Dtype> {
        [Dtype::F32, Dtype::Bf16]
            .into_iter()
            .chain(BlockType::KEPT.map(Dtype::Blocks))
    }

    /// Its name in the index: `f32`, `bf16`, and ggml's type names in lower case (`q4_k`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::Blocks(ty) => ty.lower_name(),
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::all().find(|d| d.name() == name)
    }

    /// The bytes a tensor of `shape` takes stored as this type, or why it cannot be stored
    /// so (`None` inside: more than 2^64).
    fn stored_bytes(self, shape: &[usize]) -> Result<Option<u64>, String> {
        let elements = (shape.iter()).try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        Ok(match self {
            Dtype::F32 => elements.and_then(|n| n.checked_mul(4)),
            Dtype::Bf16 => elements.and_then(|n| n.checked_mul(2)),
            Dtype::Blocks(ty) => {
                let &[rows, d_in] = shape else {
                    return Err(format!("a vector stored as {self}"));
                };
                let row_bytes = ty.row_bytes(d_in).ok_or_else(|| {
                    format!(
                        "stored as {self}, blocks of {} values, in rows of {d_in} values: not a whole number of blocks",
                        ty.values()
                    )
                })?;
                (rows as u64).checked_mul(row_bytes as u64)
            }
        })
    }

    /// The form a tensor stored as this type is kept in as it is.
    pub fn form(self) -> Form {
        match self {
            Dtype::F32 => Form::F32,
            Dtype::Bf16 => Form::Bf16,
            Dtype::Blocks(ty) => Form::Blocks(ty),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl From<Form> for Dtype {
    fn from(form: Form) -> Self {
        match form {
            Form::F32 => Dtype::F32,
            Form::Bf16 | Form::RoundedBf16 => Dtype::Bf16,
            Form::Blocks(ty) => Dtype::Blocks(ty),
        }
    }
}

/// Where a loaded model's weights file lies in memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightsMemory {
    /// Read into the process's memory when the file takes at most half the memory
    /// available, else mapped ([`Self::copies`]).
    #[default]
    Auto,
    /// Mapped: the page cache's pages, one copy shared by every process that maps the
    /// file, loaded at once when the file is cached (docs/ARCHITECTURE.md, "Loading").
    Mapped,
    /// Read into the process's own memory in 2 MiB pages (llama.cpp's `--no-mmap`): a
    /// slower start and no sharing, and decoding that reads its weights as fast as the
    /// host's memory allows, where a page cache filled from disk can read slower
    /// ([`crate::util::files::read_to_memory`]).
    Copied,
}

impl WeightsMemory {
    /// From llama.cpp's flags: `--mmap` maps, `--no-mmap` copies, neither chooses.
    pub fn from_flags(mmap: bool, no_mmap: bool) -> Self {
        match (mmap, no_mmap) {
            (true, _) => Self::Mapped,
            (_, true) => Self::Copied,
            _ => Self::Auto,
        }
    }

    /// Whether a file of `bytes` is read into memory: [`Self::Auto`] reads it if it takes
    /// at most half the memory available now ([`crate::util::memory::available`]: the
    /// machine's, or a container's limit if tighter), and maps it otherwise, so that a
    /// model larger than memory still runs from the page cache. [`Self::Copied`] refuses a
    /// file larger than all of it, which would end in the kernel killing the process.
    pub fn copies(self, bytes: u64) -> Result<bool, String> {
        let available = crate::util::memory::available();
        match self {
            Self::Auto => Ok(available.is_some_and(|available| bytes <= available / 2)),
            Self::Mapped => Ok(false),
            Self::Copied => match available.filter(|&available| bytes > available) {
                Some(available) => Err(format!(
                    "it takes {} MB, more than the {} MB of memory available to read it into (--no-mmap); map it instead (--mmap)",
                    bytes.div_ceil(1 << 20),
                    available >> 20
                )),
                None => Ok(true),
            },
        }
    }
}

/// An open weights file: mapped, its index checked.
pub struct WeightsFile {
    /// The whole file; each tensor handed out is a slice of it, which keeps the map alive.
    map: bytes::Bytes,
    /// Whether `map` is the file's mapping, not a copy ([`Self::open_in`]).
    mapped: bool,
    index: Index,
    by_path: HashMap<String, usize>,
    data_start: usize,
}

impl WeightsFile {
    /// Maps `path` and checks its header and index: every tensor within the file, aligned,
    /// in order and not overlapping, its length what its shape and dtype need; and every
    /// block's scales.
    pub fn open(path: &Path) -> Result<Self, String> {
        Self::open_in(path, false, |_| ())
    }

    /// [`Self::open`] with the tensors read into the process's own memory if `copy`
    /// ([`crate::util::files::read_to_memory`]; `read` is told the bytes of each piece
    /// read), the map then dropped; else over the map. Whether to copy is the caller's
    /// ([`WeightsMemory::copies`]). The blocks' scales are checked in the memory the
    /// tensors will be read from, so a copy reads the file once.
    pub fn open_in(path: &Path, copy: bool, read: impl Fn(u64) + Sync) -> Result<Self, String> {
        let file = MappedFile::open(path).map_err(|e| e.to_string())?;
        // The map starts on a page; a tensor's alignment within the file is its alignment.
        if !(file.bytes().as_ptr() as usize).is_multiple_of(ALIGN) {
            return Err(format!("the map does not start on a {ALIGN}-byte boundary"));
        }
        let (index, data_start) = parse(file.bytes())?;
        let mut by_path = HashMap::new();
        for (i, entry) in index.tensors.iter().enumerate() {
            if by_path.insert(entry.path.clone(), i).is_some() {
                return Err(format!("{} is listed twice", entry.path));
            }
        }
        let map = match copy {
            false => bytes::Bytes::from_owner(file),
            true => {
                let len = file.bytes().len();
                let memory = crate::util::files::read_to_memory(file.file(), len, read)
                    .map_err(|e| format!("cannot read it into memory: {e}"))?;
                bytes::Bytes::from_owner(memory)
            }
        };
        check_all_scales(&index, data_start, &map)?;
        Ok(Self {
            map,
            index,
            by_path,
            data_start,
            mapped: !copy,
        })
    }

    /// Maps every page now (`MappedFile::populate`), telling `read` the bytes of each piece
    /// as it goes, for a loader that uses the tensors where they lie: no page faults in the
    /// first prompt. Not for one that converts them (quantizing at load), which reads each
    /// tensor once and drops its pages: populating first would hold the whole file in
    /// memory beside what it makes. A copy in memory has every page already.
    pub fn populate(&self, mut read: impl FnMut(u64)) {
        match self.mapped {
            // SAFETY: `map` is the whole of the file's read-only private mapping.
            true => unsafe { crate::util::files::populate_mapped_watched(&self.map, read) },
            false => read(self.size()),
        }
    }

    /// Whether the tensors lie over the file's map (else in a copy, [`Self::open_in`]).
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// The file's length in bytes.
    pub fn size(&self) -> u64 {
        self.map.len() as u64
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
    if !(OLDEST_READ..=VERSION).contains(&version) {
        return Err(format!(
            "version {version}, this runtime reads versions {OLDEST_READ} to {VERSION}: convert again"
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
        if !matches!(entry.shape.len(), 1 | 2) {
            return Err(format!(
                "{path} has {} dimensions; parameters have 1 or 2",
                entry.shape.len()
            ));
        }
        if let Dtype::Blocks(ty) = entry.dtype
            && version <= WITHOUT_BLOCKS
        {
            return Err(format!(
                "{path} is stored as {ty} blocks, which a version {version} file cannot hold"
            ));
        }
        if entry.dtype != Dtype::F32 && entry.shape.len() != 2 {
            return Err(format!("{path} is a vector stored as {}", entry.dtype));
        }
        let needed =
            (entry.dtype.stored_bytes(&entry.shape)).map_err(|e| format!("{path} is {e}"))?;
        if needed != Some(entry.bytes) {
            return Err(format!(
                "{path} holds {} bytes, its shape {:?} of {} needs {}",
                entry.bytes,
                entry.shape,
                entry.dtype,
                needed.map_or("more than 2^64".into(), |n| n.to_string())
            ));
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

/// [`check_scales`] for every tensor of blocks in `file`, whose index [`parse`] checked.
fn check_all_scales(index: &Index, data_start: usize, file: &[u8]) -> Result<(), String> {
    for entry in &index.tensors {
        if let Dtype::Blocks(ty) = entry.dtype {
            let start = data_start + entry.offset as usize;
            check_scales(entry, ty, &file[start..start + entry.bytes as usize])?;
        }
    }
    Ok(())
}

/// Refuses blocks with a NaN or infinite scale (`BlockType::first_bad_scale`): every value
/// of such a block would be one, and a product over it garbage. Rows in parallel: this
/// reads every block of the file on every open.
fn check_scales(entry: &Entry, ty: BlockType, blocks: &[u8]) -> Result<(), String> {
    const ROWS: usize = 64;
    let row_bytes = entry.bytes as usize / entry.shape[0].max(1);
    let per_row = row_bytes / ty.bytes();
    let found = (blocks.par_chunks(ROWS * row_bytes.max(1)).enumerate())
        .find_map_first(|(i, rows)| Some(i * ROWS * per_row + ty.first_bad_scale(rows)?));
    match found {
        None => Ok(()),
        Some(block) => Err(format!(
            "{}: {} block {} of row {} has a NaN or infinite scale",
            entry.path,
            ty,
            block % per_row,
            block / per_row
        )),
    }
}

/// A projection's ggml blocks, as a quantized GGUF stored them, to be stored verbatim in
/// place of the record's values, which they must decode to exactly: `d_out` rows (the
/// record's outputs, in its order) of `row_bytes(d_in)` bytes each.
#[derive(Debug, Clone, Copy)]
pub struct StoredBlocks<'a> {
    pub ty: BlockType,
    pub bytes: &'a [u8],
}

/// Writes the weights file of a model with parameters `params` (`params::params`, in
/// declaration order) from `record` (`record_id` its length and sha256): each parameter
/// laid out as [`Weights::Auto`] keeps it, through the loader's own [`Layout`], except the
/// projections of `blocks` (by record field path), stored as those blocks once checked to
/// decode to the record's values bit for bit; with `tied` embeddings lm_head is not stored.
/// Reads the record twice (which form each matrix takes, then its values), each tensor's
/// mapped pages dropped once read.
pub fn write(
    record: &Record,
    record_id: RecordId,
    params: &[ParamInfo],
    tied: bool,
    blocks: &HashMap<String, StoredBlocks<'_>>,
    out: &mut impl Write,
) -> Result<(), String> {
    let stored: Vec<&ParamInfo> = (params.iter())
        .filter(|p| !(tied && p.path == TIED_LM_HEAD))
        .collect();
    if let Some(path) = (blocks.keys()).find(|path| !stored.iter().any(|p| &&p.path == path)) {
        return Err(format!(
            "blocks are given for {path}, which is not a stored parameter of the model"
        ));
    }
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
        let form = match blocks.get(&param.path) {
            Some(given) => {
                check_blocks(&param.path, given, &layout, values.bytes)?;
                Form::Blocks(given.ty)
            }
            None => layout.form(values.bytes, Weights::Auto),
        };
        record.release(&values);
        let dtype = Dtype::from(form);
        let offset = end.next_multiple_of(ALIGN as u64);
        let bytes = (dtype.stored_bytes(&layout.shape)?)
            .ok_or_else(|| format!("{} is larger than 2^64 bytes", param.path))?;
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
    let index = Index {
        record: record_id,
        tensors,
    };
    let io = |e: std::io::Error| format!("cannot write the weights file: {e}");
    out.write_all(&MAGIC).map_err(io)?;
    let version = match index
        .tensors
        .iter()
        .any(|t| matches!(t.dtype, Dtype::Blocks(_)))
    {
        true => VERSION,
        false => WITHOUT_BLOCKS,
    };
    out.write_all(&version.to_le_bytes()).map_err(io)?;
    out.write_all(&0u32.to_le_bytes()).map_err(io)?;
    let index = serde_json::to_vec(&index).expect("an index always serializes");
    out.write_all(&(index.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&index).map_err(io)?;
    let header_end = HEADER + index.len();
    let mut written = 0u64; // of the data
    out.write_all(&vec![0; header_end.next_multiple_of(ALIGN) - header_end])
        .map_err(io)?;
    for (param, (layout, form)) in stored.iter().zip(forms) {
        let offset = written.next_multiple_of(ALIGN as u64);
        out.write_all(&vec![0; (offset - written) as usize])
            .map_err(io)?;
        let length = match blocks.get(&param.path) {
            Some(given) => {
                out.write_all(given.bytes).map_err(io)?;
                given.bytes.len()
            }
            None => {
                let values = record.param(&param.path)?;
                let data = layout.lay_out(values.bytes, form);
                record.release(&values);
                out.write_all(data.as_bytes()).map_err(io)?;
                data.as_bytes().len()
            }
        };
        written = offset + length as u64;
    }
    Ok(())
}

/// `given` against the parameter at `path` (laid out as `layout`, its record values the
/// little-endian f32 `f32_bytes`): a projection, whole rows of blocks, finite scales, and
/// every block decoding to the record's values bit for bit, so that keeping the blocks
/// changes no product.
fn check_blocks(
    path: &str,
    given: &StoredBlocks<'_>,
    layout: &Layout,
    f32_bytes: &[u8],
) -> Result<(), String> {
    let ty = given.ty;
    let Some((d_in, d_out)) = layout.block_rows() else {
        return Err(format!(
            "{ty} blocks are given for {path}, which is not a matrix"
        ));
    };
    let row_bytes = ty.row_bytes(d_in).ok_or_else(|| {
        format!(
            "{ty} blocks are given for {path}, whose rows of {d_in} values are not a whole number of {}-value blocks",
            ty.values()
        )
    })?;
    if given.bytes.len() != d_out * row_bytes {
        return Err(format!(
            "the {ty} blocks of {path} are {} bytes, its {d_out} rows of {d_in} values take {}",
            given.bytes.len(),
            d_out * row_bytes
        ));
    }
    let entry = Entry {
        path: path.to_string(),
        dtype: Dtype::Blocks(ty),
        shape: layout.shape.clone(),
        offset: 0,
        bytes: given.bytes.len() as u64,
    };
    check_scales(&entry, ty, given.bytes)?;
    let laid_out = layout.lay_out(f32_bytes, Form::F32);
    let values = laid_out
        .as_slice::<f32>()
        .map_err(|e| format!("{path}: {e:?}"))?;
    let differs = (given.bytes.par_chunks(row_bytes.max(1)))
        .zip(values.par_chunks(d_in.max(1)))
        .enumerate()
        .map_init(
            || vec![0.0f32; d_in],
            |decoded, (row, (blocks, values))| {
                ty.decode(blocks, decoded);
                let column =
                    (decoded.iter().zip(values)).position(|(a, b)| a.to_bits() != b.to_bits())?;
                Some((row, column, decoded[column], values[column]))
            },
        )
        .find_first(Option::is_some)
        .flatten();
    match differs {
        None => Ok(()),
        Some((row, column, decoded, value)) => Err(format!(
            "the {ty} blocks of {path} decode to {decoded:?} at row {row}, column {column}, where the record holds {value:?}"
        )),
    }
}

#[cfg(test)]
mod tests;
