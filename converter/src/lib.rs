//! `converter`: Hugging Face checkpoints (or a GGUF) → Burn record artifacts for `runtime`.
//!
//! The binary (`main.rs`) is a thin command line over these modules; the library exists so
//! tests and the fuzz targets (`fuzz/`) reach the parsers directly.

pub mod blocks;
pub mod burnpack;
pub mod checkpoint;
pub mod convert;
pub mod digest;
pub mod finite;
pub mod gguf;
pub mod import;
pub mod names;
pub mod pooling;
pub mod quants;
pub mod record;
mod staging;
pub mod verify;
