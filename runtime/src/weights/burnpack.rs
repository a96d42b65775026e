//! model.bpk read in place: Burn's burnpack format (burn-store 0.21's `BurnpackWriter`, the
//! format Burn 0.22 saves and loads), written by `converter convert --burnpack` beside the
//! record with the same parameters. A 10-byte header (`NRUB`, version 1, the metadata's
//! length), CBOR metadata (each tensor's dtype, shape, byte range in the data section and
//! param id), then the data section, starting and each tensor starting on a 256-byte
//! boundary of the file.
//!
//! Parsed here, not with burn-store: the runtime needs only the index, and the tensors as
//! slices of the map (a vector loads with no copy, `crate::weights::load`). Every field is
//! checked before a byte of a tensor is handed out; a truncated or corrupt file is one
//! error, never a panic.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::util::files::MappedFile;

const MAGIC: &[u8; 4] = b"NRUB";
const VERSION: u16 = 1;
const HEADER: usize = 10;
/// The data section and every tensor start on a multiple of this, counted from the file's
/// start (the map's, which is page-aligned).
const ALIGN: usize = 256;
/// Largest metadata read: a 1B model's is ~20 KB; this bounds what a corrupt header claims.
const METADATA_LIMIT: usize = 64 << 20;
/// Deepest CBOR nesting the metadata has is 4 (root, tensors, a descriptor, its shape).
const CBOR_DEPTH: usize = 16;

#[derive(Deserialize)]
struct Metadata {
    /// Beside it, `metadata` (Burn's producer, format and version strings): not needed.
    tensors: BTreeMap<String, Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    /// Burn's `DType` as serde writes it: `"F32"` for a unit variant, a map for the
    /// parameterized ones (quantized, bool), which the model never has.
    dtype: ciborium::Value,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
    #[serde(default)]
    param_id: Option<u64>,
}

/// One tensor of the file: f32, its shape, where its bytes lie in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub shape: Vec<usize>,
    /// Burn's `ParamId` as a number (the record's id of the same parameter).
    pub param_id: Option<u64>,
    start: usize,
    end: usize,
}

impl Entry {
    /// Its bytes in the file.
    pub fn size(&self) -> u64 {
        (self.end - self.start) as u64
    }
}

/// An open burnpack file: mapped, its metadata checked.
pub struct Burnpack {
    /// The whole file; a tensor handed out over it keeps the map alive.
    map: bytes::Bytes,
    tensors: BTreeMap<String, Entry>,
}

impl Burnpack {
    /// Maps `path` and checks its header and metadata: every tensor f32, within the file,
    /// aligned, its length what its shape needs.
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = MappedFile::open(path).map_err(|e| e.to_string())?;
        let tensors = parse(file.bytes())?;
        // The map starts on a page; a tensor's alignment within the file is its alignment.
        if !(file.bytes().as_ptr() as usize).is_multiple_of(ALIGN) {
            return Err(format!("the map does not start on a {ALIGN}-byte boundary"));
        }
        Ok(Self {
            map: bytes::Bytes::from_owner(file),
            tensors,
        })
    }

    /// The tensor at record field path `path` (`layers.0.self_attn.q_proj.weight`).
    pub fn entry(&self, path: &str) -> Option<&Entry> {
        self.tensors.get(path)
    }

    /// Every tensor's path, in the file's (sorted) order.
    pub fn paths(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    /// The little-endian f32 bytes of `entry`, over the map (no copy; they keep it alive).
    pub fn bytes(&self, entry: &Entry) -> bytes::Bytes {
        self.map.slice(entry.start..entry.end)
    }
}

/// The tensors `file` lists, each checked against the file.
fn parse(file: &[u8]) -> Result<BTreeMap<String, Entry>, String> {
    let len = file.len();
    if len < HEADER {
        return Err(format!(
            "truncated: {len} bytes, less than the {HEADER}-byte header"
        ));
    }
    if &file[..4] != MAGIC {
        return Err("not a burnpack file (no NRUB magic)".into());
    }
    let version = u16::from_le_bytes([file[4], file[5]]);
    if version != VERSION {
        return Err(format!(
            "burnpack format version {version}, this runtime reads {VERSION}"
        ));
    }
    let size = u32::from_le_bytes(file[6..10].try_into().expect("4 bytes")) as usize;
    if size > METADATA_LIMIT {
        return Err(format!(
            "the header claims {size} bytes of metadata, more than {METADATA_LIMIT}"
        ));
    }
    let metadata_end = HEADER + size;
    if metadata_end > len {
        return Err(format!(
            "truncated: the metadata ends at byte {metadata_end}, the file has {len}"
        ));
    }
    let metadata: Metadata =
        ciborium::de::from_reader_with_recursion_limit(&file[HEADER..metadata_end], CBOR_DEPTH)
            .map_err(|e| format!("corrupt metadata: {e}"))?;
    let data_start = metadata_end.next_multiple_of(ALIGN);
    let mut tensors = BTreeMap::new();
    for (path, descriptor) in metadata.tensors {
        let entry = checked(&path, descriptor, data_start, len)?;
        tensors.insert(path, entry);
    }
    Ok(tensors)
}

