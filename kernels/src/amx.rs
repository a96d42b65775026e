//! AMX's tiles (the `amx` tier), as the prompt kernels use them: eight tile registers of up
//! to sixteen rows of 64 bytes, configured per thread before use and released after.
//! Rust has no stable AMX intrinsics, so the kernels' tile code is inline assembly, and no
//! other code touches the tile registers.

use std::arch::asm;

use crate::cpu::{self, Tier};

/// Whether this CPU has the tiles and this process may use them (the `amx` tier).
pub fn runs() -> bool {
    cpu::tier() >= Tier::Amx
}

/// The calling thread's tiles configured with given shapes, released when dropped (a
/// released thread's tile state costs nothing to save on a context switch).
pub(crate) struct Tiles(());

impl Tiles {
    /// Tile `t` of `shapes[t].0` rows of `shapes[t].1` bytes.
    ///
    /// # Panics
    /// Unless [`runs`], and every shape is at most 16 rows of 64 bytes.
    pub(crate) fn configure(shapes: [(u8, u16); 8]) -> Self {
        assert!(runs(), "no AMX tiles here");
        assert!(
            shapes
                .iter()
                .all(|&(rows, bytes)| rows <= 16 && bytes <= 64)
        );
        /// Palette 1; tile `t`'s bytes a row at 16 + 2 t, its rows at 48 + t.
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut config = Config([0; 64]);
        config.0[0] = 1;
        for (t, (rows, bytes)) in shapes.into_iter().enumerate() {
            config.0[16 + 2 * t..][..2].copy_from_slice(&bytes.to_le_bytes());
            config.0[48 + t] = rows;
        }
        // SAFETY: the AMX tier (asserted); the configuration is 64 valid bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}
