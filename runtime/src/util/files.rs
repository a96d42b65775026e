//! Reading input files with a bound: regular files only (not a device, a FIFO or a
//! directory, which could be read forever), and no more bytes than the file may hold, so
//! what a file claims can't make us read or allocate without end. Large inputs (weights)
//! are mapped instead ([`MappedFile`]), read a tensor at a time.

use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};

/// Errors reading a bounded input file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error("{path} has {bytes} bytes, more than the {limit} such a file may have")]
    TooLarge {
        path: PathBuf,
        bytes: u64,
        limit: u64,
    },
    #[error("{path} is not valid UTF-8 (byte {at})")]
    NotUtf8 { path: PathBuf, at: usize },
}

impl FileError {
    /// Whether the file does not exist (optional files may be absent).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The bytes of the regular file `path`, refused if it has more than `limit`.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let io = |error| FileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = open_regular(path)?;
    let metadata = file.metadata().map_err(io)?;
    check_size(path, metadata.len(), limit)?;
    // The file may grow after the check: read one byte more than allowed to see it.
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io)?;
    check_size(path, bytes.len() as u64, limit)?;
    Ok(bytes)
}

/// The first `limit` bytes at most of the regular file `path`, cut back to whole UTF-8
/// characters, for text whose beginning is all that is needed.
pub fn read_text_prefix(path: &Path, limit: u64) -> Result<String, FileError> {
    let io = |error| FileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    let read = file.take(limit).read_to_end(&mut bytes).map_err(io)?;
    let cut = read as u64 == limit;
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        // A character cut by the limit is dropped; anything else is invalid text.
        Err(e) if cut && e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            Ok(String::from_utf8(bytes).expect("valid up to here"))
        }
        Err(e) => Err(FileError::NotUtf8 {
            path: path.to_path_buf(),
            at: e.utf8_error().valid_up_to(),
        }),
    }
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64) -> Result<String, FileError> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|e| FileError::NotUtf8 {
        path: path.to_path_buf(),
        at: e.utf8_error().valid_up_to(),
    })
}

/// Opens `path` if it is a regular file. Checked before opening too: opening a FIFO for
/// reading waits for a writer, which may never come.
pub fn open_regular(path: &Path) -> Result<std::fs::File, FileError> {
    let io = |error| FileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let not_regular = || FileError::NotRegular {
        path: path.to_path_buf(),
    };
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path).map_err(io)?;
    // The path may have been replaced in between.
    if !file.metadata().map_err(io)?.is_file() {
        return Err(not_regular());
    }
    Ok(file)
}

