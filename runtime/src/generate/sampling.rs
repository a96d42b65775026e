//! Choosing the next token from the logits: greedy, or temperature sampling narrowed by
//! top-k, top-p and min-p, after optional biases (OpenAI's `logit_bias`), a repetition
//! penalty and OpenAI's presence and frequency penalties. Outside the model, as in llama2.c
//! and llama-burn.

use std::collections::HashMap;

use kernels::simd;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The command line's sampling defaults, llama.cpp's.
pub mod defaults {
    pub const TEMPERATURE: f32 = 0.8;
    pub const TOP_K: usize = 40;
    pub const TOP_P: f32 = 0.95;
    pub const MIN_P: f32 = 0.05;
}

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
    /// OpenAI's presence penalty, in [-2, 2]: taken off the logit of every token generated
    /// so far, once (0: none).
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]: taken off a token's logit once per time it
    /// has been generated so far (0: none).
    pub frequency_penalty: f32,
    /// Added to these tokens' logits before anything else, each in [-100, 100] (OpenAI's
    /// `logit_bias`: -100 all but bans a token, 100 all but forces it). Ids past the logits
    /// are ignored: the caller checks them against its vocabulary.
    pub logit_bias: Vec<(u32, f32)>,
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
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
        for (name, value) in [
            ("presence-penalty", self.presence_penalty),
            ("frequency-penalty", self.frequency_penalty),
        ] {
            if !(finite(value) && (-2.0..=2.0).contains(&value)) {
                return Err(format!("{name} {value} must be in [-2, 2]"));
            }
        }
        if let Some((id, bias)) = (self.logit_bias.iter())
            .find(|(_, bias)| !(finite(*bias) && (-100.0..=100.0).contains(bias)))
        {
            return Err(format!(
                "logit-bias {bias} for token {id} must be in [-100, 100]"
            ));
        }
        Ok(())
    }
}

/// Picks tokens with a seeded generator, so the same seed gives the same text.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// How many times each token has been picked (for the presence and frequency
    /// penalties: OpenAI counts the tokens generated, not the prompt's).
    picked: HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Self {
            params,
            rng,
            picked: HashMap::new(),
        }
    }

    /// A new sampler with these parameters but `seed` (another choice of the same request).
    pub fn reseeded(&self, seed: u64) -> Self {
        Self::new(SamplingParams {
            seed,
            ..self.params.clone()
        })
    }

    /// The next token, given the logits of the last position and the tokens so far: the
    /// logits biased, then penalized (repetition over `history`, presence and frequency
    /// over the tokens this sampler picked), then the pick.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.sample_masked(logits, history, |_| ())
    }

    /// [`Self::sample`] with `mask` applied to the logits after the biases and penalties,
    /// before the pick: a grammar's, which no bias can override.
    pub fn sample_masked(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        mask: impl FnOnce(&mut [f32]),
    ) -> u32 {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit += bias;
            }
        }
        if p.repeat_penalty != 1.0 {
            apply_repeat_penalty(logits, history, p.repeat_penalty, p.repeat_last_n);
        }
        let penalized = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if penalized {
            for (&id, &count) in &self.picked {
                if let Some(logit) = logits.get_mut(id as usize) {
                    *logit -= p.frequency_penalty * count as f32 + p.presence_penalty;
                }
            }
        }
        mask(logits);
        let next = self.pick(logits);
        if penalized {
            *self.picked.entry(next).or_default() += 1;
        }
        next
    }

    /// Greedy, or a draw from [`candidates`]: one uniform draw walked down the kept
    /// probabilities, most likely first. A draw past their rounded sum lands on the last
    /// kept token: never on one the filters dropped.
    fn pick(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let draw = f64::from(self.rng.random::<f32>());
        if p.top_k > 0 && p.top_k < logits.len() {
            // Ranking the top k is a selection and a sort of k: cheap already.
            return walk(filtered(logits, p).into_iter(), draw);
        }
        Ranking::new(logits, p).pick(draw)
    }
}

/// The draw walked down `kept` (ids with their probabilities, most likely first, summing
/// to 1 but for rounding).
fn walk(kept: impl Iterator<Item = (u32, f64)>, mut target: f64) -> u32 {
    let mut last = 0;
    for (id, q) in kept {
        if target < q {
            return id;
        }
        target -= q;
        last = id;
    }
    last
}

/// [`filtered`]'s distribution over the whole vocabulary (no top-k), with the ranking done
/// only as far as it is read: the tokens sorted a tier of weights at a time, most likely
/// first, while top-p's cut or the draw needs another. Each weight is computed once; a
/// draw usually lands in the first tier, so a step sorts a few tokens instead of the
/// vocabulary (49,152 for SmolLM2). The same tokens, in the same order, with the same
/// probabilities as [`filtered`] (sums taken in another order: equal to rounding).
struct Ranking<'a> {
    logits: &'a [f32],
    params: &'a SamplingParams,
    /// Each token's weight ([`weights`]).
    weights: Vec<f32>,
    total: f64,
    /// The ids ranked so far: every token of weight at least `ranked_down_to`.
    ranked: Vec<u32>,
    ranked_down_to: f32,
}

