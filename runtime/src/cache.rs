//! Key/value cache: one preallocated buffer per layer plus a cursor (llama-burn's
//! `AutoregressiveCache`), and the rotary tables for its positions, all sized to the run so
//! a short generation doesn't hold a full context's worth of memory (and a config claiming a
//! huge context costs nothing until a run asks for it).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::LlamaConfig;
use crate::kernels::Kernels;
use crate::model::Rope;

/// Keys and values of one layer: `[batch, capacity, n_kv_heads * head_dim]` each, the
/// layout the key and value projections produce, so appending is a plain copy of rows.
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    // `Option` so `append` can move the buffers into `slice_assign` and back: a clone would
    // share the storage and force a copy of the whole buffer on every token.
    keys: Option<Tensor<B, 3>>,
    values: Option<Tensor<B, 3>>,
    len: usize,
}

/// The cache of every layer, and how many positions they hold.
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    rope: Rope<B>,
    len: usize,
    capacity: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache for `capacity` positions (prompt plus generated tokens).
    pub fn new(config: &LlamaConfig, batch: usize, capacity: usize, device: &B::Device) -> Self {
        let shape = [batch, capacity, config.n_kv_heads * config.head_dim];
        let layers = (0..config.num_layers)
            .map(|_| LayerCache {
                keys: Some(Tensor::zeros(shape, device)),
                values: Some(Tensor::zeros(shape, device)),
                len: 0,
            })
            .collect();
        Self {
            layers,
            rope: Rope::new(config, capacity, device),
            len: 0,
            capacity,
        }
    }

    /// Positions already cached: the position of the next token.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The rotary tables and, to append to, every layer's cache.
    pub(crate) fn rope_and_layers(
        &mut self,
    ) -> (&Rope<B>, impl Iterator<Item = &mut LayerCache<B>>) {
        (&self.rope, self.layers.iter_mut())
    }

    pub(crate) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}

impl<B: Kernels> LayerCache<B> {
    /// Appends `seq` positions for a kernel that writes the buffers itself: `write` gets the
    /// key and value buffers (`[batch, capacity, n_kv_heads * head_dim]`) and the first
    /// position to fill, and hands the buffers back with its result.
    ///
    /// Panics if the cache is full: callers check the context length before running.
    pub(crate) fn append_with<R>(
        &mut self,
        seq: usize,
        write: impl FnOnce(Tensor<B, 3>, Tensor<B, 3>, usize) -> (Tensor<B, 3>, Tensor<B, 3>, R),
    ) -> R {
        let (start, end) = (self.len, self.len + seq);
        let keys = self.keys.take().expect("cache buffer present");
        let values = self.values.take().expect("cache buffer present");
        let capacity = keys.dims()[1];
        assert!(end <= capacity, "KV cache overflow: {end} > {capacity}");
        let (keys, values, out) = write(keys, values, start);
        self.keys = Some(keys);
        self.values = Some(values);
        self.len = end;
        out
    }

    /// Stores `k`, `v` (`[batch, seq, n_kv * head_dim]`) after the cached positions and
    /// returns all keys and values so far, `[batch, len + seq, n_kv * head_dim]` (views of
    /// the buffers, not copies).
    ///
    /// Panics if the cache is full: callers check the context length before running.
    pub(crate) fn append(
        &mut self,
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let [_, seq, _] = k.dims();
        self.append_with(seq, |keys, values, start| {
            let keys = B::write_rows(keys, start, k);
            let values = B::write_rows(values, start, v);
            let end = start + seq;
            let views = (
                keys.clone().narrow(1, 0, end),
                values.clone().narrow(1, 0, end),
            );
            (keys, values, views)
        })
    }
}
