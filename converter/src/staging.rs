//! Crash-safe output: files are written into a staging directory next to their destination
//! and moved into place only once all of them are complete.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A directory being built. Dropped without [`Staging::commit`] (an error, a panic), it
/// removes itself, so a failed run leaves nothing behind.
pub struct Staging {
    dir: PathBuf,
    /// The destination directory, if this run created it (to remove again on failure).
    created_parent: Option<PathBuf>,
    committed: bool,
}

impl Staging {
    /// Creates an empty `dir`, removing a leftover from an earlier killed run.
    pub fn create(dir: PathBuf) -> Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove leftover {}", dir.display()))?;
        }
        let created_parent = dir.parent().filter(|p| !p.exists()).map(Path::to_path_buf);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self {
            dir,
            created_parent,
            committed: false,
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Creates `name` in the staging directory for buffered writing.
    pub fn create_file(&self, name: &str) -> Result<BufWriter<File>> {
        let path = self.path(name);
        let file =
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(BufWriter::with_capacity(1 << 20, file))
    }

    /// Writes `name` in full.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let mut writer = self.create_file(name)?;
        writer.write_all(bytes)?;
        finish(writer).with_context(|| format!("cannot write {}", self.path(name).display()))
    }

    /// Replaces the directory `dest` with the staged one (for directories the converter owns
    /// entirely, like an imported checkpoint).
    pub fn commit_as_dir(mut self, dest: &Path) -> Result<()> {
        if dest.exists() {
            std::fs::remove_dir_all(dest)
                .with_context(|| format!("cannot replace {}", dest.display()))?;
        }
        std::fs::rename(&self.dir, dest)
            .with_context(|| format!("cannot move {} to {}", self.dir.display(), dest.display()))?;
        self.committed = true;
        Ok(())
    }

    /// Moves the staged `files` into `dest`, then writes `marker` (`name`, contents) last.
    /// The old marker is removed first, so at every instant `dest` either has a marker that
    /// describes its files or has none.
    pub fn commit_into(
        mut self,
        dest: &Path,
        files: &[String],
        marker: (&str, &str),
    ) -> Result<()> {
        let (marker_name, marker_text) = marker;
        let marker_path = dest.join(marker_name);
        match std::fs::remove_file(&marker_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", marker_path.display()));
            }
            _ => {}
        }
        for name in files {
            std::fs::rename(self.path(name), dest.join(name))
                .with_context(|| format!("cannot move {name} into {}", dest.display()))?;
        }
        self.write(marker_name, marker_text.as_bytes())?;
        std::fs::rename(self.path(marker_name), &marker_path)
            .with_context(|| format!("cannot write {}", marker_path.display()))?;
        std::fs::remove_dir_all(&self.dir).ok();
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            std::fs::remove_dir_all(&self.dir).ok();
            if let Some(parent) = &self.created_parent {
                std::fs::remove_dir(parent).ok(); // only if empty
            }
        }
    }
}

/// Flushes and fsyncs a buffered file: `BufWriter`'s drop would swallow a failed last write
/// (a full disk), leaving a short file that looks written.
pub fn finish(writer: BufWriter<File>) -> Result<()> {
    let file = writer.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(())
}
