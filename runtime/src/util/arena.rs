//! Memory for the weights a load makes itself (quantized to blocks, widened, rounded or laid
//! out from the record), packed one after another into anonymous memory asked for in 2 MiB
//! pages, as [`files::read_to_memory`] keeps weights.bin.
//!
//! Why: decoding streams every weight once a token, and from 4 KiB pages it reads them at
//! about half the rate (a SmolLM2-shaped q4_0 model's products, docs/BENCHMARKS.md
//! 2026-11-30 session 34): each page is a TLB miss, and the hardware prefetchers stop at
//! page boundaries. The allocator's memory is in 4 KiB pages where THP is `madvise`, and a
//! small model's matrices (a few hundred KiB each) would not fill a 2 MiB page apiece, so
//! they are packed into large chunks instead.
//!
//! [`files::read_to_memory`]: super::files::read_to_memory

use std::sync::Arc;

use memmap2::MmapMut;

use super::files::huge_page_memory;

/// Bytes a chunk holds unless one piece needs more.
const CHUNK: usize = 64 << 20;
/// Each piece starts on a cache line (the kernels' loads are 64 bytes wide).
const ALIGN: usize = 64;

/// Hands out pieces of large huge-page chunks, each holding a copy of bytes given to it.
#[derive(Default)]
pub struct Arena {
    chunk: Option<Chunk>,
}

/// One chunk: its map (kept alive by every piece of it) and the bytes handed out so far.
struct Chunk {
    map: Arc<MmapMut>,
    /// The map's first byte, taken before the map was shared: pieces are written and read
    /// through pointers, never through a reference to the whole map.
    base: *mut u8,
    len: usize,
    used: usize,
}

// SAFETY: `base` points into `map`, which the chunk owns (through the Arc); the chunk
// only writes below `len` and at or past `used`, where no piece handed out reads.
unsafe impl Send for Chunk {}

impl Arena {
    /// A copy of `bytes` in huge-page memory, shared as [`bytes::Bytes`] (the chunk is freed
    /// when its last piece is).
    pub fn hold(&mut self, bytes: &[u8]) -> std::io::Result<bytes::Bytes> {
        let len = bytes.len();
        let fits = |c: &Chunk| c.used.next_multiple_of(ALIGN) + len <= c.len;
        if !self.chunk.as_ref().is_some_and(fits) {
            let mut map = huge_page_memory(len.max(CHUNK))?;
            let base = map.as_mut_ptr();
            let len = map.len();
            self.chunk = Some(Chunk {
                map: Arc::new(map),
                base,
                len,
                used: 0,
            });
        }
        let chunk = self
            .chunk
            .as_mut()
            .expect("a chunk with room was just made");
        let at = chunk.used.next_multiple_of(ALIGN);
        // SAFETY: `at + len <= chunk.len` (checked above), and no piece covers bytes at or
        // past `used`: this range is written here once, before its piece exists.
        let ptr = unsafe {
            let ptr = chunk.base.add(at);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, len);
            ptr
        };
        chunk.used = at + len;
        Ok(bytes::Bytes::from_owner(Piece {
            _map: chunk.map.clone(),
            ptr,
            len,
        }))
    }
}

/// `len` bytes at `ptr` in a chunk's map, which this piece keeps alive.
struct Piece {
    _map: Arc<MmapMut>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes at `ptr` are written once before the piece is made and never again,
// and live as long as `_map`.
unsafe impl Send for Piece {}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes written before this piece was made, in a map it keeps alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_their_bytes_aligned_in_shared_chunks() {
        let mut arena = Arena::default();
        let pieces: Vec<(Vec<u8>, bytes::Bytes)> = [3usize, 100, 4096, 40 << 20, 30 << 20, 5]
            .into_iter()
            .enumerate()
            .map(|(i, len)| {
                let bytes: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7) as u8).collect();
                let held = arena.hold(&bytes).unwrap();
                (bytes, held)
            })
            .collect();
        for (bytes, held) in &pieces {
            assert_eq!(held.as_ref(), bytes.as_slice());
            assert_eq!(held.as_ptr() as usize % ALIGN, 0);
        }
        // One after another in a chunk, each on the next cache line; the 30 MiB piece does
        // not fit the first chunk's rest and starts a second, which the last one follows.
        let at = |i: usize| pieces[i].1.as_ptr() as usize;
        assert_eq!(at(1) - at(0), ALIGN);
        assert_eq!(at(2) - at(1), 128);
        assert_eq!(at(3) - at(2), 4096);
        assert_eq!(at(5).wrapping_sub(at(4)), 30 << 20);
        assert!(!(at(3)..at(3) + (40 << 20) + 64).contains(&at(4)));
        // Dropping the arena and all but one piece leaves that piece readable.
        let (bytes, held) = pieces.into_iter().nth(3).unwrap();
        drop(arena);
        assert_eq!(held.as_ref(), bytes.as_slice());
    }
}
