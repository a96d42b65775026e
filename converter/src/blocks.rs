//! blocks.safetensors: a quantized GGUF's projections as their ggml blocks, beside the
//! checkpoint's f32 model.safetensors, which holds exactly the values they decode to.
//! `import-gguf` writes it; `convert` stores each tensor of it verbatim in weights.bin
//! (`runtime::weights::file::StoredBlocks`) once checked against the record, so a loaded
//! model computes on the GGUF's own blocks. A GGUF converted in one step gives `convert` the
//! same blocks straight from the GGUF ([`BlocksFile::of_gguf`]), the file never written.
//!
//! Each tensor is U8 `[d_out, row bytes]` under its Hugging Face name: a row is one output's
//! `d_in` inputs as whole blocks, the rows in model.safetensors's order (q/k un-permuted,
//! whole rows moved). The safetensors metadata maps each tensor's name to its ggml type
//! (`Q8_0`, `Q4_0`, `Q5_0`, `Q4_K`, `Q6_K`: the types the runtime keeps, `BlockType`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use anyhow::{Context, Result, bail};
use kernels::quant::BlockType;
use runtime::util::files::MappedFile;
use safetensors::{Dtype, SafeTensors};

use crate::import::Imported;

/// Its name, beside model.safetensors (`import-gguf` writes it).
pub use crate::import::BLOCKS_FILE as FILE_NAME;

/// One projection's blocks in the file.
#[derive(Debug, Clone)]
pub struct BlockTensor {
    pub ty: BlockType,
    /// `[d_out, row bytes]`.
    pub shape: [usize; 2],
    place: Place,
}

#[derive(Debug, Clone)]
enum Place {
    /// Its bytes in the file.
    File(Range<usize>),
    /// Its index in [`Imported::kept`].
    Kept(usize),
}

impl BlockTensor {
    /// Where its blocks lie in the file, for a tensor [`read_header`] found.
    pub fn range(&self) -> Option<Range<usize>> {
        match &self.place {
            Place::File(range) => Some(range.clone()),
            Place::Kept(_) => None,
        }
    }
}

/// An open blocks.safetensors, its header checked; or the one a GGUF would import as.
pub struct BlocksFile<'a> {
    source: Blocks<'a>,
    /// By Hugging Face name.
    pub tensors: BTreeMap<String, BlockTensor>,
}

/// Where a [`BlocksFile`]'s bytes are.
enum Blocks<'a> {
    File(MappedFile),
    /// Made from the GGUF's own, `tensors` in the order of [`Imported::kept`].
    Gguf(&'a Imported),
}

impl<'a> BlocksFile<'a> {
    /// The blocks file of the checkpoint in `dir`, if it has one. Every tensor must be U8
    /// rows of whole blocks of a type named in the metadata, and every type a tensor's.
    pub fn open(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(FILE_NAME);
        if !path.exists() {
            return Ok(None);
        }
        let file = MappedFile::open(&path)?;
        let tensors =
            read_header(file.bytes()).with_context(|| format!("{}: not valid", path.display()))?;
        let source = Blocks::File(file);
        Ok(Some(Self { source, tensors }))
    }

    /// The blocks file `import-gguf` writes of `gguf`, if it writes one.
    pub fn of_gguf(gguf: &'a Imported) -> Option<Self> {
        let tensors = (gguf.kept().iter().enumerate())
            .map(|(index, kept)| {
                let tensor = BlockTensor {
                    ty: kept.ty,
                    shape: kept.shape,
                    place: Place::Kept(index),
                };
                (kept.hf_name.clone(), tensor)
            })
            .collect::<BTreeMap<_, _>>();
        let source = Blocks::Gguf(gguf);
        (!tensors.is_empty()).then_some(Self { source, tensors })
    }

    /// The blocks of `tensor`: over the map, or from the GGUF (q/k rows un-permuted).
    pub fn bytes(&self, tensor: &BlockTensor) -> Result<Cow<'_, [u8]>> {
        match (&self.source, &tensor.place) {
            (Blocks::File(file), Place::File(range)) => {
                Ok(Cow::Borrowed(&file.bytes()[range.clone()]))
            }
            (Blocks::Gguf(gguf), &Place::Kept(index)) => gguf.blocks(&gguf.kept()[index]),
            _ => unreachable!("a file's tensors are placed in it"),
        }
    }
}

/// The tensors of a blocks file `bytes`, checked.
pub fn read_header(bytes: &[u8]) -> Result<BTreeMap<String, BlockTensor>> {
    let (header_len, metadata) = SafeTensors::read_metadata(bytes)?;
    let data_start = 8 + header_len;
    let types = metadata.metadata().clone().unwrap_or_default();
    let mut tensors = BTreeMap::new();
    for (name, info) in metadata.tensors() {
        let Some(type_name) = types.get(&name) else {
            bail!("tensor {name} has no ggml type in the metadata");
        };
        let Some(ty) = BlockType::KEPT.into_iter().find(|t| t.name() == type_name) else {
            let kept: Vec<&str> = BlockType::KEPT.iter().map(|t| t.name()).collect();
            bail!(
                "tensor {name} has ggml type {type_name:?}, not one kept as blocks ({})",
                kept.join(", ")
            );
        };
        let &[rows, row_bytes] = info.shape.as_slice() else {
            bail!(
                "tensor {name} has shape {:?}, not [rows, row bytes]",
                info.shape
            );
        };
        if info.dtype != Dtype::U8 || !row_bytes.is_multiple_of(ty.bytes()) {
            bail!(
                "tensor {name} is {:?} rows of {row_bytes}, not bytes of whole {ty} blocks ({} bytes each)",
                info.dtype,
                ty.bytes()
            );
        }
        let (start, end) = info.data_offsets;
        let tensor = BlockTensor {
            ty,
            shape: [rows, row_bytes],
            place: Place::File(data_start + start..data_start + end),
        };
        tensors.insert(name, tensor);
    }
    if let Some(name) = types.keys().find(|name| !tensors.contains_key(*name)) {
        bail!("the metadata gives a type for {name}, which is not a tensor of the file");
    }
    Ok(tensors)
}
