//! Key/value cache: one preallocated buffer per layer plus a cursor (llama-burn's
//! `AutoregressiveCache`), and the rotary tables for its positions, all sized to the run so
//! a short generation doesn't hold a full context's worth of memory (and a config claiming a
//! huge context costs nothing until a run asks for it).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::config::LlamaConfig;
use crate::model::Rope;

/// Keys and values of one layer: `[batch, n_kv_heads, capacity, head_dim]` each.
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    // `Option` so `append` can move the buffers into `slice_assign` and back: a clone would
    // share the storage and force a copy of the whole buffer on every token.
    keys: Option<Tensor<B, 4>>,
    values: Option<Tensor<B, 4>>,
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
        let shape = [batch, config.n_kv_heads, capacity, config.head_dim];
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

impl<B: Backend> LayerCache<B> {
    /// Stores `k`, `v` (`[batch, n_kv, seq, head_dim]`) after the cached positions and
    /// returns all keys and values so far, `[batch, n_kv, len + seq, head_dim]`.
    ///
    /// Panics if the cache is full: callers check the context length before running.
    pub(crate) fn append(
        &mut self,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [_, _, seq, _] = k.dims();
        let (start, end) = (self.len, self.len + seq);
        let keys = self.keys.take().expect("cache buffer present");
        let values = self.values.take().expect("cache buffer present");
        let [batch, n_kv, capacity, hd] = keys.dims();
        assert!(end <= capacity, "KV cache overflow: {end} > {capacity}");
        let keys = keys.slice_assign([0..batch, 0..n_kv, start..end, 0..hd], k);
        let values = values.slice_assign([0..batch, 0..n_kv, start..end, 0..hd], v);
        self.len = end;
        let visible = [0..batch, 0..n_kv, 0..end, 0..hd];
        let out = (
            keys.clone().slice(visible.clone()),
            values.clone().slice(visible),
        );
        self.keys = Some(keys);
        self.values = Some(values);
        out
    }
}
