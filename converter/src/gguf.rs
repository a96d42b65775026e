//! GGUF reader and dequantizer (llama.cpp's file format, versions 2 and 3).
//!
//! Layout (ggml/docs/gguf.md): magic `GGUF`, version u32, tensor count u64, metadata count
//! u64, metadata key/values, tensor infos (name, dims innermost first, type, offset), padding
//! to `general.alignment`, then tensor data. Every count, length and offset is checked
//! against the file size before it is used, so a hostile header can't make us allocate or
//! read past the end.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};

use crate::finite;
use crate::quants::GgmlType;
use crate::quants::dequantize;
use runtime::util::files::MappedFile;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions a ggml tensor can have.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array. Its items are kept as compactly as the file stores them: an array of
/// 32 MiB of bytes takes 32 MiB, not a [`Value`] (32 bytes) an item, so memory stays a small
/// multiple of the file whatever its arrays hold.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    Strings(Vec<String>),
    /// Numbers or booleans of the metadata type `type_id`, each `scalar_width(type_id)`
    /// bytes, little-endian, as the file has them.
    Scalars {
        type_id: u32,
        bytes: Vec<u8>,
    },
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::Strings(items) => items.len(),
            Array::Scalars { type_id, bytes } => bytes.len() / scalar_width(*type_id),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The items as values, one at a time.
    pub fn values(&self) -> Box<dyn Iterator<Item = Value> + '_> {
        match self {
            Array::Strings(items) => Box::new(items.iter().cloned().map(Value::String)),
            Array::Scalars { type_id, bytes } => Box::new(
                (bytes.chunks_exact(scalar_width(*type_id))).map(|item| scalar(*type_id, item)),
            ),
        }
    }
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            // Through the shortest decimal form, so 1e-5 stored as f32 reads back as 1e-5.
            Value::F32(v) => v.to_string().parse().ok(),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Bytes of a number or boolean of metadata type `type_id` (0 for strings and arrays).
fn scalar_width(type_id: u32) -> usize {
    match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => 0,
    }
}

/// The number or boolean of metadata type `type_id` that `bytes` (`scalar_width` of them,
/// checked by the parser: a boolean byte is 0 or 1) hold.
fn scalar(type_id: u32, bytes: &[u8]) -> Value {
    let mut eight = [0; 8];
    eight[..bytes.len()].copy_from_slice(bytes);
    let [b0, b1, b2, b3, ..] = eight;
    let (two, four) = ([b0, b1], [b0, b1, b2, b3]);
    match type_id {
        0 => Value::U8(b0),
        1 => Value::I8(b0 as i8),
        2 => Value::U16(u16::from_le_bytes(two)),
        3 => Value::I16(i16::from_le_bytes(two)),
        4 => Value::U32(u32::from_le_bytes(four)),
        5 => Value::I32(i32::from_le_bytes(four)),
        6 => Value::F32(f32::from_le_bytes(four)),
        7 => Value::Bool(b0 == 1),
        10 => Value::U64(u64::from_le_bytes(eight)),
        11 => Value::I64(i64::from_le_bytes(eight)),
        12 => Value::F64(f64::from_le_bytes(eight)),
        _ => unreachable!("the parser reads only scalar types here"),
    }
}

/// Where one tensor's data is and how to read it.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: innermost (contiguous) dimension first, the reverse of PyTorch's.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte range in the file (checked to lie inside it at open).
    start: usize,
    len: usize,
}

impl TensorInfo {
    /// Shape in PyTorch order (outermost first).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
}

