//! One decoder layer for one token on burn-flex's buffers, in one pass: the steps of
//! `DecoderLayer::forward_composed` (model.rs) with no Burn tensor between them.
//!
//! Why: a decoded token streams each layer's ~18 MB of weights through the caches, which
//! evicts everything else, so every small step between two products (the norms, RoPE, the
//! KV append, the residual adds, SiLU) starts cold, and a Burn op's set-up (tensor handles,
//! layouts, allocations) is a chain of cache misses longer than its few hundred
//! multiply-adds. Those steps took 0.25 ms of a 12 ms token as ops and take 0.07 ms here.
//! The arithmetic is the same kernels in the same order, so the output is bit-identical.

use burn::tensor::Tensor;

use super::attention::{CausalAttention, Rows};
use super::matvec::matvecs;
use super::{flex, from_flex, rows, simd, weight_rows};
use crate::FlexBackend;
use crate::cache::LayerCache;
use crate::model::DecoderLayer;

/// `layer`'s forward pass for `x: [1, 1, hidden]` at the cache's next position, or `None`
/// for more than one row or a weight not laid out for matrix-vector products
/// (`Llama::with_matvec_layout`).
pub(super) fn decode_layer(
    layer: &DecoderLayer<FlexBackend>,
    x: &Tensor<FlexBackend, 3>,
    cache: &mut LayerCache<FlexBackend>,
    cos: &Tensor<FlexBackend, 2>,
    sin: &Tensor<FlexBackend, 2>,
) -> Option<Tensor<FlexBackend, 3>> {
    let [1, 1, hidden] = x.dims() else {
        return None;
    };
    let (attention, mlp) = (&layer.self_attn, &layer.mlp);
    let weights = [
        &attention.q_proj,
        &attention.k_proj,
        &attention.v_proj,
        &attention.o_proj,
        &mlp.gate_proj,
        &mlp.up_proj,
        &mlp.down_proj,
    ]
    .map(|linear| linear.weight.val().into_primitive().tensor());
    let weights: Vec<&[f32]> = weights.iter().map(weight_rows).collect::<Option<_>>()?;
    let [
        q_proj,
        k_proj,
        v_proj,
        o_proj,
        gate_proj,
        up_proj,
        down_proj,
    ] = weights[..]
    else {
        unreachable!("seven weights in, seven out");
    };
    let contiguous = |t: Tensor<FlexBackend, 1>| t.into_primitive().tensor().to_contiguous();
    let input_norm = contiguous(layer.input_layernorm.gamma.val());
    let post_attention_norm = contiguous(layer.post_attention_layernorm.gamma.val());
    let table = |t: &Tensor<FlexBackend, 2>| t.clone().into_primitive().tensor().to_contiguous();
    let (cos, sin) = (table(cos), table(sin));
    let (cos, sin): (&[f32], &[f32]) = (cos.storage(), sin.storage());
    let heads = attention.heads();

    // The residual stream, updated in place.
    let mut x = flex(x.clone()).to_contiguous();
    let residual: &mut [f32] = x.storage_mut();
    let mut normed = vec![0.0f32; hidden];

    simd::rms_norm_rows(
        residual,
        input_norm.storage(),
        layer.input_layernorm.epsilon as f32,
        &mut normed,
    );
    let [mut q, mut k, v] = outputs(matvecs(&[q_proj, k_proj, v_proj], &normed));
    // The score scale goes on q, as in the composed path.
    simd::rotary_heads(&mut q, cos, sin, heads.score_scale());
    simd::rotary_heads(&mut k, cos, sin, 1.0);
    let attended = cache.append_with(1, |keys, values, position| {
        // Contiguous already (the cache allocates them so), and not shared: written in place.
        let (mut keys, mut values) = (flex(keys).to_contiguous(), flex(values).to_contiguous());
        for (buffer, row) in [(&mut keys, &k), (&mut values, &v)] {
            let buffer: &mut [f32] = buffer.storage_mut();
            buffer[position * row.len()..][..row.len()].copy_from_slice(row);
        }
        let view = |t| rows(t).expect("a contiguous buffer has contiguous rows");
        let attended = CausalAttention {
            queries: Rows {
                data: &q,
                offset: 0,
                batch_stride: q.len(),
                row_stride: q.len(),
            },
            keys: view(&keys),
            values: view(&values),
            batch: 1,
            seq: 1,
            start: position,
            heads,
        }
        .run();
        (from_flex(keys), from_flex(values), attended)
    });
    let [o] = outputs(matvecs(&[o_proj], &attended));
    add(residual, &o);

    simd::rms_norm_rows(
        residual,
        post_attention_norm.storage(),
        layer.post_attention_layernorm.epsilon as f32,
        &mut normed,
    );
    let [mut gate, up] = outputs(matvecs(&[gate_proj, up_proj], &normed));
    simd::silu_mul(&mut gate, &up);
    let [down] = outputs(matvecs(&[down_proj], &gate));
    add(residual, &down);
    Some(from_flex(x))
}

fn outputs<const N: usize>(outs: Vec<Vec<f32>>) -> [Vec<f32>; N] {
    outs.try_into().expect("one output per weight")
}

fn add(residual: &mut [f32], x: &[f32]) {
    for (r, x) in residual.iter_mut().zip(x) {
        *r += x;
    }
}