impl<'a> Ranking<'a> {
    /// Tiers of weight, each `TIER` times lighter than the last.
    const TIER: f32 = 1.0 / 256.0;

    fn new(logits: &'a [f32], params: &'a SamplingParams) -> Self {
        let (weights, total) = weights(logits, params.temperature);
        Self {
            logits,
            params,
            weights,
            total,
            ranked: Vec::new(),
            ranked_down_to: f32::INFINITY,
        }
    }

    /// Ranks the next tier of weights (every weight left, once they are tiny); false when
    /// every token is ranked.
    fn rank_next_tier(&mut self) -> bool {
        if self.ranked_down_to == 0.0 {
            return false;
        }
        let high = self.ranked_down_to;
        let low = if high == f32::INFINITY {
            Self::TIER
        } else if high < 1e-30 {
            0.0
        } else {
            high * Self::TIER
        };
        let start = self.ranked.len();
        let in_tier = |w: f32| w >= low && w < high;
        (self.ranked)
            .extend((0..self.weights.len() as u32).filter(|&i| in_tier(self.weights[i as usize])));
        let logits = self.logits;
        self.ranked[start..].sort_unstable_by(|a, b| by_rank(logits, *a, *b));
        self.ranked_down_to = low;
        true
    }

    /// The `i`th most likely token, ranking as far as needed.
    fn nth(&mut self, i: usize) -> Option<u32> {
        while i >= self.ranked.len() {
            if !self.rank_next_tier() {
                return None;
            }
        }
        Some(self.ranked[i])
    }

    fn probability(&self, id: u32) -> f64 {
        f64::from(self.weights[id as usize]) / self.total
    }

    /// The token the draw picks, as [`walk`] over [`filtered`] picks it.
    fn pick(mut self, draw: f64) -> u32 {
        let p = self.params;
        // min-p (and probability zero), as `kept_prefix`: how many tokens pass it and their
        // probabilities' sum, in one pass in id order, compared and summed as weights (the
        // largest is 1, so min-p's floor is `min_p` itself): no division per token.
        let floor = p.min_p;
        let (above, above_weight) = (self.weights.iter())
            .filter(|&&w| w >= floor && w > 0.0)
            .fold((0, 0.0f64), |(n, sum), &w| (n + 1, sum + f64::from(w)));
        let above_total = above_weight / self.total;
        // top-p: the smallest ranked prefix reaching it, summed in rank order.
        let mut keep = above;
        let mut kept_total = above_total;
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut i = 0;
            while let Some(id) = self.nth(i) {
                cumulative += self.probability(id);
                i += 1;
                if cumulative >= f64::from(p.top_p) {
                    break;
                }
            }
            if i < keep {
                keep = i;
                kept_total = cumulative;
            }
        }
        let keep = keep.max(1);
        let mut target = draw;
        let mut last = 0;
        for i in 0..keep {
            let Some(id) = self.nth(i) else { break };
            let q = self.probability(id) / kept_total;
            if target < q {
                return id;
            }
            target -= q;
            last = id;
        }
        last
    }
}

/// The tokens temperature sampling may pick, most likely first, each with its probability:
/// `softmax(logits / temperature)`, cut to the `top_k` most likely, then to the smallest
/// prefix whose probability reaches `top_p`, then to the tokens at least `min_p` times as
/// likely as the first, and renormalised. Never empty; every probability finite. Needs
/// `temperature > 0`.
pub fn candidates(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    filtered(logits, params)
        .into_iter()
        .map(|(id, q)| (id, q as f32))
        .collect()
}

/// [`candidates`] in f64, without the tokens whose probability is zero (which no draw can
/// pick), the weights those of [`weights`].
fn filtered(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f64)> {
    let order = ranked(logits, params.top_k);
    let (all, _) = weights(logits, params.temperature);
    let weights: Vec<f64> = (order.iter())
        .map(|&id| f64::from(all[id as usize]))
        .collect();
    let total: f64 = weights.iter().sum();
    let probs: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let keep = kept_prefix(&probs, params);
    let total: f64 = probs[..keep].iter().sum();
    order
        .into_iter()
        .zip(probs)
        .take(keep)
        .map(|(id, q)| (id, q / total))
        .collect()
}

