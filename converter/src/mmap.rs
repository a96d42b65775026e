//! Read-only memory maps: checkpoints are read tensor by tensor without loading whole files.

use std::path::Path;

use anyhow::{Context, Result};
use memmap2::Mmap;
use runtime::files::open_regular;

/// A file mapped read-only into memory.
pub struct MappedFile {
    map: Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<Self> {
        // A device or a FIFO has no end to map.
        let file = open_regular(path)?;
        // SAFETY: the map is read-only and private to this process. Another process
        // truncating the file while we read it could fault; that is the same contract every
        // mmap-based model loader (safetensors, llama.cpp) accepts for checkpoints.
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        Ok(Self { map })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
