//! Crash-safe output: files are written into a staging directory next to their destination
//! and moved into place only once all of them are complete.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// A directory being built. Dropped without [`Staging::commit`] (an error, a panic), it
/// removes itself, so a failed run leaves nothing behind.
pub struct Staging {
    dir: PathBuf,
    /// The destination directory, if this run created it (to remove again on failure).
    created_parent: Option<PathBuf>,
    committed: bool,
    /// The directory `dir` is in, locked for this run (released when this is dropped).
    _lock: File,
}

impl Staging {
    /// Creates an empty `dir`, removing a leftover from an earlier killed run. The directory
    /// it is in is locked first, so two runs writing the same destination can't interleave:
    /// the second fails at once. `inputs` (the files the run reads) must not be inside
    /// `dir`, which would delete them.
    pub fn create(dir: PathBuf, inputs: &[&Path]) -> Result<Self> {
        let parent = dir.parent().context("a staging directory has a parent")?;
        let created_parent = (!parent.exists()).then(|| parent.to_path_buf());
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let lock = lock(parent)?;
        if let Ok(staging) = dir.canonicalize() {
            for input in inputs {
                if input.canonicalize().is_ok_and(|i| i.starts_with(&staging)) {
                    bail!(
                        "the input {} lies in {}, where this command writes its unfinished output; choose another output directory",
                        input.display(),
                        dir.display()
                    );
                }
            }
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove leftover {}", dir.display()))?;
        }
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self {
            dir,
            created_parent,
            committed: false,
            _lock: lock,
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
    /// entirely, like an imported checkpoint). An existing `dest` is replaced only if it holds
    /// nothing but files named in `owned` (what an earlier run wrote): anything else in it
    /// is not the converter's to delete.
    pub fn commit_as_dir(mut self, dest: &Path, owned: &[&str]) -> Result<()> {
        if dest.exists() {
            let entries = std::fs::read_dir(dest)
                .with_context(|| format!("cannot read {}", dest.display()))?;
            for entry in entries {
                let name = entry?.file_name();
                if !owned.iter().any(|o| name == **o) {
                    bail!(
                        "{} exists and holds {:?}, which this command did not write; give a new directory",
                        dest.display(),
                        name
                    );
                }
            }
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
    /// `stale` files, from an earlier run, that this one does not write, are removed after
    /// the old marker, so they can't pass for part of the new output.
    pub fn commit_into(
        mut self,
        dest: &Path,
        files: &[String],
        stale: &[&str],
        marker: (&str, &str),
    ) -> Result<()> {
        let (marker_name, marker_text) = marker;
        let marker_path = dest.join(marker_name);
        for path in std::iter::once(marker_path.clone()).chain(stale.iter().map(|s| dest.join(s))) {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {}", path.display()));
                }
                _ => {}
            }
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

/// An exclusive lock on the directory `dir` (flock), held as long as the returned file is
/// open: a second writer fails at once instead of waiting or interleaving.
fn lock(dir: &Path) -> Result<File> {
    let file = File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = std::io::Error::last_os_error();
        if error.kind() == std::io::ErrorKind::WouldBlock {
            bail!("another conversion is writing into {}", dir.display());
        }
        return Err(error).with_context(|| format!("cannot lock {}", dir.display()));
    }
    Ok(file)
}

/// Flushes and fsyncs a buffered file: `BufWriter`'s drop would swallow a failed last write
/// (a full disk), leaving a short file that looks written.
pub fn finish(writer: BufWriter<File>) -> Result<()> {
    finish_keeping(writer).map(drop)
}

/// [`finish`], returning the file.
pub fn finish_keeping(writer: BufWriter<File>) -> Result<File> {
    let file = writer.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(file)
}
