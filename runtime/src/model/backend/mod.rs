//! The bridge between the model and the kernels: the operations the model runs, as a trait
//! on Burn backends, the way Burn extends a backend with custom kernels
//! (`examples/custom-*-kernel`). Each method takes tensors and has a default composed of
//! ordinary tensor ops ([`reference`]); burn-flex overrides them with the slice kernels of
//! [`kernels`] (`flex.rs`). burn-ndarray, kept for comparison, uses the defaults, which
//! are also what the tests hold the kernels to.

mod aligned;
mod flex;
pub mod reference;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use kernels::attention::Heads;
use kernels::int8::Matmul;
use kernels::layer::{Activation, LayerShape, LayerWeights};
use kernels::quant::BlockType;

use crate::NdArrayBackend;
use crate::model::rope::RopeRows;

/// A decoder layer's tensors: norm weights and biases `[d]`, projection weights
/// `[d_in, d_out]`.
pub type LayerTensors<B> = LayerWeights<Tensor<B, 1>, Tensor<B, 2>>;

/// What a KV cache stores its keys and values as (`--kv-cache`). f16 and bf16 halve the
/// bytes decoding reads at long context, at the cost of rounding every key and value
/// (llama.cpp keeps f16); f32 keeps them as the projections give them, which transformers
/// does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvDtype {
    #[default]
    F32,
    F16,
    Bf16,
}

impl KvDtype {
    /// Bytes per stored value.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    /// `x` rounded to the nearest value this type stores (ties to even).
    pub fn round(self, x: f32) -> f32 {
        use kernels::stored::Stored;
        match self {
            Self::F32 => x,
            Self::F16 => half::f16::narrow(x).widen(),
            Self::Bf16 => half::bf16::narrow(x).widen(),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        })
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::Bf16),
            other => Err(format!("{other:?} is not one of f32, f16, bf16")),
        }
    }
}

/// One layer's key and value buffers, `[batch, capacity, n_kv_heads * head_dim]` each, the
/// position the first new token goes to and how many (`rows`, consecutive) there are.
pub struct KvBuffers<'a, B: Backend> {
    pub keys: &'a mut Tensor<B, 3>,
    pub values: &'a mut Tensor<B, 3>,
    pub position: usize,
    pub rows: usize,
}

/// The model's operations on a backend.
pub trait KernelBackend: Backend {
    /// Whether every operation here takes matrices (projection weights, the embedding)
    /// stored as bf16, computing as on their f32 values (`weights::layout::Weights`).
    const BF16_WEIGHTS: bool = false;

    /// Whether matrices kept as ggml blocks stay blocks ([`Self::blocks_matrix`]), which
    /// every operation here on projection weights then reads.
    const BLOCK_WEIGHTS: bool = false;

    /// A `[d_in, d_out]` projection weight kept as `d_out` rows of `ty` blocks, `bytes` row
    /// after row. By default its decoded values, f32 (what the blocks stand for, exactly).
    fn blocks_matrix(
        ty: BlockType,
        bytes: burn::tensor::Bytes,
        [d_in, d_out]: [usize; 2],
        device: &Self::Device,
    ) -> Tensor<Self, 2> {
        let mut values = vec![0.0f32; d_in * d_out];
        ty.decode(&bytes, &mut values);
        let data = burn::tensor::TensorData::new(values, [d_out, d_in]);
        Tensor::<Self, 2>::from_data(data, device).transpose()
    }

    /// The rows of the embedding `weight: [vocab, hidden]` for `tokens: [batch, seq]`:
    /// `[batch, seq, hidden]`, in the weight's element type.
    fn embed(weight: Tensor<Self, 2>, tokens: Tensor<Self, 2, Int>) -> Tensor<Self, 3> {
        burn::tensor::module::embedding(weight, tokens)
    }

    /// Sequences decoded together at most ([`crate::model::llama::Llama::decode_each`]) while each
    /// one's logits stay bit-identical to decoding it alone: 1 unless the backend's products
    /// sum every row as alone up to that many rows.
    const DECODE_BATCH: usize = 1;

    /// Causal grouped-query attention.
    ///
    /// # Shapes
    /// - queries: `[batch, seq, n_heads * head_dim]`, rotated and scaled by `1/sqrt(head_dim)`
    /// - keys, values: `[batch, start + seq, n_kv_heads * head_dim]`, positions `0..start`
    ///   from the cache followed by this call's (views of [`Self::kv_buffer`]s)
    /// - output: `[batch, seq, n_heads * head_dim]`; query `i` attends to keys `0..=start + i`,
    ///   or with a sliding `window` to the last `window` of them
    fn causal_attention(
        queries: Tensor<Self, 3>,
        keys: Tensor<Self, 3>,
        values: Tensor<Self, 3>,
        heads: Heads,
        window: Option<usize>,
    ) -> Tensor<Self, 3> {
        reference::attention(queries, keys, values, heads, window)
    }