/// `descriptor` of the tensor at `path` as an [`Entry`] of a file of `len` bytes whose data
/// section starts at `data_start`.
fn checked(
    path: &str,
    descriptor: Descriptor,
    data_start: usize,
    len: usize,
) -> Result<Entry, String> {
    match &descriptor.dtype {
        ciborium::Value::Text(dtype) if dtype == "F32" => {}
        ciborium::Value::Text(dtype) => return Err(format!("{path} is {dtype}, not F32")),
        other => return Err(format!("{path} has dtype {other:?}, not F32")),
    }
    let shape = (descriptor.shape.iter())
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| format!("{path} has a malformed shape"))?;
    let bytes = shape
        .iter()
        .try_fold(4usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| format!("{path}: its shape {shape:?} overflows"))?;
    let (from, to) = descriptor.data_offsets;
    let range = (usize::try_from(from).ok())
        .zip(usize::try_from(to).ok())
        .and_then(|(from, to)| Some((data_start.checked_add(from)?, data_start.checked_add(to)?)))
        .filter(|(start, end)| start <= end);
    let Some((start, end)) = range else {
        return Err(format!("{path} has malformed offsets {from}..{to}"));
    };
    if end - start != bytes {
        return Err(format!(
            "{path} holds {} bytes, its shape {shape:?} needs {bytes}",
            end - start
        ));
    }
    if end > len {
        return Err(format!(
            "truncated: {path} ends at byte {end}, the file has {len}"
        ));
    }
    if !start.is_multiple_of(ALIGN) {
        return Err(format!(
            "{path} starts at byte {start}, not {ALIGN}-aligned"
        ));
    }
    Ok(Entry {
        shape,
        param_id: descriptor.param_id,
        start,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciborium::Value;

    /// A file as burn-store writes one: two f32 tensors, the second after padding.
    fn file() -> Vec<u8> {
        let tensor = |shape: &[u64], from: u64, id: u64| {
            let to = from + 4 * shape.iter().product::<u64>();
            Value::Map(vec![
                (Value::from("dtype"), Value::from("F32")),
                (
                    Value::from("shape"),
                    Value::Array(shape.iter().map(|&d| Value::from(d)).collect()),
                ),
                (
                    Value::from("data_offsets"),
                    Value::Array(vec![Value::from(from), Value::from(to)]),
                ),
                (Value::from("param_id"), Value::from(id)),
            ])
        };
        let metadata = Value::Map(vec![(
            Value::from("tensors"),
            Value::Map(vec![
                (Value::from("a.weight"), tensor(&[2, 3], 0, 7)),
                (Value::from("b.gamma"), tensor(&[3], 256, 8)),
            ]),
        )]);
        let mut cbor = Vec::new();
        ciborium::ser::into_writer(&metadata, &mut cbor).unwrap();
        let mut bytes = b"NRUB\x01\x00".to_vec();
        bytes.extend((cbor.len() as u32).to_le_bytes());
        bytes.extend(&cbor);
        bytes.resize(bytes.len().next_multiple_of(ALIGN), 0);
        bytes.extend((0..6).flat_map(|i| (i as f32).to_le_bytes()));
        bytes.resize(bytes.len().next_multiple_of(ALIGN), 0);
        bytes.extend((0..3).flat_map(|i| (10.0 + i as f32).to_le_bytes()));
        bytes
    }

    #[test]
    fn reads_each_tensor_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("model.bpk");
        std::fs::write(&path, file()).unwrap();
        let pack = Burnpack::open(&path).unwrap();
        assert_eq!(pack.paths(), ["a.weight", "b.gamma"]);
        let b = pack.entry("b.gamma").unwrap();
        assert_eq!((b.shape.as_slice(), b.param_id), (&[3][..], Some(8)));
        let values: Vec<f32> = (pack.bytes(b).chunks(4))
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, [10.0, 11.0, 12.0]);
    }

    /// Cut at every length, and with any one byte of its header and metadata changed, the
    /// file is refused with a message (or, a changed byte the format does not check,
    /// read): never a panic.
    #[test]
    fn a_truncated_or_corrupt_file_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("model.bpk");
        let whole = file();
        for len in 0..whole.len() {
            std::fs::write(&path, &whole[..len]).unwrap();
            let error = Burnpack::open(&path).err();
            let error = error.unwrap_or_else(|| panic!("{len} bytes read"));
            assert!(!error.is_empty());
        }
        let cut = |len: usize| {
            std::fs::write(&path, &whole[..len]).unwrap();
            Burnpack::open(&path).err().unwrap()
        };
        assert_eq!(cut(5), "truncated: 5 bytes, less than the 10-byte header");
        assert!(cut(20).starts_with("truncated: the metadata ends at byte"));
        let end = whole.len();
        assert_eq!(
            cut(end - 1),
            format!(
                "truncated: b.gamma ends at byte {end}, the file has {}",
                end - 1
            )
        );
        let metadata_end = 10 + u32::from_le_bytes(whole[6..10].try_into().unwrap()) as usize;
        for at in 0..metadata_end {
            for flip in [0x01, 0x80, 0xff] {
                let mut bytes = whole.clone();
                bytes[at] ^= flip;
                std::fs::write(&path, &bytes).unwrap();
                let _ = Burnpack::open(&path);
            }
        }
    }
}
