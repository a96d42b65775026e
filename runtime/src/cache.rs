//! Key/value cache: one preallocated buffer per layer plus a cursor (llama-burn's
//! `AutoregressiveCache`), and the rotary tables for its positions, all sized to the run so
//! a short generation doesn't hold a full context's worth of memory (and a config claiming a
//! huge context costs nothing until a run asks for it).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

pub use crate::backend::KvDtype;
use crate::backend::{KernelBackend, KvBuffers};
use crate::config::LlamaConfig;
use crate::rope::{Rope, RopeRows};

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

/// Keys and values of one layer: `[batch, capacity, n_kv_heads * head_dim]` each, the
/// layout the key and value projections produce, so appending is a plain copy of rows.
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    keys: Tensor<B, 3>,
    values: Tensor<B, 3>,
    len: usize,
    /// The model's sliding window: how many of the latest positions a token sees.
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
        let width = config.n_kv_heads * config.head_dim;
        let kv_bytes = (config.num_layers as u64 * 2 * batch as u64 * width as u64)
            .saturating_mul(dtype.size() as u64);
        // The rotary tables: cos and sin, f32.
        let bytes = kv_bytes
            .saturating_add(2 * 4 * config.head_dim as u64)
            .saturating_mul(capacity as u64);
        if let Some(available) = available_memory().filter(|&a| bytes > a) {
            return Err(CacheError::TooLarge {
                positions: capacity,
                bytes,
                available,
            });
        }
        let shape = [batch, capacity, width];
        let layers = (0..config.num_layers)
            .map(|_| LayerCache {
                keys: B::kv_buffer(shape, dtype, device),
                values: B::kv_buffer(shape, dtype, device),
                len: 0,
                window: config.sliding_window,
                dtype,
            })
            .collect();
        Ok(Self {
            layers,
            rope: Rope::new(config, capacity, device),
            len: 0,
            batch,
            capacity,
        })
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
    pub(crate) fn rope_rows(&self, seq: usize) -> RopeRows<B> {
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

/// `MemAvailable` of /proc/meminfo, in bytes, where there is one.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
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

    /// Appends one position to each of `caches` (one layer of each of a batch of sequences)
    /// through `write`, a kernel that writes the buffers itself and returns `None` if it
    /// wrote nothing (then every position stays free).
    pub(crate) fn append_each<R>(
        caches: &mut [&mut Self],
        write: impl FnOnce(Vec<KvBuffers<'_, B>>) -> Option<R>,
    ) -> Result<Option<R>, CacheError> {
        for cache in caches.iter() {
            cache.reserve(1)?;
        }
        let buffers = caches
            .iter_mut()
            .map(|cache| KvBuffers {
                keys: &mut cache.keys,
                values: &mut cache.values,
                position: cache.len,
            })
            .collect();
        let written = write(buffers);
        if written.is_some() {
            caches.iter_mut().for_each(|cache| cache.len += 1);
        }
        Ok(written)
    }

    fn reserve(&self, seq: usize) -> Result<usize, CacheError> {
        let (needed, capacity) = (self.len + seq, self.keys.dims()[1]);
        if needed > capacity {
            return Err(CacheError::Full { needed, capacity });
        }
        Ok(needed)
    }
}