    /// The gated MLP's gating: `activation(gate) * up`, element-wise (SwiGLU with SiLU).
    fn glu(gate: Tensor<Self, 3>, up: Tensor<Self, 3>, activation: Activation) -> Tensor<Self, 3> {
        reference::glu(gate, up, activation)
    }

    /// RMSNorm of each row of `x: [batch, seq, hidden]` with weight `gamma: [hidden]`.
    fn rms_norm(x: Tensor<Self, 3>, gamma: Tensor<Self, 1>, epsilon: f64) -> Tensor<Self, 3> {
        reference::rms_norm(x, gamma, epsilon)
    }

    /// Bias-free linear layers of one input: `x: [batch, seq, d_in]` times each
    /// `weights[i]: [d_in, d_out_i]`. Taking the layers that share an input together (q, k,
    /// v; gate, up) lets a backend split all their work across threads in one go. `matmul`
    /// says how a product over blocks may take its input; by default they are all exact.
    fn linear_forward<const N: usize>(
        x: Tensor<Self, 3>,
        weights: [Tensor<Self, 2>; N],
        _matmul: Matmul,
    ) -> [Tensor<Self, 3>; N] {
        weights.map(|weight| reference::linear(x.clone(), weight))
    }

    /// Rotary position embedding in transformers' `rotate_half` layout, then a scale:
    /// `(x * cos + rotate_half(x) * sin) * scale` for every head of
    /// `x: [batch, seq, heads * head_dim]`, with the tables' rows for these positions.
    /// Queries take attention's `1/sqrt(head_dim)` here.
    fn rotary(x: Tensor<Self, 3>, rope: &RopeRows<Self>, scale: f32) -> Tensor<Self, 3> {
        reference::rotary(x, rope, scale)
    }

    /// A zeroed KV cache buffer, `[batch, capacity, width]`, for values of `dtype`. By
    /// default an f32 buffer whatever `dtype`, into which [`Self::write_rows`] writes values
    /// rounded to it: the cache type's numbers, not its bytes.
    fn kv_buffer(shape: [usize; 3], _dtype: KvDtype, device: &Self::Device) -> Tensor<Self, 3> {
        Tensor::zeros(shape, device)
    }

    /// A new buffer like `buffer` (from [`Self::kv_buffer`]) of `rows` positions, holding
    /// its first `keep` (copied: the new buffer shares nothing with `buffer`, which may be
    /// another cache's): how a KV cache grows, and how a fork starts.
    fn kv_resize(
        buffer: &Tensor<Self, 3>,
        keep: usize,
        rows: usize,
        dtype: KvDtype,
    ) -> Tensor<Self, 3> {
        let [batch, _, width] = buffer.dims();
        let fresh = Self::kv_buffer([batch, rows - keep, width], dtype, &buffer.device());
        if keep == 0 {
            return fresh;
        }
        Tensor::cat(vec![buffer.clone().narrow(1, 0, keep), fresh], 1)
    }

    /// Writes `rows: [batch, seq, width]`, rounded to `dtype`, over positions
    /// `start..start + seq` of `buffer: [batch, capacity, width]` (from [`Self::kv_buffer`]):
    /// how the KV cache appends.
    fn write_rows(
        buffer: &mut Tensor<Self, 3>,
        start: usize,
        rows: Tensor<Self, 3>,
        dtype: KvDtype,
    ) {
        let rows = reference::round(rows, dtype);
        *buffer = reference::write_rows(take(buffer), start, rows);
    }

    /// One layer's forward pass for the next tokens of each of several sequences, `x: [n, 1,
    /// hidden]` (sequence `b`'s `caches[b].rows` rows in order, `n` in all), as one fused
    /// kernel that also writes each token's key and value into its sequence's cache (from
    /// `caches[b].position` on, with `ropes[b]` its rows' rotary rows), if the backend has
    /// one for these inputs. A row's output must not depend on the other sequences' rows,
    /// nor on its own sequence's later rows: `k` rows of a sequence give the bits of `k`
    /// calls with one. `None`: nothing was written, and the model runs the composed ops.
    fn decode_layer(
        _x: &Tensor<Self, 3>,
        _weights: &LayerTensors<Self>,
        _shape: LayerShape,
        _caches: Vec<KvBuffers<'_, Self>>,
        _ropes: &[RopeRows<Self>],
    ) -> Option<Tensor<Self, 3>> {
        None
    }

    /// Runs `work`, the forward pass of one decoded token: a burst of short parallel
    /// regions that a backend may want to run on threads kept ready.
    fn decode_token<R>(work: impl FnOnce() -> R) -> R {
        work()
    }
}

impl KernelBackend for NdArrayBackend {}

/// Takes a tensor out of `slot`, leaving an empty one, so a kernel can own (and so write
/// in place) a buffer it was lent.
fn take<B: Backend>(slot: &mut Tensor<B, 3>) -> Tensor<B, 3> {
    let empty = Tensor::empty([0, 0, 0], &slot.device());
    std::mem::replace(slot, empty)
}
