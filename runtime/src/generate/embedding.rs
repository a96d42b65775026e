//! Embedding a text: its final-norm hidden states (no lm_head), pooled as the model says
//! ([`Pooling`](crate::model::config::Pooling)).
//!
//! Each text runs alone, as a prompt of its own in a fresh cache, in the same fixed chunks
//! whatever else is being embedded: a text's embedding is the same bits alone or among
//! others (a batch of texts is a loop, not one pass of a padded batch).

use super::{GenerateError, Generator, PREFILL_CHUNK};
use crate::model::backend::KernelBackend;

impl<B: KernelBackend> Generator<B> {
    /// The embedding of `ids` (a text's tokens, as the tokenizer gives them), pooled as
    /// [`Generator::pooling`] says, cut to `dimensions` values if asked (only to a size the
    /// model lists, [`GenerateError::Dimensions`]). Any model embeds: one that generates
    /// with its default pooling, the last token's, normalized.
    pub fn embed(&self, ids: &[u32], dimensions: Option<usize>) -> Result<Vec<f32>, GenerateError> {
        let hidden = self.config.hidden_size;
        self.check_dimensions(dimensions)?;
        if ids.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let context = self.config.max_position_embeddings;
        if ids.len() > context {
            return Err(GenerateError::TextTooLong {
                tokens: ids.len(),
                context,
            });
        }
        self.check_ids(ids)?;
        let mut cache = self.new_cache(ids.len())?;
        let mut rows = Vec::with_capacity(ids.len() * hidden);
        for chunk in ids.chunks(PREFILL_CHUNK) {
            let tokens = self.id_tensor(chunk, [1, chunk.len()]);
            let states = self.model.forward(tokens, &mut cache, self.matmul)?;
            let states = (states.into_data().into_vec::<f32>())
                .map_err(|e| GenerateError::Backend(format!("cannot read hidden states: {e:?}")))?;
            rows.extend(states);
        }
        let finite = |row: &[f32]| row.iter().all(|v| v.is_finite());
        if let Some(position) = rows.chunks_exact(hidden).position(|row| !finite(row)) {
            return Err(GenerateError::NonFiniteEmbedding { position });
        }
        Ok(self.pooling.pool(&rows, hidden, dimensions))
    }

    /// Refuses a size the embedding may not be cut to ([`Pooling::allows`]).
    ///
    /// [`Pooling::allows`]: crate::model::config::Pooling::allows
    pub fn check_dimensions(&self, dimensions: Option<usize>) -> Result<(), GenerateError> {
        let hidden = self.config.hidden_size;
        match dimensions {
            Some(dimensions) if !self.pooling.allows(dimensions, hidden) => {
                Err(GenerateError::Dimensions {
                    dimensions,
                    hidden,
                    allowed: self.pooling.matryoshka_dimensions.clone(),
                })
            }
            _ => Ok(()),
        }
    }
}
