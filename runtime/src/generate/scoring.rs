//! Scoring a text: perplexity, each position's logits handed to the caller.

use serde::Serialize;

use super::{GenerateError, Generator, PREFILL_CHUNK};
use crate::generate::sampling::log_partition;
use crate::model::backend::KernelBackend;

/// Mean next-token negative log-likelihood of a text.
#[derive(Debug, Clone, Serialize)]
pub struct Perplexity {
    pub tokens: usize,
    pub nll: f64,
    pub ppl: f64,
}

impl<B: KernelBackend> Generator<B> {
    /// Perplexity of `ids` (no BOS added): exp of the mean negative log-likelihood of each
    /// token after the first given the ones before it, accumulated in f64.
    pub fn perplexity(&self, ids: &[u32]) -> Result<Perplexity, GenerateError> {
        self.score(ids, |_| ())
    }

    /// [`Self::perplexity`], handing `each` every position's logits, in order.
    pub fn score(
        &self,
        ids: &[u32],
        each: impl FnMut(&[f32]),
    ) -> Result<Perplexity, GenerateError> {
        self.score_in_chunks(ids, PREFILL_CHUNK, each)
    }

    /// [`Self::score`], running the text `chunk` tokens at a time: 1 takes the kernels a
    /// token decodes with, more those of a prompt (which differ with
    /// [`Matmul::Int8`](kernels::int8::Matmul::Int8)).
    pub fn score_in_chunks(
        &self,
        ids: &[u32],
        chunk: usize,
        mut each: impl FnMut(&[f32]),
    ) -> Result<Perplexity, GenerateError> {
        if ids.len() < 2 {
            return Err(GenerateError::TextTooShort(ids.len()));
        }
        let context = self.config.max_position_embeddings;
        if ids.len() > context {
            return Err(GenerateError::PromptTooLong {
                tokens: ids.len(),
                context,
            });
        }
        let vocab = self.config.vocab_size;
        let mut cache = self.new_cache(ids.len())?;
        let mut nll = 0.0f64;
        let mut position = 0;
        // Chunk by chunk, so only one chunk's logits are ever in memory.
        for chunk in ids.chunks(chunk.max(1)) {
            let logits = self.forward_logits(chunk, &mut cache, true)?;
            for row in logits.chunks_exact(vocab) {
                super::check_finite(row, position)?;
                each(row);
                if let Some(&target) = ids.get(position + 1) {
                    nll += negative_log_likelihood(row, target as usize);
                }
                position += 1;
            }
        }
        let predictions = (ids.len() - 1) as f64;
        let nll = nll / predictions;
        Ok(Perplexity {
            tokens: ids.len(),
            nll,
            ppl: nll.exp(),
        })
    }
}

/// `logsumexp(row) - row[target]`, in f64.
fn negative_log_likelihood(row: &[f32], target: usize) -> f64 {
    log_partition(row) - row[target] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_row_is_log_vocab() {
        let nll = negative_log_likelihood(&[0.0; 8], 3);
        assert!((nll - 8f64.ln()).abs() < 1e-12);
    }
}
