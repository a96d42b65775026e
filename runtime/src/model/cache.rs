//! Key/value cache: one buffer per layer plus a cursor (llama-burn's `AutoregressiveCache`),
//! and the rotary tables for its positions. A cache may hold up to its capacity (a run's
//! prompt plus new tokens, or a server's whole context), but its buffers are allocated a
//! block of positions at a time as they fill: the memory a sequence holds follows the
//! tokens it holds (a server slot that answers two tokens holds a block, not a context), and
//! a config claiming a huge context costs nothing until a run fills it. The buffers stay
//! contiguous, so the kernels read a cache as one slice.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

pub use crate::model::backend::KvDtype;
use crate::model::backend::{KernelBackend, KvBuffers};
use crate::model::config::LlamaConfig;
use crate::model::rope::{Rope, Rotations};

/// Why tokens cannot be run against a cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("{needed} positions do not fit a KV cache of {capacity}")]
    Full { needed: usize, capacity: usize },
    #[error("a batch of {given} sequences does not fit a KV cache for {batch}")]
    Batch { given: usize, batch: usize },
    #[error(
        "a KV cache for {positions} positions needs {bytes} bytes, more than the {available} this machine has available; ask for fewer tokens"
    )]
    TooLarge {
        positions: usize,
        bytes: u64,
        available: u64,
    },
}

/// Positions a cache's buffers grow by at least (and are rounded up to): small enough that
/// a short request holds little, large enough that growing (a copy of what is cached) is
/// rare; a buffer grows by half its size at least, so copies add up to a few times the
/// final size.
pub const BLOCK: usize = 256;

/// Keys and values of one layer: `[batch, allocated, n_kv_heads * head_dim]` each, the
/// layout the key and value projections produce, so appending is a plain copy of rows.
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    keys: Tensor<B, 3>,
    values: Tensor<B, 3>,
    len: usize,
    /// The most positions the buffers may grow to: the cache's capacity.
    limit: usize,
    /// The layer's sliding window: how many of the latest positions a token sees.
    window: Option<usize>,
    dtype: KvDtype,
}

/// The cache of every layer, and how many positions they hold.
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    rope: Rope<B>,
    len: usize,
    batch: usize,
    capacity: usize,
}

impl<B: KernelBackend> KvCache<B> {
    /// A cache for `batch` sequences of `capacity` positions (prompt plus generated tokens),
    /// its keys and values stored as `dtype`, refused if its buffers and tables would not
    /// fit in the memory available: a config may claim any context length, and a run may ask
    /// for any number of tokens.
    pub fn new(
        config: &LlamaConfig,
        batch: usize,
        capacity: usize,
        dtype: KvDtype,
        device: &B::Device,
    ) -> Result<Self, CacheError> {
        Self::check_memory(config, batch, capacity, dtype)?;
        Ok(Self::with_rope(
            config,
            batch,
            capacity,
            dtype,
            Rope::new(config, capacity, device),
            device,
        ))
    }

