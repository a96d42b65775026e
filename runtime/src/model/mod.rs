//! The model: config.json resolved into the switches of one decoder ([`config`]), rotary
//! tables ([`rope`]), the model's operations on Burn tensors ([`backend`], which hands
//! burn-flex's to the `kernels` crate), the KV cache ([`cache`]), the Burn module and its
//! forward passes ([`llama`]), and its parameters listed by path ([`params`]).
//!
//! Uses [`crate::util`] and the `kernels` crate; nothing here reads an artifact directory or
//! knows text.

pub mod backend;
pub mod cache;
pub mod config;
pub mod llama;
pub mod params;
pub mod rope;

#[cfg(test)]
pub(crate) mod testing;
