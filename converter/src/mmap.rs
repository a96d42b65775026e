//! Read-only memory maps: checkpoints are read tensor by tensor without loading whole files.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use memmap2::Mmap;

/// A file mapped read-only into memory.
pub struct MappedFile {
    map: Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let metadata = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?;
        // A device or a FIFO has no end to map.
        anyhow::ensure!(metadata.is_file(), "{} is not a regular file", path.display());
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
