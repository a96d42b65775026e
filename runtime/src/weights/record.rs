//! model.mpk read in place: Burn's `NamedMpkFileRecorder` format (MessagePack, structs as
//! maps keyed by field name, each parameter `{id, param: {bytes, shape, dtype}}`), its
//! structure parsed over a memory map, each parameter's bytes handed out as a slice of the
//! map (`crate::weights::load` copies them once into the model).
//!
//! Why not Burn's loader: it reads the whole file into memory, decodes every tensor into
//! another buffer, and the model then re-lays each weight out for the matrix-vector kernel;
//! for a 6 GB record that is three passes and twice its size in memory.

use std::ops::Range;
use std::path::Path;

use crate::util::files::MappedFile;

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
    map: MappedFile,
    item: Node,
}

/// One parameter as stored: its Burn id, shape, and little-endian f32 bytes.
pub struct StoredParam<'a> {
    pub id: &'a str,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
    range: Range<usize>,
}

impl StoredParam<'_> {
    /// Where its bytes lie in the file, for a reader that reads them without the map.
    pub fn file_range(&self) -> Range<usize> {
        self.range.clone()
    }
}

impl Record {
    /// Maps `path` and parses its structure (not its tensors' values).
    pub fn open(path: &Path) -> Result<Self, String> {
        let map = MappedFile::open(path).map_err(|e| e.to_string())?;
        let bytes = map.bytes();
        let mut reader = Reader { bytes, at: 0 };
        let root = reader.node(0)?;
        if reader.at != bytes.len() {
            return Err(format!(
                "{} bytes follow the record",
                bytes.len() - reader.at
            ));
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
            bytes: &self.map.bytes()[range.clone()],
            range: range.clone(),
        })
    }

    /// The record field path of every parameter stored (a map with an `id` and its tensor,
    /// inline or under `param`), in file order. What the model does not declare would
    /// otherwise go unread.
    pub fn param_paths(&self) -> Vec<String> {
        let mut paths = Vec::new();
        collect_params(&self.item, &mut String::new(), &mut paths);
        paths
    }

    /// Drops the pages of `param` from this process's memory once its values are copied
    /// (mapped pages count in its RSS): a load holds the model once, not twice.
    pub fn release(&self, param: &StoredParam<'_>) {
        self.map.release(param.range.clone());
    }
}

/// Appends the paths of the parameters under `node` (at `path`) to `found`.
fn collect_params(node: &Node, path: &mut String, found: &mut Vec<String>) {
    let is_param =
        node.get("id").is_some() && (node.get("param").is_some() || node.get("bytes").is_some());
    if is_param {
        found.push(path.clone());
        return;
    }
    let mut visit = |name: &str, child: &Node, path: &mut String| {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(name);
        collect_params(child, path, found);
        path.truncate(len);
    };
    match node {
        Node::Map(fields) => fields.iter().for_each(|(k, v)| visit(k, v, path)),
        Node::Array(items) => {
            (items.iter().enumerate()).for_each(|(i, v)| visit(&i.to_string(), v, path))
        }
        _ => {}
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
