//! Rotary position embedding tables, in Hugging Face's `rotate_half` layout: each head's
//! first half of dimensions pairs with its second half (not adjacent pairs, as Burn's
//! `RotaryEncoding` assumes), so checkpoints are used with their q/k rows as published.
//! See transformers' `modeling_llama.apply_rotary_pos_emb`: `x * cos + rotate_half(x) * sin`,
//! which `KernelBackend::rotary` applies.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::model::config::{LlamaConfig, RopeScaling, Rotation, rope_frequencies as frequencies};

/// `cos` and `sin` of every position's rotation angles: the model's table, and the
/// sliding-window layers' own if they have one (Gemma 3).
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    global: RopeRows<B>,
    sliding: Option<RopeRows<B>>,
}

/// A table's rows, `[positions, head_dim]` each: `cos(pos * inv_freq)` and
/// `sin(pos * inv_freq)`, the half repeated.
#[derive(Debug, Clone)]
pub struct RopeRows<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
}

/// Every table's rows for the positions of one forward call.
#[derive(Debug, Clone)]
pub struct Rotations<B: Backend> {
    global: RopeRows<B>,
    sliding: Option<RopeRows<B>>,
}

impl<B: Backend> Rotations<B> {
    /// The rows a layer of `rotation` turns by (a layer without RoPE gets the model's, which
    /// it does not apply).
    pub fn of(&self, rotation: Rotation) -> &RopeRows<B> {
        match (rotation, &self.sliding) {
            (Rotation::Sliding, Some(sliding)) => sliding,
            _ => &self.global,
        }
    }
}

impl<B: Backend> RopeRows<B> {
    /// The table of `inv_freq` (each angle's cos and sin times `scale`) for positions
    /// `0..positions`.
    fn table(inv_freq: &[f32], scale: f32, positions: usize, device: &B::Device) -> Self {
        let dim = 2 * inv_freq.len();
        let mut cos = Vec::with_capacity(positions * dim);
        let mut sin = Vec::with_capacity(positions * dim);
        for pos in 0..positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| pos as f32 * f).collect();
            cos.extend(angles.iter().chain(&angles).map(|a| a.cos() * scale));
            sin.extend(angles.iter().chain(&angles).map(|a| a.sin() * scale));
        }
        let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [positions, dim]), device);
        Self {
            cos: table(cos),
            sin: table(sin),
        }
    }

    /// Rows `start..start + seq`.
    fn narrow(&self, start: usize, seq: usize) -> Self {
        let rows = |t: &Tensor<B, 2>| t.clone().narrow(0, start, seq);
        Self {
            cos: rows(&self.cos),
            sin: rows(&self.sin),
        }
    }
}

impl<B: Backend> Rope<B> {
    /// Tables for positions `0..positions` (a KV cache builds them for its capacity).
    pub fn new(config: &LlamaConfig, positions: usize, device: &B::Device) -> Self {
        let (dim, scaling) = (config.head_dim, &config.rope_scaling);
        let (inv_freq, scale) = frequencies(dim, config.rope_theta, scaling);
        let sliding = config.sliding_rope_theta.map(|theta| {
            let (inv_freq, scale) = frequencies(dim, theta, &RopeScaling::None);
            RopeRows::table(&inv_freq, scale, positions, device)
        });
        Self {
            global: RopeRows::table(&inv_freq, scale, positions, device),
            sliding,
        }
    }

    /// How many positions the tables cover.
    pub fn positions(&self) -> usize {
        self.global.cos.dims()[0]
    }

    /// How many tables there are (bytes: `2 * 4 * head_dim` a position each).
    pub fn tables(config: &LlamaConfig) -> u64 {
        1 + u64::from(config.sliding_rope_theta.is_some())
    }

    /// The rows for positions `start..start + seq`.
    pub fn rows(&self, start: usize, seq: usize) -> Rotations<B> {
        Rotations {
            global: self.global.narrow(start, seq),
            sliding: self.sliding.as_ref().map(|t| t.narrow(start, seq)),
        }
    }
}
