//! CPU kernels over plain slices: what the model's operations compute, with no knowledge of
//! Burn, tensors or the model (as ggml's CPU kernels know nothing of models). This crate
//! depends on no Burn crate and on no other crate of the workspace, so Cargo enforces that;
//! the runtime's `model::backend` exposes the kernels to Burn.
//!
//! Activations are `f32`; weights `f32`, `bf16` or ggml blocks; KV cache entries `f32`,
//! `f16` or `bf16`. Modules, lowest first (each uses only those above it):
//! - [`cpu`]: what this CPU can run, and the `multiversioned!` dispatch on it.
//! - [`amx`]: AMX's tile registers, configured and released around a prompt kernel.
//! - [`quant`]: ggml's block types, decoded as gguf-py decodes them, quantized as ggml does.
//! - [`stored`]: how an f32 value is stored (`f32`, `bf16`, `f16`), widened exactly.
//! - [`simd`]: vectorized element-wise math and row reductions.
//! - [`team`]: threads kept spinning while one token decodes, for its many short regions.
//! - [`block_products`]: products over quantized rows, each block decoded in registers.
//! - [`bundles`]: matrix-vector products four rows at a time, for a batch of vectors.
//! - [`int8`]: those products with the inputs rounded to 8-bit integers (the default
//!   for blocks).
//! - [`dpbf16`]: products over bf16 weights with the inputs rounded to bf16
//!   (`vdpbf16ps`, as llama.cpp's BF16 path; asked for by name).
//! - [`matvec`]: matrix-vector products split across threads with work stealing.
//! - [`panels`]: products of many rows (a prompt) reading the weight in cache-sized panels.
//! - [`linear`]: products of many rows with a weight: [`panels`] on AVX-512, else gemm.
//! - [`attention`]: causal grouped-query attention, blocked for prompts, split for a token.
//! - [`layer`]: one decoder layer for one token in one pass.

// Lowest first, as above (rustfmt.toml keeps the order).
pub mod cpu;
#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod quant;
pub mod stored;
pub mod simd;
pub mod team;
pub mod block_products;
pub mod bundles;
pub mod int8;
pub mod dpbf16;
pub mod matvec;
pub mod panels;
pub mod linear;
pub mod attention;
pub mod layer;

#[cfg(test)]
mod testing;
