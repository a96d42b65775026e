//! CPU kernels over plain `f32` slices (weights f32 or bf16): what the model's operations compute, with no
//! knowledge of Burn, tensors or the model (as ggml's CPU kernels know nothing of models).
//! [`crate::backend`] exposes them to Burn.
//!
//! - [`simd`]: vectorized element-wise math and row reductions, multiversioned for AVX-512.
//! - [`team`]: threads kept spinning while one token decodes, for its many short regions.
//! - [`matvec`]: matrix-vector products split across threads with work stealing.
//! - `blocks`: those products over quantized rows, each block decoded in registers.
//! - [`int8`]: those products with the inputs rounded to 8-bit integers (`--matmul int8`).
//! - [`linear`]: products of many rows (a prompt) with a weight: [`panels`] on AVX-512, else gemm.
//! - [`panels`]: those products reading the weight in cache-sized panels, one FMA chain per output.
//! - [`attention`]: causal grouped-query attention, blocked for prompts, split for a token.
//! - [`layer`]: one decoder layer for one token in one pass.

pub mod attention;
mod blocks;
pub mod int8;
pub mod layer;
pub mod linear;
pub mod matvec;
pub mod panels;
pub mod simd;
pub mod team;
