//! Minimal runtime for Llama-family models converted to Burn records by `converter`.
//!
//! Data flows one way: Hugging Face checkpoint → `converter` → artifact directory
//! ([`artifact`]) → [`generate::Generator`], which runs [`model::Llama`].

pub mod artifact;
pub mod cache;
pub mod config;
pub mod generate;
pub mod model;
pub mod params;
pub mod sampling;
pub mod tokenizer;

/// The default CPU backend: burn-flex (gemm-based), 8-10x faster than ndarray at decode.
pub type FlexBackend = burn_flex::Flex<f32>;
/// The legacy CPU backend, kept selectable for comparison.
pub type NdArrayBackend = burn_ndarray::NdArray<f32>;