/// Every token's weight at `temperature`, `exp((logit - max) / temperature)`, and their
/// sum (at least 1): one vectorized pass, one exp per token ([`simd::temperature_weights`]).
/// The difference is at most zero, so the weights lie in [0, 1] with the largest exactly
/// 1, and no temperature an f32 can hold (subnormals included) or logit gap overflows
/// (dividing the logits first is what made `temperature 1e-40` give `inf - inf`).
/// Infinite logits (a repetition penalty can make them) follow the same rule: tokens equal
/// to the maximum weigh 1, all others 0. A NaN logit, a masked one (`-inf`) and any whose
/// weight would be below f32's normal range weigh 0.
fn weights(logits: &[f32], temperature: f32) -> (Vec<f32>, f64) {
    let max = simd::max(logits);
    if max == f32::NEG_INFINITY {
        // Every logit -inf or NaN: all tie at the maximum, as they rank.
        return (vec![1.0; logits.len()], logits.len() as f64);
    }
    let mut weights = vec![0.0; logits.len()];
    let total = simd::temperature_weights(logits, max, temperature, &mut weights);
    (weights, f64::from(total))
}

/// Token ids by logit, most likely first, ties in id order (what a stable sort gives), cut
/// to the `top_k` first (0: all).
fn ranked(logits: &[f32], top_k: usize) -> Vec<u32> {
    if top_k > 0 && top_k <= ONE_PASS_TOP_K && top_k < logits.len() {
        return top_ranked(logits, top_k);
    }
    let by_logit = |a: &u32, b: &u32| by_rank(logits, *a, *b);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    if top_k > 0 && top_k < order.len() {
        // Only the first `top_k` need sorting: O(n) to find them.
        order.select_nth_unstable_by(top_k - 1, by_logit);
        order.truncate(top_k);
    }
    order.sort_unstable_by(by_logit);
    order
}

/// The largest top-k that [`top_ranked`] finds: each token that joins moves up to `k` ids,
/// so a large `k` (a client may send thousands) takes the selection, O(n) whatever `k`.
const ONE_PASS_TOP_K: usize = 256;

/// [`ranked`]'s first `k` (`0 < k`, small): one pass over the logits keeping the best `k`
/// so far in rank order. A token joins only if it outranks the last kept, which after the
/// first few hundred tokens almost none does, so a step costs about a comparison per token.
/// (A selection over the ids, comparing logits through them, took 4% of a sampled token's
/// time at top-k 40.)
fn top_ranked(logits: &[f32], k: usize) -> Vec<u32> {
    let mut kept: Vec<u32> = Vec::with_capacity(k + 1);
    // The last kept token's key once `k` are kept: ids come in increasing order, so a
    // later token of the same logit ranks after it.
    let mut floor = f32::NEG_INFINITY;
    for (id, &logit) in (0u32..).zip(logits) {
        if kept.len() == k && rank_key(logit) <= floor {
            continue;
        }
        let at = kept.partition_point(|&other| by_rank(logits, other, id).is_lt());
        kept.insert(at, id);
        if kept.len() > k {
            kept.pop();
        }
        if kept.len() == k {
            floor = rank_key(logits[kept[k - 1] as usize]);
        }
    }
    kept
}

/// Token `a` against token `b` by logit, most likely first, ties in id order.
fn by_rank(logits: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
    let (la, lb) = (rank_key(logits[a as usize]), rank_key(logits[b as usize]));
    lb.partial_cmp(&la)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.cmp(&b))
}

/// A logit as ranked and weighed: NaN (a broken model's output) as the least likely.
fn rank_key(logit: f32) -> f32 {
    if logit.is_nan() {
        f32::NEG_INFINITY
    } else {
        logit
    }
}

/// How many of `probs` (sorted, most likely first, summing to 1) top-p and min-p keep, and
/// of those the ones with a probability above zero; at least the first.
fn kept_prefix(probs: &[f64], params: &SamplingParams) -> usize {
    let mut keep = probs.len();
    if params.top_p < 1.0 {
        let mut cumulative = 0.0;
        for (i, q) in probs.iter().enumerate() {
            cumulative += q;
            if cumulative >= f64::from(params.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    let floor = f64::from(params.min_p) * probs[0];
    let above = |floor: f64| probs.iter().take_while(|&&q| q >= floor && q > 0.0).count();
    keep.min(above(floor)).max(1)
}

/// Index of the largest logit; the first on ties, as `torch.argmax`.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if rank_key(l) > rank_key(logits[best]) {
            best = i;
        }
    }
    best as u32
}

/// A generated token's log-probability under the model (the log-softmax of its raw logits,
/// before temperature, penalties or truncation, as OpenAI's `logprobs` reports) and the
/// most likely tokens' at that step, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// `ln Σ exp(logit)` over `logits`, summed in f64 from the largest (no overflow): a
/// token's log-probability is its logit minus this.
pub fn log_partition(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln()
}