/// An open GGUF file.
pub struct Gguf {
    file: MappedFile,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Self> {
        let file = MappedFile::open(path)?;
        let (metadata, tensors) = parse(file.bytes())
            .with_context(|| format!("{}: not a valid GGUF file", path.display()))?;
        Ok(Self {
            file,
            metadata,
            tensors,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A required unsigned integer.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.get(key)
            .and_then(Value::as_u64)
            .with_context(|| format!("GGUF metadata {key} is missing or not an unsigned integer"))
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.get(key)
            .and_then(Value::as_str)
            .with_context(|| format!("GGUF metadata {key} is missing or not a string"))
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        match self.get(key) {
            Some(Value::Array(Array::Strings(items))) => {
                Ok(items.iter().map(String::as_str).collect())
            }
            Some(Value::Array(array)) if array.is_empty() => Ok(Vec::new()),
            Some(Value::Array(_)) => bail!("GGUF metadata {key} holds a non-string"),
            _ => bail!("GGUF metadata {key} is missing or not an array"),
        }
    }

    /// The tensor's values as f32, in PyTorch (row-major, outermost first) order.
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        read_tensor(self.file.bytes(), info)
    }

    /// The tensor's data as the file stores it (for a quantized type, its blocks; for an
    /// unsupported type, nothing).
    pub fn raw(&self, info: &TensorInfo) -> &[u8] {
        &self.file.bytes()[info.start..info.start + info.len]
    }
}

/// The values of `info`, one of the tensors [`parse`] found in `file`.
/// Refused unless every value is finite (`finite::check_values`).
pub fn read_tensor(file: &[u8], info: &TensorInfo) -> Result<Vec<f32>> {
    let bytes = &file[info.start..info.start + info.len];
    let row_len = info.dims.first().map_or(1, |&d| d as usize);
    dequantize(info.ggml_type, bytes, info.numel())
        .and_then(|values| {
            finite::check_values(&values, 0, row_len)?;
            Ok(values)
        })
        .with_context(|| format!("tensor {}", info.name))
}

/// A bounds-checked reader over the header bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let remaining = (self.bytes.len() - self.pos) as u64;
        if n > remaining {
            bail!(
                "truncated: needs {n} bytes at offset {}, only {remaining} left",
                self.pos
            );
        }
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self
            .take(N as u64)?
            .try_into()
            .expect("take returns N bytes"))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).context("a string is not valid UTF-8")
    }

    /// A count of items each at least `min_item_bytes` long: refused if the rest of the file
    /// couldn't hold them, so counts can't drive huge allocations.
    fn count(&mut self, what: &str, min_item_bytes: u64) -> Result<usize> {
        let n = self.u64()?;
        let remaining = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item_bytes) > remaining {
            bail!("{what} count {n} cannot fit in the {remaining} bytes left in the file");
        }
        Ok(n as usize)
    }

    fn value(&mut self, type_id: u32) -> Result<Value> {
        Ok(match type_id {
            8 => Value::String(self.string()?),
            9 => Value::Array(self.array_value()?),
            _ => {
                let width = scalar_width(type_id);
                ensure!(width > 0, "unknown metadata value type {type_id}");
                scalar(type_id, self.scalars(type_id, 1)?)
            }
        })
    }

    fn array_value(&mut self) -> Result<Array> {
        let type_id = self.u32()?;
        Ok(match type_id {
            8 => {
                let n = self.count("array item", 8)?;
                Array::Strings((0..n).map(|_| self.string()).collect::<Result<_>>()?)
            }
            9 => bail!("nested metadata arrays are not supported"),
            _ => {
                let width = scalar_width(type_id);
                ensure!(width > 0, "unknown metadata value type {type_id}");
                let n = self.count("array item", width as u64)?;
                let bytes = self.scalars(type_id, n)?.to_vec();
                Array::Scalars { type_id, bytes }
            }
        })
    }

    /// The bytes of `n` numbers or booleans of metadata type `type_id`; a boolean byte
    /// must be 0 or 1.
    fn scalars(&mut self, type_id: u32, n: usize) -> Result<&'a [u8]> {
        let bytes = self.take((n * scalar_width(type_id)) as u64)?;
        if type_id == 7
            && let Some(b) = bytes.iter().find(|&&b| b > 1)
        {
            bail!("invalid bool byte {b}");
        }
        Ok(bytes)
    }
}

type Parsed = (BTreeMap<String, Value>, Vec<TensorInfo>);

