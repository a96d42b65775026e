//! Read-only memory maps: checkpoints are read tensor by tensor without loading whole files.

use std::path::Path;

use anyhow::{Context, Result};
use memmap2::{Mmap, UncheckedAdvice};
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

    /// Drops the pages of `range` from this process's memory (they count in its RSS while
    /// mapped): a converter done with a tensor keeps one tensor's pages, not the whole
    /// checkpoint's. Reading them again reloads them from the file; failing to drop them
    /// only costs memory, so errors are ignored.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.map.len());
        if range.start < end {
            // SAFETY: the map is a read-only private file mapping: dropped pages are read
            // back from the file, so no data is lost and no reference sees a change.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    UncheckedAdvice::DontNeed,
                    range.start,
                    end - range.start,
                )
            };
        }
    }
}