/// The log-probability of `id` under `logits`, and the `top` most likely tokens' (ties
/// in id order), computed in f64.
pub fn logprobs(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let log_z = log_partition(logits);
    let logprob = |i: usize| (logits[i] as f64 - log_z) as f32;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(order.len());
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if top > 0 {
        order.select_nth_unstable_by(top - 1, by_logit);
    }
    order.truncate(top);
    order.sort_by(by_logit);
    TokenLogprob {
        id,
        logprob: logprob(id as usize),
        top: order
            .into_iter()
            .map(|i| (i, logprob(i as usize)))
            .collect(),
    }
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
    #[test]
    fn logprobs_are_the_log_softmax_and_its_top() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        let got = logprobs(&logits, 2, 3);
        assert!((got.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = got.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 3, 2], "most likely first, ties by id");
        assert!((got.top[0].1 as f64 - (3.0 - z.ln())).abs() < 1e-6);
        assert!(logprobs(&logits, 0, 0).top.is_empty());
        assert_eq!(logprobs(&logits, 0, 9).top.len(), 5);
    }

    use super::defaults::*;
    use super::*;

    /// The top `k` found in one pass, or by the selection past [`ONE_PASS_TOP_K`], are a
    /// full sort's first `k`, ties in id order, NaN last, for `k` from 1 past the vocabulary.
    #[test]
    fn top_ranked_is_the_sorts_prefix() {
        let mut rng = StdRng::seed_from_u64(7);
        let logits: Vec<f32> = (0..600)
            .map(|i| match i % 50 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                // Few distinct values: many ties.
                _ => rng.random_range(-11..=11) as f32,
            })
            .collect();
        let all = ranked(&logits, 0);
        assert_eq!(all.len(), logits.len());
        for k in [1, 2, 5, 40, 256, 257, 599, 600] {
            assert_eq!(top_ranked(&logits, k), all[..k], "k = {k}");
            assert_eq!(ranked(&logits, k), all[..k], "k = {k}");
        }
        assert_eq!(ranked(&logits, 700), all);
        let increasing: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(top_ranked(&increasing, 3), [99, 98, 97]);
    }

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

    /// OpenAI's definition, step by step: the logits the sampler picks from are the model's
    /// plus the biases, minus `frequency * count + presence * (count > 0)` over the tokens
    /// picked before (not the prompt's). Greedy picks are checked against the argmax of
    /// that, and sampled ones against the sampler given those logits directly.
    #[test]
    fn biases_and_penalties_follow_their_definitions() {
        let mut rng = StdRng::seed_from_u64(3);
        for case in 0..200 {
            let vocab = 12;
            let params = SamplingParams {
                temperature: if case % 2 == 0 { 0.0 } else { 0.9 },
                presence_penalty: rng.random_range(-2.0..=2.0),
                frequency_penalty: rng.random_range(-2.0..=2.0),
                logit_bias: vec![
                    (rng.random_range(0..vocab), rng.random_range(-5.0..5.0)),
                    (99, 1.0),
                ],
                seed: case,
                ..Default::default()
            };
            let mut sampler = Sampler::new(params.clone());
            let mut plain = Sampler::new(SamplingParams {
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
                logit_bias: Vec::new(),
                ..params.clone()
            });
            let prompt = [1u32, 1, 2];
            let mut history = prompt.to_vec();
            let mut counts = [0u32; 12];
            for _ in 0..30 {
                let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-3.0..3.0)).collect();
                let mut want = logits.clone();
                for &(id, bias) in &params.logit_bias {
                    if let Some(w) = want.get_mut(id as usize) {
                        *w += bias;
                    }
                }
                for (w, &c) in want.iter_mut().zip(&counts) {
                    let seen = if c > 0 { 1.0 } else { 0.0 };
                    *w -= params.frequency_penalty * c as f32 + params.presence_penalty * seen;
                }
                let got = sampler.sample(&mut logits.clone(), &history);
                assert_eq!(
                    got,
                    plain.sample(&mut want.clone(), &history),
                    "case {case}"
                );
                if params.temperature == 0.0 {
                    assert_eq!(got, argmax(&want), "case {case}");
                }
                counts[got as usize] += 1;
                history.push(got);
            }
        }
        // +100 all but forces a token, -100 all but bans one.
        let logits = [1.0f32, 4.0, 2.0];
        let forced = SamplingParams {
            logit_bias: vec![(0, 100.0)],
            ..Default::default()
        };
        assert_eq!(Sampler::new(forced).sample(&mut logits.clone(), &[]), 0);
        let banned = SamplingParams {
            logit_bias: vec![(1, -100.0)],
            ..Default::default()
        };
        assert_eq!(Sampler::new(banned).sample(&mut logits.clone(), &[]), 2);
    }

    #[test]
    fn penalties_and_biases_out_of_range_are_refused_by_name() {
        let check = |params: SamplingParams, name: &str| {
            let error = params.validate().unwrap_err();
            assert!(error.starts_with(name), "{error}");
        };
        for v in [2.5, -2.01, f32::NAN, f32::INFINITY] {
            check(
                SamplingParams {
                    presence_penalty: v,
                    ..Default::default()
                },
                "presence-penalty",
            );
            check(
                SamplingParams {
                    frequency_penalty: v,
                    ..Default::default()
                },
                "frequency-penalty",
            );
        }
        for v in [100.5, -101.0, f32::NAN] {
            check(
                SamplingParams {
                    logit_bias: vec![(3, v)],
                    ..Default::default()
                },
                "logit-bias",
            );
        }
        let edges = SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(0, -100.0), (1, 100.0)],
            ..Default::default()
        };
        assert!(edges.validate().is_ok());
    }

    /// `ln` of a distribution, as logits.
    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    fn sampled(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            ..Default::default()
        }
    }

    fn assert_candidates(params: SamplingParams, logits: &[f32], want: &[(u32, f64)]) {
        let got = candidates(logits, &params);
        assert_eq!(got.len(), want.len(), "{params:?}: {got:?}");
        for (&(id, p), &(want_id, want_p)) in got.iter().zip(want) {
            assert_eq!(id, want_id, "{params:?}: {got:?}");
            assert!((p as f64 - want_p).abs() < 1e-6, "{params:?}: {got:?}");
        }
    }

    /// Each filter alone on a distribution small enough to check by hand:
    /// p = [0.1, 0.5, 0.15, 0.25] (token 1 first, then 3, 2, 0).
    #[test]
    fn each_filter_keeps_what_its_definition_keeps() {
        let logits = logits_of(&[0.1, 0.5, 0.15, 0.25]);
        let all = [(1, 0.5), (3, 0.25), (2, 0.15), (0, 0.1)];
        assert_candidates(sampled(1.0, 0, 1.0, 0.0), &logits, &all);
        // top-k 2: the two most likely, renormalised.
        assert_candidates(
            sampled(1.0, 2, 1.0, 0.0),
            &logits,
            &[(1, 2. / 3.), (3, 1. / 3.)],
        );
        // top-p: the smallest prefix reaching p; 0.7 is reached by 0.5 + 0.25.
        assert_candidates(
            sampled(1.0, 0, 0.7, 0.0),
            &logits,
            &[(1, 2. / 3.), (3, 1. / 3.)],
        );
        // 0.8 needs a third token (0.75 < 0.8).
        let three = [(1, 0.5 / 0.9), (3, 0.25 / 0.9), (2, 0.15 / 0.9)];
        assert_candidates(sampled(1.0, 0, 0.8, 0.0), &logits, &three);
        // top-p below the first token's probability keeps that one.
        assert_candidates(sampled(1.0, 0, 0.3, 0.0), &logits, &[(1, 1.0)]);
        // min-p 0.4: at least 0.4 × 0.5 = 0.2, so 0.25 stays and 0.15 goes.
        assert_candidates(
            sampled(1.0, 0, 1.0, 0.4),
            &logits,
            &[(1, 2. / 3.), (3, 1. / 3.)],
        );
        // min-p 0.25: at least 0.125, so 0.15 stays and 0.1 goes.
        assert_candidates(sampled(1.0, 0, 1.0, 0.25), &logits, &three);
        // Temperature 0.5 squares the probabilities before anything is cut.
        let squares = [0.25, 0.0625, 0.0225, 0.01];
        let sum: f64 = squares.iter().sum();
        let want: Vec<(u32, f64)> = [1, 3, 2, 0]
            .into_iter()
            .zip(squares.map(|q| q / sum))
            .collect();
        assert_candidates(sampled(0.5, 0, 1.0, 0.0), &logits, &want);
        // ... so that top-p 0.9 then keeps two tokens (0.725 + 0.181 ≥ 0.9), where at
        // temperature 1 it would keep three.
        let hot = (0.25 + 0.0625) / sum;
        assert_candidates(
            sampled(0.5, 0, 0.9, 0.0),
            &logits,
            &[(1, 0.25 / sum / hot), (3, 0.0625 / sum / hot)],
        );
    }

    /// What the chain should give, computed apart from `candidates`, in f64: softmax of
    /// logits / T, top-k, top-p, min-p, renormalised; indexed by token id.
    fn expected_distribution(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
        let scaled: Vec<f64> = logits
            .iter()
            .map(|&l| l as f64 / p.temperature as f64)
            .collect();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]));
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        let max = scaled[order[0]];
        // As the sampler keeps its weights: in f32 (tokens whose weights round alike tie
        // at min-p's and top-p's edges), and 0 where the exponent is below -87.
        let weight = |x: f64| {
            if x < -87.0 {
                0.0
            } else {
                x.exp() as f32 as f64
            }
        };
        let weights: Vec<f64> = order.iter().map(|&i| weight(scaled[i] - max)).collect();
        let total: f64 = weights.iter().sum();
        let probs: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let mut kept = 0;
        let mut cumulative = 0.0;
        while kept < probs.len() {
            cumulative += probs[kept];
            kept += 1;
            if cumulative >= p.top_p as f64 {
                break;
            }
        }
        let floor = p.min_p as f64 * probs[0];
        kept = kept.min(probs.iter().filter(|&&q| q >= floor).count());
        let total: f64 = probs[..kept].iter().sum();
        let mut out = vec![0.0; logits.len()];
        for (&id, q) in order.iter().zip(&probs[..kept]) {
            out[id] = q / total;
        }
        out
    }

    /// The upper `1e-9` quantile of a chi-squared distribution with `df` degrees of freedom
    /// (Wilson-Hilferty; z = 6.0 is the normal's 1e-9 upper quantile).
    fn chi_squared_bound(df: usize) -> f64 {
        let df = df as f64;
        let a = 2.0 / (9.0 * df);
        df * (1.0 - a + 6.0 * a.sqrt()).powi(3)
    }

    /// Sampled frequencies against the distribution the filters define, for the command
    /// line's default chain and each filter on its own, over 120 tokens (ids not in logit
    /// order). Two shapes of logits: `steep` (a few likely tokens, a long tail: min-p is the
    /// cut that binds in the default chain, keeping 6) and `flat` (a slow decline: top-k cuts
    /// to 40 and top-p then to 33 of those).
    ///
    /// Each case draws 200 000 tokens with a fixed seed and compares the counts with a
    /// chi-squared test whose false-alarm rate is 1e-9 per case: a correct sampler fails it
    /// for about one seed in a billion, while an off-by-one in a cut, or the temperature
    /// applied after the cuts instead of before, moves the counts far past the bound (and a
    /// token outside the kept set fails at once).
    #[test]
    fn sampled_frequencies_match_the_filtered_softmax() {
        let rank = |i: usize| ((i * 37) % 120) as f32;
        let steep: Vec<f32> = (0..120)
            .map(|i| 4.0 - 1.3 * (1.0 + rank(i)).ln() + 0.15 * (i as f32).sin())
            .collect();
        let flat: Vec<f32> = (0..120).map(|i| 2.0 - 0.05 * rank(i)).collect();
        let defaults = SamplingParams {
            temperature: TEMPERATURE,
            top_k: TOP_K,
            top_p: TOP_P,
            min_p: MIN_P,
            ..Default::default()
        };
        for (logits, params) in [
            (&steep, defaults.clone()),
            (&flat, defaults),
            (&steep, sampled(TEMPERATURE, 0, 1.0, 0.0)),
            (&steep, sampled(1.0, TOP_K, 1.0, 0.0)),
            (&steep, sampled(1.0, 0, TOP_P, 0.0)),
            (&steep, sampled(1.0, 0, 1.0, MIN_P)),
            (&flat, sampled(1.3, 0, 0.8, 0.0)),
        ] {
            let expected = expected_distribution(logits, &params);
            let kept = expected.iter().filter(|&&q| q > 0.0).count();
            assert!(kept > 1, "{params:?} keeps {kept}");
            let draws = 200_000;
            let mut counts = vec![0usize; logits.len()];
            let mut sampler = Sampler::new(SamplingParams {
                seed: 42,
                ..params.clone()
            });
            for _ in 0..draws {
                counts[sampler.sample(&mut logits.to_vec(), &[]) as usize] += 1;
            }
            let mut chi_squared = 0.0;
            for (id, (&count, &q)) in counts.iter().zip(&expected).enumerate() {
                if q == 0.0 {
                    assert_eq!(count, 0, "{params:?}: token {id} is outside the kept set");
                    continue;
                }
                let want = q * draws as f64;
                chi_squared += (count as f64 - want).powi(2) / want;
            }
            let bound = chi_squared_bound(kept - 1);
            assert!(
                chi_squared < bound,
                "{params:?}: chi-squared {chi_squared:.1} over {} tokens, bound {bound:.1}",
                kept
            );
        }
    }

    /// Logits of one of the shapes a model or a penalty can give: spread at a random scale
    /// (up to f32's largest), all tied, a few values repeated, extremes mixed with
    /// subnormals, or some masked to `-inf`.
    fn random_logits(rng: &mut StdRng) -> Vec<f32> {
        let n = rng.random_range(1..160);
        let scale = [1e-30, 1e-3, 1.0, 30.0, 1e10, 1e30, f32::MAX][rng.random_range(0..7)];
        let spread = |rng: &mut StdRng| (rng.random::<f32>() * 2.0 - 1.0) * scale;
        match rng.random_range(0..5) {
            0 => (0..n).map(|_| spread(rng)).collect(),
            1 => vec![spread(rng); n],
            2 => {
                let values = [spread(rng), spread(rng), spread(rng)];
                (0..n).map(|_| values[rng.random_range(0..3)]).collect()
            }
            3 => {
                let extremes = [f32::MAX, -f32::MAX, 0.0, 1e-45, -1e-45, f32::MIN_POSITIVE];
                (0..n).map(|_| extremes[rng.random_range(0..6)]).collect()
            }
            _ => (0..n)
                .map(|_| match rng.random_bool(0.3) {
                    true => f32::NEG_INFINITY,
                    false => spread(rng),
                })
                .collect(),
        }
    }

    /// A positive f32 spread over f32's whole range, subnormals included.
    fn log_uniform(rng: &mut StdRng) -> f32 {
        10f64
            .powf(rng.random_range(-45.0..38.5))
            .clamp(1e-45, f32::MAX as f64) as f32
    }

    /// Valid sampling parameters, each often at an edge of its range.
    fn random_params(rng: &mut StdRng, n: usize) -> SamplingParams {
        let pick = |rng: &mut StdRng, edges: &[f32], random: f32| match rng
            .random_range(0..edges.len() + 1)
        {
            i if i < edges.len() => edges[i],
            _ => random,
        };
        let random = log_uniform(rng);
        let temperature = pick(
            rng,
            &[1e-45, 1e-40, f32::MIN_POSITIVE, 0.8, f32::MAX],
            random,
        );
        let unit = rng.random::<f32>().max(1e-45);
        let top_p = pick(rng, &[1.0, 1e-45, 1e-30, 0.5], unit);
        let unit = rng.random::<f32>();
        let min_p = pick(rng, &[0.0, 1.0, 1e-45, 0.05], unit);
        let random = log_uniform(rng);
        let repeat_penalty = pick(rng, &[1.0, 1e-45, 1e-20, 1.3, 1e20, f32::MAX], random);
        let top_k = [0, 1, 2, 40, rng.random_range(0..n + 3)][rng.random_range(0..5)];
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n: rng.random_range(0..8),
            seed: rng.random(),
            ..Default::default()
        }
    }

    /// What every valid combination must give: a non-empty set of distinct tokens, most
    /// likely first and never one below a token left out, within top-k, each with a finite
    /// probability, summing to 1, none below min-p; and for finite logits the distribution
    /// the filters define (`expected_distribution`, computed apart, in f64).
    fn assert_well_formed(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f32)> {
        let got = candidates(logits, params);
        let context = || format!("{params:?} on {logits:?}: {got:?}");
        assert!(!got.is_empty(), "{}", context());
        if params.top_k > 0 {
            assert!(got.len() <= params.top_k, "{}", context());
        }
        let mut ids: Vec<u32> = got.iter().map(|&(id, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), got.len(), "{}", context());
        let logit = |id: u32| rank_key(logits[id as usize]);
        assert!(
            got.windows(2).all(|w| logit(w[0].0) >= logit(w[1].0)),
            "{}",
            context()
        );
        let lowest = logit(got[got.len() - 1].0);
        let above = (0..logits.len() as u32).filter(|&id| logit(id) > lowest);
        assert!(
            above.count() < got.len(),
            "a more likely token was dropped: {}",
            context()
        );
        assert!(
            got.iter().all(|&(_, q)| q.is_finite() && q >= 0.0),
            "{}",
            context()
        );
        let sum: f64 = got.iter().map(|&(_, q)| q as f64).sum();
        assert!((sum - 1.0).abs() < 1e-5, "sums to {sum}: {}", context());
        let floor = params.min_p as f64 * got[0].1 as f64;
        assert!(
            got[got.len() - 1].1 as f64 >= floor * (1.0 - 1e-6) - 1e-44,
            "{}",
            context()
        );
        if logits.iter().all(|l| l.is_finite()) {
            let want = expected_distribution(logits, params);
            let mut ours = vec![0.0; logits.len()];
            got.iter().for_each(|&(id, q)| ours[id as usize] = q as f64);
            for (id, (&ours, &want)) in ours.iter().zip(&want).enumerate() {
                assert!(
                    (ours - want).abs() < 1e-6,
                    "token {id}: {ours} vs {want}: {}",
                    context()
                );
            }
        }
        got
    }

    /// A seeded walk over the parameter space: temperatures from f32's smallest subnormal
    /// to its largest value, every filter at its edges, penalties that push logits to
    /// infinity, logits up to f32::MAX, tied, or masked. Each combination must give a
    /// well-formed distribution, and the sampler only tokens in it.
    #[test]
    fn every_valid_parameter_combination_gives_a_finite_distribution() {
        let mut rng = StdRng::seed_from_u64(25);
        for _ in 0..4000 {
            let logits = random_logits(&mut rng);
            let params = random_params(&mut rng, logits.len());
            params.validate().unwrap();
            let history: Vec<u32> = (0..rng.random_range(0..12))
                .map(|_| rng.random_range(0..logits.len() as u32 + 2))
                .collect();
            let mut penalised = logits.clone();
            apply_repeat_penalty(
                &mut penalised,
                &history,
                params.repeat_penalty,
                params.repeat_last_n,
            );
            let kept = assert_well_formed(&penalised, &params);
            let mut sampler = Sampler::new(params.clone());
            for _ in 0..8 {
                let id = sampler.sample(&mut logits.clone(), &history);
                assert!(
                    kept.iter().any(|&(k, _)| k == id),
                    "{params:?}: {id} not in {kept:?}"
                );
            }
        }
    }

    /// The lazily ranked pick is the walk down [`filtered`]'s whole ranked list: the same
    /// token for the same draw, on the random cases above and on vocabulary-sized logits
    /// (a draw within rounding of a boundary between two tokens may go either way).
    #[test]
    fn the_lazy_ranking_picks_what_the_full_ranking_picks() {
        let mut rng = StdRng::seed_from_u64(41);
        let mut cases: Vec<(Vec<f32>, SamplingParams)> = (0..3000)
            .map(|_| {
                let logits = random_logits(&mut rng);
                let mut params = random_params(&mut rng, logits.len());
                params.top_k = 0;
                (logits, params)
            })
            .collect();
        for (temperature, top_p, min_p) in [(0.8, 1.0, 0.0), (0.7, 0.95, 0.0), (1.0, 1.0, 0.05)] {
            // Logits spread as a model's are: a few far above a normal crowd.
            let logits: Vec<f32> = (0..49_152)
                .map(|i| {
                    let normal: f32 = (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0;
                    3.0 * normal + if i % 4099 == 0 { 12.0 } else { 0.0 }
                })
                .collect();
            let params = SamplingParams {
                temperature,
                top_p,
                min_p,
                ..Default::default()
            };
            cases.push((logits, params));
        }
        for (logits, params) in &cases {
            let kept = filtered(logits, params);
            let mut bounds = Vec::new();
            let mut cumulative = 0.0;
            for &(_, q) in &kept {
                cumulative += q;
                bounds.push(cumulative);
            }
            for _ in 0..20 {
                let draw = f64::from(rng.random::<f32>());
                if bounds.iter().any(|b| (b - draw).abs() < 1e-9) {
                    continue;
                }
                let full = walk(kept.iter().copied(), draw);
                let lazy = Ranking::new(logits, params).pick(draw);
                assert_eq!(
                    lazy,
                    full,
                    "{params:?}, draw {draw}, {} logits",
                    logits.len()
                );
            }
        }
    }

    /// As the temperature goes to zero, sampling becomes greedy: with temperatures down to
    /// f32's smallest subnormal, the most likely token is the only candidate (or the tied
    /// most likely ones, equally likely), whatever the filters.
    #[test]
    fn a_tiny_temperature_picks_the_argmax() {
        let mut rng = StdRng::seed_from_u64(4);
        for temperature in [1e-45, 1e-40, 1e-38, 1e-30] {
            for _ in 0..200 {
                let n = rng.random_range(1..300);
                let scale = [1e-3, 1.0, 30.0, 1e30, f32::MAX][rng.random_range(0..5)];
                let mut logits: Vec<f32> = (0..n)
                    .map(|_| (rng.random::<f32>() - 0.5) * scale)
                    .collect();
                let best = argmax(&logits);
                let params = SamplingParams {
                    temperature,
                    top_k: [0, 40][rng.random_range(0..2)],
                    top_p: [1.0, 0.95][rng.random_range(0..2)],
                    min_p: [0.0, 0.05][rng.random_range(0..2)],
                    seed: rng.random(),
                    ..Default::default()
                };
                let tied = logits
                    .iter()
                    .filter(|&&l| l == logits[best as usize])
                    .count();
                let got = candidates(&logits, &params);
                assert_eq!(got.len(), tied, "{params:?}: {got:?}");
                assert_eq!(got[0], (best, 1.0 / tied as f32), "{params:?}: {got:?}");
                if tied == 1 {
                    let mut sampler = Sampler::new(params.clone());
                    assert_eq!(sampler.sample(&mut logits, &[]), best, "{params:?}");
                }
            }
        }
    }
}
