//! KV cache buffers that start on a cache line.
//!
//! Why: decoding's attention reads the cache in 64-byte loads (sixteen f32 of a head's
//! key or value), and the cache rows of the models we run are whole cache lines wide, so
//! from a buffer that starts on a line every load reads one line. Burn's buffers come from
//! the allocator, which puts a large one 16 bytes past a line: every load then straddled
//! two lines, and a SmolLM2-shaped token's attention took about a third longer where the
//! cache sat in the CPU's caches (docs/BENCHMARKS.md, 2026-11-30, session 36).

use std::alloc::{self, Layout};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use burn::tensor::Bytes;
use burn_std::{AllocationController, AllocationProperty};

/// A cache line: what the buffers are aligned to.
const LINE: usize = 64;
/// The largest alignment Burn's bytes accept from a controller (cubecl-common's
/// `MAX_ALIGN`, not exported): these buffers say this, being at least as aligned.
const BURN_ALIGN: usize = std::mem::align_of::<u128>();

/// `len` zeroed bytes starting on a cache line.
pub fn zeroed_bytes(len: usize) -> Bytes {
    let controller = CacheLines::zeroed(len);
    // SAFETY: the controller's `len` bytes are all initialized (zeroed).
    unsafe { Bytes::from_controller(Box::new(controller), len) }
}

/// Zeroed memory from the global allocator, aligned to [`LINE`]; freed on drop.
struct CacheLines {
    /// Valid for `layout.size()` bytes, or dangling (and never read) when that is 0.
    ptr: NonNull<u8>,
    layout: Layout,
}

impl CacheLines {
    fn zeroed(len: usize) -> Self {
        let layout = Layout::from_size_align(len, LINE).expect("a KV cache buffer's size");
        if len == 0 {
            return Self {
                ptr: NonNull::<[u8; LINE]>::dangling().cast(),
                layout,
            };
        }
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Self { ptr, layout }
    }
}

impl AllocationController for CacheLines {
    fn alloc_align(&self) -> usize {
        BURN_ALIGN
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Other
    }

    unsafe fn memory_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: `ptr` is valid for `size` bytes (or `size` is 0), owned by this controller,
        // and borrowed mutably through it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.layout.size()) }
    }

    fn memory(&self) -> &[MaybeUninit<u8>] {
        // SAFETY: as in `memory_mut`, borrowed shared.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast(), self.layout.size()) }
    }
}

impl Drop for CacheLines {
    fn drop(&mut self) {
        if self.layout.size() != 0 {
            // SAFETY: allocated in `zeroed` with this layout, and freed only here.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_and_start_on_a_line() {
        for len in [0, 1, 64, 1000, 3 << 20] {
            let mut bytes = zeroed_bytes(len);
            assert_eq!(bytes.len(), len);
            assert!(bytes.iter().all(|&b| b == 0), "{len} bytes not zeroed");
            if len > 0 {
                assert_eq!(bytes.as_ptr() as usize % LINE, 0, "{len} bytes");
                bytes[len - 1] = 7;
                assert_eq!(bytes[len - 1], 7);
            }
        }
    }
}