/// A regular file mapped read-only into memory.
pub struct MappedFile {
    map: Mmap,
    file: std::fs::File,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<Self, FileError> {
        // A device or a FIFO has no end to map.
        let file = open_regular(path)?;
        // SAFETY: the map is read-only. Another process truncating the file while it is
        // mapped could fault, and one writing into it in place would change what we read;
        // that is the same contract every mmap-based model loader (safetensors, llama.cpp)
        // accepts, and it lasts as long as the model when the weights file's tensors are
        // the map (`weights::file`). The converter never writes a file in place: it writes a
        // staging directory and renames it, so a file mapped here keeps its old contents.
        let map = unsafe { Mmap::map(&file) }.map_err(|error| FileError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(Self { map, file })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The open file, to read it other than through the map ([`read_to_memory`]).
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Maps every page of the file into this process now, in huge pages where the kernel
    /// can: a reader that keeps the map then meets no page fault on first use, the cost
    /// paid where it is a load, not in the first prompt. Failing only costs the faults
    /// later, so errors are ignored.
    ///
    /// Huge pages: `MADV_HUGEPAGE` lets a page not yet cached be read into a 2 MiB folio
    /// mapped by one entry; what is already cached keeps the folios it has (large if it
    /// was read sequentially, 4 KiB if written or read a page at a time). Decoding streams
    /// every weight per token, and reads them faster over huge pages (docs/BENCHMARKS.md).
    pub fn populate(&self) {
        // SAFETY: the whole of this live read-only file mapping.
        unsafe { populate_mapped(&self.map) }
    }

    /// Drops the pages of `range` from this process's memory (mapped pages count in its
    /// RSS): a reader done with a tensor keeps one tensor's pages, not the whole file's.
    /// Reading them again reloads them from the file; failing to drop them only costs
    /// memory, so errors are ignored.
    pub fn release(&self, range: Range<usize>) {
        let end = range.end.min(self.map.len());
        if range.start < end {
            // SAFETY: a read-only private file mapping: dropped pages are read back from
            // the file, so no data is lost and no reference sees a change.
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

/// The first `len` bytes of `file`, read into anonymous memory asked for in 2 MiB pages
/// (`MADV_HUGEPAGE`), read-only once written; `read` is told the bytes of each 64 MiB piece
/// (the pieces are read on every thread of the current rayon pool, each faulting in its
/// own pages). Read with `pread`, not through a map: the process holds the copy alone,
/// never the file's pages beside it, and the page cache keeps the file for the next start.
///
/// For weights that decode streams every token: in some VMs (this project's Firecracker
/// hosts, with free page reporting) pages the host filled from disk read slower than
/// memory the guest wrote itself (docs/BENCHMARKS.md, 2026-11-30).
pub fn read_to_memory(
    file: &std::fs::File,
    len: usize,
    read: impl Fn(u64) + Sync,
) -> std::io::Result<Mmap> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    const PIECE: usize = 64 << 20;
    let mut copy = huge_page_memory(len)?;
    (copy[..len].par_chunks_mut(PIECE).enumerate()).try_for_each(|(i, to)| {
        // A file cut short since it was measured ends in an error here, not in zeros.
        file.read_exact_at(to, (i * PIECE) as u64)?;
        read(to.len() as u64);
        Ok::<_, std::io::Error>(())
    })?;
    copy.make_read_only()
}

/// `len` bytes (at least one) of zeroed anonymous memory, asked for in 2 MiB pages
/// (`MADV_HUGEPAGE`; THP is `madvise` on many hosts, this project's too): how weights that
/// decoding streams are best kept, and what a probe of the rate they can be read at
/// should read.
pub fn huge_page_memory(len: usize) -> std::io::Result<memmap2::MmapMut> {
    let mut memory = memmap2::MmapOptions::new().len(len.max(1)).map_anon()?;
    // SAFETY: advice on the whole of a live anonymous mapping this function owns; a
    // refusal only costs speed.
    unsafe {
        libc::madvise(
            memory.as_mut_ptr().cast(),
            memory.len(),
            libc::MADV_HUGEPAGE,
        )
    };
    Ok(memory)
}

/// [`MappedFile::populate`] for `bytes`, the whole of a file mapping.
///
/// # Safety
/// `bytes` must be a read-only private mapping of a file, from its first page.
pub unsafe fn populate_mapped(bytes: &[u8]) {
    // SAFETY: the caller's promise.
    unsafe { populate_mapped_watched(bytes, |_| ()) }
}

/// [`populate_mapped`], telling `read` the bytes of each piece mapped as it goes (pieces of
/// 64 MiB, so that a progress bar moves while a large file is read from disk).
///
/// # Safety
/// `bytes` must be a read-only private mapping of a file, from its first page.
pub unsafe fn populate_mapped_watched(bytes: &[u8], mut read: impl FnMut(u64)) {
    const PIECE: usize = 64 << 20;
    let (ptr, len) = (bytes.as_ptr() as *mut libc::c_void, bytes.len());
    if len == 0 {
        return;
    }
    // SAFETY: advice on a live read-only mapping (the caller's promise); none of it
    // changes its contents. MADV_POPULATE_READ is Linux 5.14's; older kernels refuse it,
    // and MADV_WILLNEED then at least starts reading the file into the page cache. Huge
    // pages are asked for the whole map at once: on pieces, the map would be split.
    unsafe {
        libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        for start in (0..len).step_by(PIECE) {
            let piece = PIECE.min(len - start);
            let at = ptr.byte_add(start);
            if libc::madvise(at, piece, libc::MADV_POPULATE_READ) != 0 {
                libc::madvise(ptr, len, libc::MADV_WILLNEED);
                return;
            }
            read(piece as u64);
        }
    }
}

/// Drops from this process's memory the whole pages inside `bytes`, which must lie in a
/// read-only private file mapping (a [`MappedFile`]'s): a loader done with a tensor it
/// converted keeps the result, not the source's pages too. Dropped pages read again are
/// reloaded from the file; failing to drop them only costs memory, so errors are ignored.
///
/// # Safety
/// `bytes` must lie in a read-only private mapping of a file (madvise's `MADV_DONTNEED`
/// on anonymous memory would zero it).
pub unsafe fn release_mapped(bytes: &[u8]) {
    const PAGE: usize = 4096;
    let start = (bytes.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (bytes.as_ptr() as usize + bytes.len()) / PAGE * PAGE;
    if start < end {
        // SAFETY: the caller's promise; whole pages inside `bytes`.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}

/// The mapped bytes, for owners that keep a map alive while slices of it are in use
/// (`bytes::Bytes::from_owner`, as `weights::file` hands tensors out over its map).
impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

fn check_size(path: &Path, bytes: u64, limit: u64) -> Result<(), FileError> {
    if bytes > limit {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            bytes,
            limit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_fifos_and_large_files() {
        let tmp = tempfile::tempdir().unwrap();
        let big = tmp.path().join("big");
        std::fs::write(&big, vec![b'x'; 100]).unwrap();
        assert!(matches!(
            read_bounded(&big, 99),
            Err(FileError::TooLarge { bytes: 100, .. })
        ));
        assert_eq!(read_bounded(&big, 100).unwrap().len(), 100);
        for device in ["/dev/zero", "/dev/urandom", "/tmp"] {
            let err = read_bounded(Path::new(device), 1 << 20).unwrap_err();
            assert!(
                matches!(err, FileError::NotRegular { .. }),
                "{device}: {err}"
            );
        }
        let missing = read_bounded(&tmp.path().join("missing"), 1).unwrap_err();
        assert!(missing.is_not_found());
    }

    /// Every byte read in the right place, across pieces read on several threads; a file
    /// shorter than asked is an error, not zeros.
    #[test]
    fn a_file_read_into_memory_is_its_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("weights");
        let len = (64 << 20) * 2 + 12345; // three pieces, the last short
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let read = std::sync::atomic::AtomicU64::new(0);
        let copy = read_to_memory(&file, len, |n| {
            read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        })
        .unwrap();
        assert!(copy[..] == bytes[..]);
        assert_eq!(read.into_inner(), len as u64);
        let err = read_to_memory(&file, len + 1, |_| ()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_prefix_ends_on_a_whole_character() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("text");
        std::fs::write(&path, "aé日本").unwrap(); // 1 + 2 + 3 + 3 bytes
        assert_eq!(read_text_prefix(&path, 5).unwrap(), "aé");
        assert_eq!(read_text_prefix(&path, 6).unwrap(), "aé日");
        assert_eq!(read_text_prefix(&path, 100).unwrap(), "aé日本");
        std::fs::write(&path, b"ok\xff rest").unwrap();
        assert!(matches!(
            read_text_prefix(&path, 100),
            Err(FileError::NotUtf8 { at: 2, .. })
        ));
    }
}
