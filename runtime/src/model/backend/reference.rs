//! Each [`KernelBackend`](super::KernelBackend) operation composed of ordinary Burn tensor
//! ops, as transformers writes it: the defaults every backend starts from, and the
//! definitions the fused kernels are tested against.

use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kernels::attention::Heads;
use kernels::layer::Activation;

use super::KvDtype;
use crate::model::rope::RopeRows;

/// `x: [batch, seq, d_in]` times `weight: [d_in, d_out]`, as one 2-D matrix product
/// (burn-flex's batched path handles a column-major weight poorly).
pub fn linear<B: Backend>(x: Tensor<B, 3>, weight: Tensor<B, 2>) -> Tensor<B, 3> {
    let [batch, seq, d_in] = x.dims();
    let d_out = weight.dims()[1];
    x.reshape([batch * seq, d_in])
        .matmul(weight)
        .reshape([batch, seq, d_out])
}

/// `activation(gate) * up`; GELU-tanh as PyTorch writes it,
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn glu<B: Backend>(
    gate: Tensor<B, 3>,
    up: Tensor<B, 3>,
    activation: Activation,
) -> Tensor<B, 3> {
    match activation {
        Activation::Silu => silu(gate) * up,
        Activation::GeluTanh => {
            let cube = gate.clone() * gate.clone() * gate.clone();
            let inner = (gate.clone() + cube * 0.044_715) * (2.0 / std::f64::consts::PI).sqrt();
            gate * 0.5 * (inner.tanh() + 1.0) * up
        }
    }
}

/// `x / sqrt(mean(x²) + epsilon) * gamma` over the last axis, as burn-nn's `RmsNorm` computes it.
pub fn rms_norm<B: Backend>(x: Tensor<B, 3>, gamma: Tensor<B, 1>, epsilon: f64) -> Tensor<B, 3> {
    let rms = (x.clone().square().mean_dim(2) + epsilon).sqrt();
    (x / rms) * gamma.unsqueeze()
}

/// `(x * cos + rotate_half(x) * sin) * scale` for every head, as transformers'
/// `apply_rotary_pos_emb` writes it.
pub fn rotary<B: Backend>(x: Tensor<B, 3>, rope: &RopeRows<B>, scale: f32) -> Tensor<B, 3> {
    let [batch, seq, width] = x.dims();
    let [_, head_dim] = rope.cos.dims();
    let half = head_dim / 2;
    let heads = x.reshape([batch, seq, width / head_dim, head_dim]);
    // rotate_half(x) = cat(-x[half..], x[..half])
    let rotated = Tensor::cat(
        vec![
            -heads.clone().narrow(3, half, half),
            heads.clone().narrow(3, 0, half),
        ],
        3,
    );
    let table = |t: &Tensor<B, 2>| t.clone().reshape([1, seq, 1, head_dim]);
    ((heads * table(&rope.cos) + rotated * table(&rope.sin)) * scale).reshape([batch, seq, width])
}

/// `buffer` with `rows` written over its positions `start..`, by Burn's `slice_assign`.
pub fn write_rows<B: Backend>(
    buffer: Tensor<B, 3>,
    start: usize,
    rows: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let [batch, seq, width] = rows.dims();
    buffer.slice_assign([0..batch, start..start + seq, 0..width], rows)
}

/// `x` with every value rounded to the nearest `dtype` stores, in f32.
pub fn round<B: Backend>(x: Tensor<B, 3>, dtype: KvDtype) -> Tensor<B, 3> {
    if dtype == KvDtype::F32 {
        return x;
    }
    let (shape, device) = (x.dims(), x.device());
    let values = x.into_data().convert::<f32>().into_vec::<f32>();
    let values: Vec<f32> = values
        .expect("f32 values after convert")
        .into_iter()
        .map(|x| dtype.round(x))
        .collect();
    Tensor::from_data(TensorData::new(values, shape), &device)
}

/// Causal attention: each group of query heads folded into the rows of its key/value head,
/// full score matrices, an additive causal mask (sliding-window too), softmax.
pub fn attention<B: Backend>(
    queries: Tensor<B, 3>,
    keys: Tensor<B, 3>,
    values: Tensor<B, 3>,
    heads: Heads,
    window: Option<usize>,
) -> Tensor<B, 3> {
    let Heads {
        n_heads,
        n_kv_heads: n_kv,
        head_dim: hd,
    } = heads;
    let [batch, seq, _] = queries.dims();
    let total = keys.dims()[1];
    let group = n_heads / n_kv;
    let device = queries.device();
    // [batch, rows, n * hd] → [batch, n, rows, hd]
    let split = |t: Tensor<B, 3>, rows, n| t.reshape([batch, rows, n, hd]).swap_dims(1, 2);
    let queries = split(queries, seq, n_heads).reshape([batch, n_kv, group * seq, hd]);
    let scores = queries.matmul(split(keys, total, n_kv).swap_dims(2, 3));
    let window = window.unwrap_or(usize::MAX);
    let scores = if seq > 1 || total > window {
        scores + causal_mask(seq, total - seq, window, [n_kv, group], &device)
    } else {
        scores
    };
    softmax(scores, 3)
        .matmul(split(values, total, n_kv))
        .reshape([batch, n_heads, seq, hd])
        .swap_dims(1, 2)
        .reshape([batch, seq, n_heads * hd])
}

/// Additive causal mask `[1, n_kv, group * seq, start + seq]` for the grouped score rows:
/// row `g * seq + i` is query `i` (at position `start + i`) of any head in a group, and
/// sees keys `0..=start + i`, the last `window` of them.
fn causal_mask<B: Backend>(
    seq: usize,
    start: usize,
    window: usize,
    [n_kv, group]: [usize; 2],
    device: &B::Device,
) -> Tensor<B, 4> {
    let total = start + seq;
    let one_kv_head: Vec<f32> = (0..group * seq)
        .flat_map(|row| {
            let position = start + row % seq;
            (0..total).map(move |j| {
                if j > position || position - j >= window {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_data(
        TensorData::new(one_kv_head.repeat(n_kv), [1, n_kv, group * seq, total]),
        device,
    )
}