/// Reads the header of the GGUF file `bytes`: metadata and tensor infos, every count,
/// length and offset checked against the file's size.
pub fn parse(bytes: &[u8]) -> Result<Parsed> {
    let mut cur = Cursor { bytes, pos: 0 };
    let magic = cur.take(4).context("file shorter than the GGUF magic")?;
    ensure!(magic == MAGIC, "bad magic {magic:02x?}, expected \"GGUF\"");
    let version = cur.u32()?;
    ensure!(
        matches!(version, 2 | 3),
        "unsupported GGUF version {version} (supported: 2, 3)"
    );
    // A tensor info is at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
    // a key/value at least 8 (key length) + 4 (type) + 1.
    let n_tensors = cur.u64()?;
    let n_kv = cur.u64()?;
    let remaining = (bytes.len() - cur.pos) as u64;
    ensure!(
        n_tensors
            .saturating_mul(24)
            .saturating_add(n_kv.saturating_mul(13))
            <= remaining,
        "header claims {n_tensors} tensors and {n_kv} metadata entries, more than the file can hold"
    );
    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = cur.string().context("metadata key")?;
        let type_id = cur.u32()?;
        let value = cur
            .value(type_id)
            .with_context(|| format!("metadata {key}"))?;
        // As ggml's reader: a second value for a key is an error, not the one that counts.
        ensure!(!metadata.contains_key(&key), "duplicate metadata key {key}");
        // A hyperparameter that is NaN or infinite has no meaning (config.json would say
        // `null` and a default would stand in); arrays (a vocabulary's scores) may hold
        // -inf and are checked where they are used.
        if let Value::F32(_) | Value::F64(_) = value {
            let v = value.as_f64().unwrap_or(f64::NAN);
            ensure!(v.is_finite(), "metadata {key} is {v}, not a finite number");
        }
        metadata.insert(key, value);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|a| a.is_power_of_two())
            .context("general.alignment must be a power of two")?,
    };
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = cur.string().context("tensor name")?;
        let n_dims = cur.u32()?;
        ensure!(
            (1..=MAX_DIMS).contains(&n_dims),
            "tensor {name}: {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
        );
        let dims = (0..n_dims).map(|_| cur.u64()).collect::<Result<Vec<_>>>()?;
        let ggml_type = GgmlType::from_id(cur.u32()?).with_context(|| format!("tensor {name}"))?;
        let offset = cur.u64()?;
        infos.push((name, dims, ggml_type, offset));
    }
    let data_start = (cur.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, dims, ggml_type, offset) in infos {
        let numel = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0)
            .with_context(|| format!("tensor {name}: invalid shape {dims:?}"))?;
        let len = match ggml_type.block() {
            Some((block_elems, block_bytes)) => {
                ensure!(
                    numel % block_elems == 0,
                    "tensor {name}: {numel} elements is not a multiple of the {} block size {block_elems}",
                    ggml_type.name()
                );
                (numel / block_elems).checked_mul(block_bytes)
            }
            // Unsupported types are reported when read, with their name.
            None => Some(0),
        };
        let start = data_start.checked_add(offset);
        let end = start.zip(len).and_then(|(s, l)| s.checked_add(l));
        let (Some(start), Some(len), Some(end)) = (start, len, end) else {
            bail!("tensor {name}: offset {offset} overflows");
        };
        ensure!(
            end <= file_len,
            "tensor {name}: data [{start}, {end}) lies past the end of the file ({file_len} bytes)"
        );
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            start: start as usize,
            len: len as usize,
        });
    }
    check_disjoint(&tensors)?;
    Ok((metadata, tensors))
}

/// Each tensor once, with bytes of its own: a repeated name would make the import's
/// output ambiguous, and tensors sharing bytes would let a small file decode into far more
/// values than it holds (memory bounded by the file's size no longer).
fn check_disjoint(tensors: &[TensorInfo]) -> Result<()> {
    let mut names = std::collections::HashSet::new();
    for tensor in tensors {
        ensure!(
            names.insert(tensor.name.as_str()),
            "tensor {} appears more than once",
            tensor.name
        );
    }
    let mut ranges: Vec<&TensorInfo> = tensors.iter().filter(|t| t.len > 0).collect();
    ranges.sort_by_key(|t| t.start);
    for pair in ranges.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        ensure!(
            a.start + a.len <= b.start,
            "tensors {} and {} share data bytes [{}, {})",
            a.name,
            b.name,
            b.start,
            (a.start + a.len).min(b.start + b.len)
        );
    }
    Ok(())
}
