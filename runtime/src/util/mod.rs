//! The bottom layer: what every other layer may use, using nothing of this crate.
//! Reading input files within limits or mapping them ([`files`]), the artifact directory's
//! file names ([`file_names`]), the memory this process may still take ([`memory`]), huge-page
//! memory for the weights a load makes ([`arena`]), a panic inside a library turned into an
//! error (`panics`).

pub mod arena;
pub mod file_names;
pub mod files;
pub mod memory;
pub(crate) mod panics;
