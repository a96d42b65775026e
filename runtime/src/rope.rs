//! Rotary position embedding tables, in Hugging Face's `rotate_half` layout: each head's
//! first half of dimensions pairs with its second half (not adjacent pairs, as Burn's
//! `RotaryEncoding` assumes), so checkpoints are used with their q/k rows as published.
//! See transformers' `modeling_llama.apply_rotary_pos_emb`: `x * cos + rotate_half(x) * sin`,
//! which `KernelBackend::rotary` applies.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::config::LlamaConfig;

/// `cos` and `sin` of every position's rotation angles.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    /// `[positions, head_dim]`: `cos(pos * inv_freq)`, the half repeated.
    cos: Tensor<B, 2>,
    /// `[positions, head_dim]`: `sin(pos * inv_freq)`, the half repeated.
    sin: Tensor<B, 2>,
}

/// The tables' rows for the positions of one forward call, `[seq, head_dim]` each.
#[derive(Debug, Clone)]
pub struct RopeRows<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
    /// Tables for positions `0..positions` (a KV cache builds them for its capacity).
    pub fn new(config: &LlamaConfig, positions: usize, device: &B::Device) -> Self {
        let dim = config.head_dim;
        let half = dim / 2;
        // Computed in f32 in the same order as transformers, so angles round the same way.
        let theta = config.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(positions * dim);
        let mut sin = Vec::with_capacity(positions * dim);
        for pos in 0..positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| pos as f32 * f).collect();
            cos.extend(angles.iter().chain(&angles).map(|a| a.cos()));
            sin.extend(angles.iter().chain(&angles).map(|a| a.sin()));
        }
        let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [positions, dim]), device);
        Self {
            cos: table(cos),
            sin: table(sin),
        }
    }

    /// The rows for positions `start..start + seq`.
    pub fn rows(&self, start: usize, seq: usize) -> RopeRows<B> {
        let rows = |t: &Tensor<B, 2>| t.clone().narrow(0, start, seq);
        RopeRows {
            cos: rows(&self.cos),
            sin: rows(&self.sin),
        }
    }
}
