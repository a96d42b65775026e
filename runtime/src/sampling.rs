//! Choosing the next token from the logits: greedy, or temperature sampling narrowed by
//! top-k, top-p and min-p, after an optional repetition penalty. Outside the model, as in
//! llama2.c and llama-burn.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How to pick tokens. `temperature == 0` is greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probabilities add up to `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// CTRL-style penalty on tokens seen in the last `repeat_last_n` tokens (1: none).
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 299_792_458,
        }
    }
}

impl SamplingParams {
    /// Checks the ranges, naming the first value out of range.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |v: f32| v.is_finite();
        if !(finite(self.temperature) && self.temperature >= 0.0) {
            return Err(format!("temperature {} must be >= 0", self.temperature));
        }
        if !(finite(self.top_p) && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        if !(finite(self.min_p) && (0.0..=1.0).contains(&self.min_p)) {
            return Err(format!("min-p {} must be in [0, 1]", self.min_p));
        }
        if !(finite(self.repeat_penalty) && self.repeat_penalty > 0.0) {
            return Err(format!(
                "repeat-penalty {} must be > 0",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
}

/// Picks tokens with a seeded generator, so the same seed gives the same text.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Self { params, rng }
    }

    /// The next token, given the logits of the last position and the tokens so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let p = &self.params;
        if p.repeat_penalty != 1.0 {
            apply_repeat_penalty(logits, history, p.repeat_penalty, p.repeat_last_n);
        }
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        // Candidates sorted by logit, most likely first (stable: ties keep id order).
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(id, &l)| (id as u32, l / p.temperature))
            .collect();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
        if p.top_k > 0 {
            candidates.truncate(p.top_k);
        }
        let max = candidates[0].1;
        let mut probs: Vec<f32> = candidates.iter().map(|&(_, l)| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);

        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            for (i, q) in probs.iter().enumerate() {
                cumulative += q;
                if cumulative >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = p.min_p * probs[0];
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        let total: f32 = probs[..keep].iter().sum();
        let mut target = self.rng.random::<f32>() * total;
        for (i, q) in probs[..keep].iter().enumerate() {
            if target < *q {
                return candidates[i].0;
            }
            target -= q;
        }
        candidates[keep - 1].0
    }
}

/// Index of the largest logit; the first on ties, as `torch.argmax`.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Divides positive logits and multiplies negative ones by `penalty` for every distinct
/// token among the last `window` tokens (transformers' `RepetitionPenaltyLogitsProcessor`).
fn apply_repeat_penalty(logits: &mut [f32], history: &[u32], penalty: f32, window: usize) {
    let start = history.len().saturating_sub(window);
    let mut seen = std::collections::HashSet::new();
    for &id in &history[start..] {
        let Some(logit) = logits.get_mut(id as usize) else {
            continue;
        };
        if seen.insert(id) {
            *logit = if *logit > 0.0 {
                *logit / penalty
            } else {
                *logit * penalty
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        let mut sampler = Sampler::new(SamplingParams::default());
        assert_eq!(sampler.sample(&mut [0.5, 2.0, 2.0, -1.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_one_is_greedy() {
        let params = SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |params: SamplingParams| {
            let mut s = Sampler::new(params);
            (0..20)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(params.clone()), draw(params.clone()));
        assert_ne!(
            draw(params.clone()),
            draw(SamplingParams {
                seed: 8,
                ..params.clone()
            })
        );
        let greedy = argmax(&logits);
        assert!(
            draw(SamplingParams {
                top_k: 1,
                ..params.clone()
            })
            .iter()
            .all(|&t| t == greedy)
        );
        assert!(
            draw(SamplingParams {
                min_p: 1.0,
                ..params
            })
            .iter()
            .all(|&t| t == greedy)
        );
    }

    #[test]
    fn repeat_penalty_pushes_seen_tokens_down() {
        let mut logits = [2.0, -2.0, 1.0];
        apply_repeat_penalty(&mut logits, &[0, 1, 0], 2.0, 64);
        assert_eq!(logits, [1.0, -4.0, 1.0]);
    }
}
