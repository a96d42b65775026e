//! How a prompt runs: many positions per product through the kernels made for that, or
//! through the decoding kernels, so that a position's logits and keys are the same bits
//! however it was reached.

use std::str::FromStr;

use burn::tensor::{Tensor, TensorData};

use super::{Generator, WantedLogits};
use crate::model::backend::KernelBackend;
use crate::model::cache::{CacheError, KvCache};

/// Prompt positions an invariant pass takes: each weight is read once for these many
/// positions. More gain little once the products are compute-bound, and each pass's
/// attention walks the whole cache once per row anyway.
const INVARIANT_ROWS: usize = 64;

/// How a prompt runs ([`Generator::prefill`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Prefill {
    /// Many positions per product, through the kernels made for that (gemm, AMX tiles,
    /// int8 rows), which sum in another order than decoding's: the fastest prompts, whose
    /// positions equal one-token steps' only up to rounding. A prompt split otherwise, or
    /// continued from a reused cache, can then end in other bits, and a close pick in
    /// another token.
    #[default]
    Fast,
    /// Through the decoding kernels, many positions a pass: every position's logits and
    /// keys are the bits one-token steps give, however the prompt was split, whatever a
    /// reused or forked cache holds, alone or in a batch, drafted or not. Prompts run
    /// slower (docs/BENCHMARKS.md measures how much).
    Invariant,
}

impl FromStr for Prefill {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fast" => Ok(Self::Fast),
            "invariant" => Ok(Self::Invariant),
            _ => Err(format!("unknown prefill {s:?} (fast or invariant)")),
        }
    }
}

impl std::fmt::Display for Prefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fast => "fast",
            Self::Invariant => "invariant",
        })
    }
}

impl<B: KernelBackend> Generator<B> {
    /// Runs one chunk of `tokens` and returns the logits of the positions `wanted` names.
    pub(super) fn chunk_logits(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        wanted: WantedLogits,
    ) -> Result<Option<TensorData>, CacheError> {
        if self.prefill == Prefill::Invariant {
            return self.invariant_logits(tokens, cache, wanted);
        }
        let ids = self.id_tensor(tokens, [1, tokens.len()]);
        if tokens.len() == 1 {
            return Ok(Some(
                self.model.decode(ids, cache, self.matmul)?.into_data(),
            ));
        }
        let hidden = self.model.forward(ids, cache, self.matmul)?; // [1, n, hidden]
        let [_, n, width] = hidden.dims();
        let hidden = match wanted {
            WantedLogits::None => return Ok(None),
            WantedLogits::Last => hidden.slice([0..1, n - 1..n, 0..width]),
            WantedLogits::All => hidden,
        };
        Ok(Some(self.model.logits(hidden, self.matmul).into_data()))
    }

    /// [`Self::chunk_logits`] through the decoding kernels ([`Prefill::Invariant`]): the
    /// layers [`INVARIANT_ROWS`] positions a pass, lm_head at most
    /// [`KernelBackend::DECODE_BATCH`] rows at a time, as a decoding step takes them.
    fn invariant_logits(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        wanted: WantedLogits,
    ) -> Result<Option<TensorData>, CacheError> {
        cache.check_room(1, tokens.len())?;
        let mut kept = Vec::new();
        let passes = tokens.len().div_ceil(INVARIANT_ROWS);
        for (i, pass) in tokens.chunks(INVARIANT_ROWS).enumerate() {
            let ids = self.id_tensor(pass, [pass.len(), 1]);
            let hidden = (self.model).decode_rows_hidden(
                ids,
                &mut [&mut *cache],
                &[pass.len()],
                self.matmul,
            )?; // [n, 1, hidden]
            match wanted {
                WantedLogits::All => kept.push(hidden),
                WantedLogits::Last if i + 1 == passes => {
                    let [n, _, width] = hidden.dims();
                    kept.push(hidden.slice([n - 1..n, 0..1, 0..width]));
                }
                _ => {}
            }
        }
        if kept.is_empty() {
            return Ok(None);
        }
        let hidden = Tensor::cat(kept, 0);
        let [n, _, width] = hidden.dims();
        let logits: Vec<Tensor<B, 3>> = (0..n)
            .step_by(B::DECODE_BATCH)
            .map(|start| {
                let end = n.min(start + B::DECODE_BATCH);
                let rows = hidden.clone().slice([start..end, 0..1, 0..width]);
                self.model.logits(rows, self.matmul)
            })
            .collect();
        Ok(Some(Tensor::cat(logits, 0).into_data()))
    }
}
