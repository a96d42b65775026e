//! How an embedding is made from a text's final-norm hidden states: which positions are
//! pooled into one vector ([`PoolingMode`]), whether it is scaled to unit length, and to
//! which sizes it may be cut (Matryoshka). The artifact's pooling.json holds it, written by
//! the converter from sentence-transformers' modules (modules.json, `1_Pooling/config.json`,
//! a `Normalize` module) or, without them, the default: the last token, normalized, as
//! Qwen3-Embedding pools (and as vLLM embeds with a model that generates).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{CONFIG_LIMIT, ConfigError};
use crate::util::files::read_text_bounded;

/// Which hidden states make the embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolingMode {
    /// The mean over every position (sentence-transformers' `pooling_mode_mean_tokens`).
    Mean,
    /// The first position's (`pooling_mode_cls_token`).
    Cls,
    /// The last position's (`pooling_mode_lasttoken`): a causal decoder's only position
    /// that has seen the whole text.
    Last,
}

impl PoolingMode {
    /// Its name in pooling.json and on `/v1/models`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
        }
    }
}

/// pooling.json: how the model's hidden states become one vector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pooling {
    pub pooling: PoolingMode,
    /// Scaled to unit (L2) length, as sentence-transformers' `Normalize` module does.
    pub normalize: bool,
    /// The sizes the embedding may be cut to (its first values kept), from config.json's
    /// `matryoshka_dimensions`; none: only its full size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matryoshka_dimensions: Vec<usize>,
    /// Where this came from, for a reader of the file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl Default for Pooling {
    /// The last token, normalized: Qwen3-Embedding's pooling, and what a decoder without a
    /// pooling file gets (vLLM embeds with a generating model so too).
    fn default() -> Self {
        Self {
            pooling: PoolingMode::Last,
            normalize: true,
            matryoshka_dimensions: Vec::new(),
            source: String::new(),
        }
    }
}

impl Pooling {
    /// Reads `path`; `None` if there is no such file.
    pub fn from_file(path: &Path) -> Result<Option<Self>, ConfigError> {
        let text = match read_text_bounded(path, CONFIG_LIMIT) {
            Ok(text) => text,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let pooling: Self = serde_json::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.display().to_string(),
            error,
        })?;
        Ok(Some(pooling))
    }

    /// Checks the cut sizes against the model's `hidden` size: each in `1..=hidden`.
    pub fn check(&self, hidden: usize) -> Result<(), ConfigError> {
        match (self.matryoshka_dimensions.iter()).find(|&&d| d == 0 || d > hidden) {
            Some(d) => Err(ConfigError::Invalid(format!(
                "matryoshka_dimensions holds {d}, not a size of this model's embeddings \
                 (1 to {hidden})"
            ))),
            None => Ok(()),
        }
    }

    /// Whether an embedding of `hidden` values may be cut to `dimensions`: to its full size
    /// always, to another only where the model lists it.
    pub fn allows(&self, dimensions: usize, hidden: usize) -> bool {
        dimensions == hidden || self.matryoshka_dimensions.contains(&dimensions)
    }

    /// The embedding of a text whose final-norm hidden states are `rows` (`hidden` values a
    /// position, position by position), cut to its first `dimensions` values if asked,
    /// then normalized if the model normalizes (cut first, as vLLM does, so a cut vector
    /// has unit length too).
    pub fn pool(&self, rows: &[f32], hidden: usize, dimensions: Option<usize>) -> Vec<f32> {
        let positions = rows.len() / hidden;
        let mut pooled = match self.pooling {
            PoolingMode::Cls => rows[..hidden].to_vec(),
            PoolingMode::Last => rows[(positions - 1) * hidden..].to_vec(),
            PoolingMode::Mean => {
                // Summed position by position in f32, then divided, as
                // sentence-transformers' Pooling computes it.
                let mut sum = vec![0f32; hidden];
                for row in rows.chunks_exact(hidden) {
                    sum.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
                }
                sum.iter().map(|s| s / positions as f32).collect()
            }
        };
        pooled.truncate(dimensions.unwrap_or(hidden));
        if self.normalize {
            normalize(&mut pooled);
        }
        pooled
    }
}

/// Scales `v` to unit L2 length, as torch's `F.normalize` (a norm below 1e-12 taken as
/// 1e-12, so a zero vector stays zero).
fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let norm = norm.max(1e-12) as f32;
    v.iter_mut().for_each(|x| *x /= norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooling(mode: PoolingMode, normalize: bool) -> Pooling {
        Pooling {
            pooling: mode,
            normalize,
            ..Pooling::default()
        }
    }

    #[test]
    fn pools_the_positions_each_mode_names() {
        let rows = [1.0, 2.0, 3.0, 6.0, 5.0, 10.0];
        assert_eq!(
            pooling(PoolingMode::Cls, false).pool(&rows, 2, None),
            [1.0, 2.0]
        );
        assert_eq!(
            pooling(PoolingMode::Last, false).pool(&rows, 2, None),
            [5.0, 10.0]
        );
        assert_eq!(
            pooling(PoolingMode::Mean, false).pool(&rows, 2, None),
            [3.0, 6.0]
        );
        assert_eq!(
            pooling(PoolingMode::Last, true).pool(&[3.0, 4.0], 2, None),
            [0.6, 0.8]
        );
        // Cut, then normalized.
        assert_eq!(
            pooling(PoolingMode::Last, true).pool(&[3.0, 4.0], 2, Some(1)),
            [1.0]
        );
        assert_eq!(
            pooling(PoolingMode::Last, true).pool(&[0.0, 0.0], 2, None),
            [0.0, 0.0]
        );
    }

    #[test]
    fn reads_what_it_writes_and_refuses_unknown_keys() {
        let written = Pooling {
            matryoshka_dimensions: vec![32, 16],
            ..pooling(PoolingMode::Mean, true)
        };
        let text = serde_json::to_string(&written).unwrap();
        assert_eq!(serde_json::from_str::<Pooling>(&text).unwrap(), written);
        let unknown = r#"{"pooling": "mean", "normalize": true, "max_tokens": 3}"#;
        assert!(serde_json::from_str::<Pooling>(unknown).is_err());
        let mode = r#"{"pooling": "max", "normalize": true}"#;
        assert!(serde_json::from_str::<Pooling>(mode).is_err());
        assert!(written.check(32).is_ok() && written.check(31).is_err());
        assert!(written.allows(16, 64) && written.allows(64, 64) && !written.allows(8, 64));
    }
}