    /// Refuses a cache whose buffers and tables, once full, would not fit in the memory
    /// available now.
    pub fn check_memory(
        config: &LlamaConfig,
        batch: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Result<(), CacheError> {
        // The rotary tables: cos and sin, f32.
        let bytes = (bytes_for(config, 1, dtype).saturating_mul(batch as u64))
            .saturating_add(Rope::<B>::tables(config) * 2 * 4 * config.head_dim as u64)
            .saturating_mul(capacity as u64);
        match crate::util::memory::available().filter(|&a| bytes > a) {
            Some(available) => Err(CacheError::TooLarge {
                positions: capacity,
                bytes,
                available,
            }),
            None => Ok(()),
        }
    }

    /// [`Self::new`] with rotary tables made already (covering at least `capacity`
    /// positions; tables are the same whichever cache reads them, so caches may share
    /// them), and without the memory check.
    pub(crate) fn with_rope(
        config: &LlamaConfig,
        batch: usize,
        capacity: usize,
        dtype: KvDtype,
        rope: Rope<B>,
        device: &B::Device,
    ) -> Self {
        let shape = [
            batch,
            capacity.min(BLOCK),
            config.n_kv_heads * config.head_dim,
        ];
        let layers = (0..config.num_layers)
            .map(|layer| LayerCache {
                keys: B::kv_buffer(shape, dtype, device),
                values: B::kv_buffer(shape, dtype, device),
                len: 0,
                limit: capacity,
                window: config.window(layer),
                dtype,
            })
            .collect();
        Self {
            layers,
            rope,
            len: 0,
            batch,
            capacity,
        }
    }

    /// A new cache of `capacity` holding a copy of this one's first `len` positions (at
    /// most what it holds): a prompt that shares only a prefix with a kept conversation
    /// starts from that prefix and leaves the conversation's cache as it was.
    pub fn fork(&self, len: usize, capacity: usize) -> Self {
        let len = len.min(self.len).min(capacity);
        let layers = (self.layers.iter())
            .map(|layer| LayerCache {
                keys: layer.keys.clone(),
                values: layer.values.clone(),
                len,
                limit: capacity,
                window: layer.window,
                dtype: layer.dtype,
            })
            .map(|mut layer| {
                layer.resize(len, len.next_multiple_of(BLOCK).min(capacity));
                layer
            })
            .collect();
        Self {
            layers,
            rope: self.rope.clone(),
            len,
            batch: self.batch,
            capacity,
        }
    }

    /// Bytes the keys' and values' buffers take now (what the cache's positions have grown
    /// them to, not its capacity).
    pub fn bytes(&self) -> u64 {
        (self.layers.iter())
            .map(|layer| {
                let [batch, rows, width] = layer.keys.dims();
                2 * (batch * rows * width * layer.dtype.size()) as u64
            })
            .sum()
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

    /// Checks that `seq` more positions of `batch` sequences fit.
    pub fn check_room(&self, batch: usize, seq: usize) -> Result<(), CacheError> {
        if batch != self.batch {
            return Err(CacheError::Batch {
                given: batch,
                batch: self.batch,
            });
        }
        let needed = self.len + seq;
        if needed > self.capacity {
            return Err(CacheError::Full {
                needed,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// The rotary tables' rows for the next `seq` positions.
    pub(crate) fn rope_rows(&self, seq: usize) -> Rotations<B> {
        self.rope.rows(self.len, seq)
    }

    /// Every layer's cache, to append to.
    pub(crate) fn layers_mut(&mut self) -> impl Iterator<Item = &mut LayerCache<B>> {
        self.layers.iter_mut()
    }

    /// Marks `seq` positions, appended to every layer, as cached.
    pub(crate) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }

    /// Keeps only the first `len` positions (no-op if it holds fewer): what follows is
    /// written over by the next tokens. How a prompt that shares a prefix with what the
    /// cache holds reuses it.
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        self.len = len;
        for layer in &mut self.layers {
            layer.len = len;
        }
    }
}

/// Bytes the keys and values of `positions` positions of one sequence take, every layer's:
/// what a cache holding that many costs.
pub fn bytes_for(config: &LlamaConfig, positions: usize, dtype: KvDtype) -> u64 {
    let width = (config.n_kv_heads * config.head_dim) as u64;
    (config.num_layers as u64 * 2 * width * positions as u64).saturating_mul(dtype.size() as u64)
}

impl<B: KernelBackend> LayerCache<B> {
    /// How many of the latest cached positions a token attends to (itself included), if
    /// not all: the model's sliding window.
    pub(crate) fn window(&self) -> Option<usize> {
        self.window
    }

    /// Stores `k`, `v` (`[batch, seq, n_kv * head_dim]`) after the cached positions and
    /// returns all keys and values so far, `[batch, len + seq, n_kv * head_dim]` (views of
    /// the buffers, not copies).
    pub(crate) fn append(
        &mut self,
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 3>), CacheError> {
        let [_, seq, _] = k.dims();
        let end = self.reserve(seq)?;
        B::write_rows(&mut self.keys, self.len, k, self.dtype);
        B::write_rows(&mut self.values, self.len, v, self.dtype);
        self.len = end;
        let prefix = |t: &Tensor<B, 3>| t.clone().narrow(1, 0, end);
        Ok((prefix(&self.keys), prefix(&self.values)))
    }

    /// Appends `rows[b]` positions to `caches[b]` (one layer of each of a batch of
    /// sequences) through `write`, a kernel that writes the buffers itself and returns
    /// `None` if it wrote nothing (then every position stays free).
    pub(crate) fn append_each<R>(
        caches: &mut [&mut Self],
        rows: &[usize],
        write: impl FnOnce(Vec<KvBuffers<'_, B>>) -> Option<R>,
    ) -> Result<Option<R>, CacheError> {
        assert_eq!(caches.len(), rows.len(), "a row count per cache");
        for (cache, &rows) in caches.iter_mut().zip(rows) {
            cache.reserve(rows)?;
        }
        let buffers = (caches.iter_mut().zip(rows))
            .map(|(cache, &rows)| KvBuffers {
                keys: &mut cache.keys,
                values: &mut cache.values,
                position: cache.len,
                rows,
            })
            .collect();
        let written = write(buffers);
        if written.is_some() {
            (caches.iter_mut().zip(rows)).for_each(|(cache, &rows)| cache.len += rows);
        }
        Ok(written)
    }

    /// Makes room for `seq` more positions, growing the buffers if they hold fewer (by half
    /// their size at least, a whole number of blocks, at most to the limit).
    fn reserve(&mut self, seq: usize) -> Result<usize, CacheError> {
        let needed = self.len + seq;
        if needed > self.limit {
            return Err(CacheError::Full {
                needed,
                capacity: self.limit,
            });
        }
        let rows = self.keys.dims()[1];
        if needed > rows {
            let grown = needed.max(rows + rows / 2).next_multiple_of(BLOCK);
            self.resize(self.len, grown.min(self.limit));
        }
        Ok(needed)
    }

    /// New buffers of `rows` positions holding the first `keep` of these (copied: the new
    /// buffers share nothing with the old, which may be another cache's).
    fn resize(&mut self, keep: usize, rows: usize) {
        // At least one fresh row, so that the result is always a new buffer.
        let rows = rows.max(keep + 1);
        self.keys = B::kv_resize(&self.keys, keep, rows, self.dtype);
        self.values = B::kv_resize(&self.values, keep, rows, self.dtype);
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;
    use crate::FlexBackend;
    use crate::model::testing::normal;

    type Cache = KvCache<FlexBackend>;

    fn config() -> LlamaConfig {
        LlamaConfig::plain([32, 64, 2], [4, 2, 8], 10, 2000)
    }

    /// `[1, seq, 16]` random rows (n_kv_heads * head_dim of `config`).
    fn rows(seq: usize, seed: u64) -> Tensor<FlexBackend, 3> {
        normal([1, seq, 16], seed)
    }

    /// Appends `k`, `v` to every layer of `cache`, `step` positions at a time, and returns
    /// every layer's keys and values as read back after the last append.
    fn fill(cache: &mut Cache, k: &Tensor<FlexBackend, 3>, step: usize) -> Vec<TensorData> {
        let positions = k.dims()[1];
        let mut read = Vec::new();
        for start in (0..positions).step_by(step) {
            let seq = step.min(positions - start);
            let piece = k.clone().narrow(1, start, seq);
            cache.check_room(1, seq).unwrap();
            read = (cache.layers_mut())
                .flat_map(|layer| {
                    let (keys, values) = layer.append(piece.clone(), -piece.clone()).unwrap();
                    [keys, values].map(|t| t.into_data().convert::<f32>())
                })
                .collect();
            cache.advance(seq);
        }
        read
    }

    /// A cache grown a position at a time, over several growths, holds what one sized at
    /// once for all of them holds, for every cache type; its memory follows its positions.
    #[test]
    fn growing_keeps_every_position() {
        let config = config();
        let k = rows(700, 1);
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
            let mut grown = Cache::new(&config, 1, 1000, dtype, &Default::default()).unwrap();
            assert_eq!(grown.bytes(), bytes_for(&config, BLOCK, dtype));
            let mut whole = Cache::new(&config, 1, 1000, dtype, &Default::default()).unwrap();
            let one_at_a_time = fill(&mut grown, &k, 1);
            assert_eq!(one_at_a_time, fill(&mut whole, &k, 700), "{dtype:?}");
            assert!(grown.bytes() <= bytes_for(&config, 700 + BLOCK, dtype));
            let err = grown.check_room(1, 301).unwrap_err();
            assert_eq!(
                err,
                CacheError::Full {
                    needed: 1001,
                    capacity: 1000
                }
            );
        }
    }

    /// A fork holds a copy of the prefix: writing after it leaves the source as it was.
    #[test]
    fn a_fork_shares_nothing_with_its_source() {
        let config = config();
        let k = rows(300, 2);
        let mut source = Cache::new(&config, 1, 1000, KvDtype::F32, &Default::default()).unwrap();
        let before = fill(&mut source, &k, 300);
        let mut fork = source.fork(200, 1000);
        assert_eq!(fork.len(), 200);
        let other = rows(100, 3);
        let forked = fill(&mut fork, &other, 100);
        let prefix = |data: &TensorData, n: usize| data.as_slice::<f32>().unwrap()[..n].to_vec();
        for (forked, before) in forked.iter().zip(&before) {
            assert_eq!(prefix(forked, 200 * 16), prefix(before, 200 * 16));
            assert_ne!(forked, before);
        }
        // The source reads back unchanged (its next append overwrites nothing it holds).
        source.truncate(299);
        let again = fill(&mut source, &k.clone().narrow(1, 299, 1), 1);
        assert_eq!(again, before);
    }
}
