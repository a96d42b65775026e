//! Drafting the next tokens for speculative decoding: guesses that the model checks, all
//! at once, in one pass over its weights ([`Llama::decode_rows`]), keeping those it would
//! have picked itself. A guess changes no token: each position's logits are the bits a
//! one-token step gives, and each is picked from as a step would pick (the same sampler
//! draw), so the output is the plain decoding's, greedy or sampled with the same seed.
//!
//! [`Draft::Ngram`] is prompt lookup: the text so far (prompt and answer) is searched for
//! an earlier occurrence of its last few tokens, and what followed it then is the guess. It
//! needs no second model and pays off where an answer repeats its prompt (editing a passage
//! or code, quoting, summarizing with the source's words).
//!
//! [`Draft::Model`] asks a smaller model that shares the tokenizer (the generator's
//! [`draft_model`](super::Generator::draft_model), say SmolLM2-135M for a larger SmolLM2, or
//! the model's own copy in 4-bit blocks) for its greedy continuation. It keeps its own KV
//! cache per sequence, run up to the tokens the sequence has kept.
//!
//! [`Llama::decode_rows`]: crate::model::llama::Llama::decode_rows

use kernels::simd;

use super::sampling::argmax;
use super::{GenerateError, Generator, WantedLogits};
use crate::model::backend::KernelBackend;
use crate::model::cache::KvCache;

/// What drafts tokens for a sequence (`--draft`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draft {
    /// Prompt lookup: continue an earlier occurrence of the last tokens.
    Ngram,
    /// The generator's draft model, greedy.
    Model,
}

impl std::str::FromStr for Draft {
    type Err = String;

    /// `ngram`, as `--draft` names it (a draft model is named by its directory).
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "ngram" => Ok(Self::Ngram),
            other => Err(format!(
                "{other:?} is not a drafter: ngram (prompt lookup), or a draft model's directory"
            )),
        }
    }
}

/// Longest run of tokens matched against the text so far, tried first.
const MAX_NGRAM: usize = 3;
/// Shortest: a single matching token proposes too much that is wrong.
const MIN_NGRAM: usize = 2;
/// Most tokens drafted at once (the rows of one verify pass, less one).
pub const MAX_DRAFT: usize = 12;
/// Tokens drafted at first, and after a draft is rejected outright.
const FIRST_DRAFT: usize = 4;
/// Mean tokens accepted per draft (an exponential moving average) below which drafting is
/// paused: a verify pass of k + 1 rows costs more than one of a single row, so a draft
/// that is mostly rejected makes decoding slower.
const PAYS_OFF: f32 = 0.5;
/// Weight of the newest draft in that average.
const AVERAGE_WEIGHT: f32 = 0.25;
/// A draft model's timed steps before it may pause: one rejected draft is no trend.
const TIMED_STEPS: usize = 4;
/// Steps drafting is paused for the first time it does not pay; doubled each time after,
/// up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: usize = 16;
const LONGEST_PAUSE: usize = 512;
/// Pauses in a row, with no timed run of drafts that paid between them, after which a draft
/// model stops drafting for the sequence: resuming costs it a catch-up over every token the
/// pause let by (a prompt pass of its own, a fifth of a step a token for a model half the
/// target's cost), so a model that did not pay twice costs more by trying again than it can
/// be expected to win. Prompt lookup resumes for free and keeps trying.
const UNPAID_PAUSES: usize = 2;
/// A draft model's drafts go on past a token while the model gives it at least this
/// chance, where a draft model's pass costs a sizable share of a step
/// ([`Drafter::least_chances`]). (llama.cpp's drafts end at the first token under its
/// `--draft-p-min`, 0.75 by default in common/speculative.h.)
const LEAST_CHANCE: f32 = 0.75;
/// The share of a step a draft model's pass may cost (with the row it adds to the verify
/// pass) for its drafts to go on through tokens it is less sure of than [`LEAST_CHANCE`].
const CHEAP_PASS: f32 = 0.25;
/// Most tokens a draft model runs through the decoding kernels before drafting
/// ([`from_model`]); more go through the prompt path first ([`catch_up`]).
const CATCH_UP_ROWS: usize = 4;

/// A sequence's drafter and how well its drafts have done; drafting pauses itself while
/// it does not pay. Prompt lookup's draft length adapts to what is accepted and to what
/// the verify passes' rows cost (`fastest_length`). A draft model's drafts go on while
/// one more token is worth its cost ([`Self::least_chances`]); once timed, drafting
/// pauses where its steps make tokens slower than plain steps would, by more than catching
/// up after the pause costs.
#[derive(Debug, Clone)]
pub struct Drafter {
    pub kind: Draft,
    /// Most tokens drafted at once ([`MAX_DRAFT`] unless a request asks for fewer; 0 once
    /// the sequence stopped drafting).
    pub limit: usize,
    /// Tokens prompt lookup drafts next time it finds a match.
    length: usize,
    /// Mean tokens accepted per draft.
    accepted: f32,
    /// Drafts as runs of kept tokens ended by one rejected or by the draft's end, moving
    /// averages: the tokens kept, and whether one was rejected. Their ratio is the chance
    /// a drafted token is kept after its predecessor was ([`Self::kept_chance`]).
    kept_run: f32,
    broken: f32,
    /// Steps left before drafting again, and the next pause's length.
    paused: usize,
    next_pause: usize,
    /// Pauses since drafts last paid, timed ([`UNPAID_PAUSES`]).
    unpaid_pauses: usize,
    /// Seconds the draft model took for the draft being checked (0: none timed).
    draft_seconds: f32,
    /// A draft model's pass, in seconds (a moving average; 0 until timed).
    pass_seconds: f32,
    /// A draft model's steps, once timed: the plain steps' time their tokens stand for,
    /// and the time they took (drafting and verifying), moving averages.
    made: Option<Made>,
    /// Seconds a draft model takes to catch up on a token a pause let by (a moving
    /// average; 0 until timed): what resuming after a pause costs a paused step.
    catch_up_seconds: f32,
    /// How a step's time (its verify pass) grows with the rows in it.
    passes: PassTimes,
    /// Rows of other sequences in the last pass (a batch's).
    others: usize,
    /// Tokens drafted and accepted in all (for `/metrics` and the bench).
    pub drafted_total: usize,
    pub accepted_total: usize,
}

impl Drafter {
    /// A drafter of `kind`, with no history of drafts.
    pub fn new(kind: Draft) -> Self {
        Self {
            kind,
            limit: MAX_DRAFT,
            length: FIRST_DRAFT,
            accepted: 1.0,
            kept_run: FIRST_DRAFT as f32,
            broken: 1.0,
            paused: 0,
            next_pause: FIRST_PAUSE,
            unpaid_pauses: 0,
            draft_seconds: 0.0,
            pass_seconds: 0.0,
            made: None,
            catch_up_seconds: 0.0,
            passes: PassTimes::default(),
            others: 0,
            drafted_total: 0,
            accepted_total: 0,
        }
    }

    /// How many tokens to draft now, at most `limit`: none while paused. A draft model
    /// drafts as many as it is sure of, up to the limit.
    pub fn wanted(&mut self, limit: usize) -> usize {
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        match self.kind {
            Draft::Ngram => self.fastest_length(self.length.min(self.limit).min(limit)),
            Draft::Model => self.limit.min(limit),
        }
    }

    /// The draft length from 1 to `most` (0 stays 0) that makes tokens fastest once passes
    /// are timed: a draft of `k` makes `1 + c + c² + ... + c^k` tokens on average, where `c`
    /// is [`Self::kept_chance`], in a pass of `k` more rows, which costs what such passes
    /// took. A pass's time is not a straight line in its rows: where the products of more
    /// rows than the kernels take at once go over the weights twice, a row past that costs
    /// several rows' time, and a long draft that is mostly kept can still lose to a shorter
    /// one.
    fn fastest_length(&self, most: usize) -> usize {
        let chance = self.kept_chance();
        let (mut best, mut best_rate) = (most.min(1), 0.0);
        let (mut tokens, mut run) = (1.0, 1.0);
        for k in 1..=most {
            run *= chance;
            tokens += run;
            let Some(seconds) = self.passes.seconds(self.others + 1 + k) else {
                return most;
            };
            if tokens / seconds > best_rate {
                (best, best_rate) = (k, tokens / seconds);
            }
        }
        best
    }

    /// The chance that a drafted token is kept when the one before it was, from the
    /// recent drafts' runs of kept tokens.
    fn kept_chance(&self) -> f32 {
        self.kept_run / (self.kept_run + self.broken)
    }

    /// Up to `limit` tokens that may follow `history` by prompt lookup ([`ngram`]), as
    /// many as [`Self::wanted`] says.
    pub fn propose(&mut self, history: &[u32], limit: usize) -> Vec<u32> {
        match self.wanted(limit) {
            0 => Vec::new(),
            wanted => ngram(history, wanted),
        }
    }

    /// Learns that `accepted` of the `drafted` tokens just proposed were kept: prompt
    /// lookup's next draft is longer after a whole one was kept, as long as what was kept
    /// and one more otherwise; and drafting pauses while the mean kept is below
    /// [`PAYS_OFF`], or, once a draft model's steps are timed, while they make tokens
    /// slower than plain steps.
    pub fn learn(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.drafted_total += drafted;
        self.accepted_total += accepted;
        if self.kind == Draft::Ngram {
            self.length = match accepted == drafted {
                true => (drafted + 2).min(MAX_DRAFT),
                false => (accepted + 1).max(2),
            };
        }
        self.accepted += AVERAGE_WEIGHT * (accepted as f32 - self.accepted);
        self.kept_run += AVERAGE_WEIGHT * (accepted as f32 - self.kept_run);
        let broken = f32::from(u8::from(accepted < drafted));
        self.broken += AVERAGE_WEIGHT * (broken - self.broken);
        let rows = self.others + 1;
        let pass = |rows: usize| self.passes.seconds(rows);
        let pays = match (pass(rows), pass(rows + drafted), self.draft_seconds) {
            (Some(plain), Some(checked), draft_seconds) if draft_seconds > 0.0 => {
                // The step made `1 + accepted` tokens, which plain steps make in as many
                // one-row passes (beside the batch's other rows).
                // A draft of k tokens is k passes: the first runs what the model lacks,
                // each of the others the token before.
                average(&mut self.pass_seconds, draft_seconds / drafted as f32);
                let step = Made::step((1 + accepted) as f32 * plain, draft_seconds + checked);
                let made = self.made.map_or(step, |mean| mean.average(step));
                self.made = Some(made);
                // A paused draft model catches up afterwards on the tokens it let by: a
                // pause is worth it only if drafting loses more than that costs a step.
                let catch_up = self.catch_up_seconds / plain;
                let gains = made.plain * (1.0 + catch_up) > made.took;
                if gains && made.steps >= TIMED_STEPS {
                    self.unpaid_pauses = 0;
                }
                made.steps < TIMED_STEPS || gains
            }
            _ => self.accepted >= PAYS_OFF,
        };
        self.draft_seconds = 0.0;
        if !pays {
            self.unpaid_pauses += 1;
            if self.kind == Draft::Model && self.unpaid_pauses >= UNPAID_PAUSES {
                self.limit = 0;
            }
            self.paused = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
            // Tried afresh after the pause.
            self.accepted = 1.0;
            (self.kept_run, self.broken) = (FIRST_DRAFT as f32, 1.0);
            self.made = None;
            self.length = FIRST_DRAFT;
        }
    }

    /// How likely, as the draft model gives it, each drafted token must be for drafting
    /// one more after it (entry `j` for the one after the `j + 1`th; `wanted - 1` of them):
    /// [`LEAST_CHANCE`], less in proportion where one more (another pass, another row of the
    /// verify pass) costs under [`CHEAP_PASS`] of the step it may save, more where it costs
    /// more than that chance of a step, once [`TIMED_STEPS`] steps are timed. A model far
    /// cheaper than the one it drafts for goes on through unsure tokens; one that costs
    /// half a step stops at the first; none drafts a token whose row costs a step or more
    /// (a row past what the kernels take in one go over the weights can).
    pub fn least_chances(&self, wanted: usize) -> Vec<f32> {
        let timed = self.made.is_some_and(|made| made.steps >= TIMED_STEPS);
        let rows = self.others + 1;
        let seconds = |rows: usize| self.passes.seconds(rows);
        let step = seconds(rows).filter(|_| timed);
        (1..wanted)
            .map(|j| match (step, seconds(rows + j), seconds(rows + j + 1)) {
                (Some(step), Some(without), Some(with)) => {
                    let share = (self.pass_seconds + (with - without).max(0.0)) / step;
                    (LEAST_CHANCE * (share / CHEAP_PASS).min(1.0)).max(share)
                }
                _ => LEAST_CHANCE,
            })
            .collect()
    }

    /// Learns that the draft model took `seconds` to draft the tokens about to be checked
    /// (prompt lookup costs next to nothing and is not timed).
    pub fn drafting_took(&mut self, seconds: f32) {
        self.draft_seconds = seconds;
    }

    /// Learns that the draft model took `seconds` to catch up on `tokens` tokens (the
    /// prompt's, or those a pause let by).
    pub fn catching_up_took(&mut self, tokens: usize, seconds: f32) {
        if tokens > 0 {
            average(&mut self.catch_up_seconds, seconds / tokens as f32);
        }
    }

    /// Learns that a step of the sequence, its verify pass of `own` rows in a pass of
    /// `rows` in all (a batch's), took `seconds`.
    pub fn step_took(&mut self, rows: usize, own: usize, seconds: f32) {
        self.passes.add(rows, seconds);
        self.others = rows.saturating_sub(own);
    }
}

/// Folds `sample` into the moving average `mean` (0: none yet).
fn average(mean: &mut f32, sample: f32) {
    average_by(mean, sample, AVERAGE_WEIGHT);
}

/// [`average`] with the newest sample weighing `weight`.
fn average_by(mean: &mut f32, sample: f32, weight: f32) {
    *mean = match *mean {
        0.0 => sample,
        mean => mean + weight * (sample - mean),
    };
}

/// A draft model's steps: the time plain steps would have taken for the tokens they
/// made, and the time they took; of `steps` steps.
#[derive(Debug, Clone, Copy)]
struct Made {
    plain: f32,
    took: f32,
    steps: usize,
}

impl Made {
    /// One step's.
    fn step(plain: f32, took: f32) -> Made {
        Made {
            plain,
            took,
            steps: 1,
        }
    }

    /// The moving averages with `step` folded in.
    fn average(self, step: Made) -> Made {
        Made {
            plain: self.plain + AVERAGE_WEIGHT * (step.plain - self.plain),
            took: self.took + AVERAGE_WEIGHT * (step.took - self.took),
            steps: self.steps + 1,
        }
    }
}

/// Weight of the newest pass in [`PassTimes`]' averages: a line through passes of varied
/// lengths needs more of them than a mean.
const PASS_WEIGHT: f32 = 0.1;

/// Rows up to which [`PassTimes`] keeps each row count's passes apart.
const TIMED_ROWS: usize = 32;

/// A pass's time against its rows: a verify pass of more rows costs more, by an amount
/// that depends on the host, the model and the weights' format, so it is measured, not
/// assumed. Each row count's passes are averaged apart, since the cost is not a line (the
/// kernels take a few rows per read of the weights, and a row past that costs several);
/// a row count not yet seen is read off a straight line through the recent passes (least
/// squares over moving averages).
#[derive(Debug, Clone, Copy, Default)]
struct PassTimes {
    /// Moving averages of rows, seconds, rows squared and rows times seconds; `seen`
    /// passes so far.
    rows: f32,
    seconds: f32,
    rows_squared: f32,
    rows_seconds: f32,
    seen: usize,
    /// Moving averages of the passes of each number of rows (0: none seen).
    by_rows: [f32; TIMED_ROWS],
}

/// A pass's time as `base + per_row * rows`.
#[derive(Debug, Clone, Copy)]
struct PassLine {
    base: f32,
    per_row: f32,
}

impl PassLine {
    fn seconds(&self, rows: usize) -> f32 {
        self.base + self.per_row * rows as f32
    }
}

impl PassTimes {
    fn add(&mut self, rows: usize, seconds: f32) {
        let r = rows as f32;
        let weight = if self.seen == 0 { 1.0 } else { PASS_WEIGHT };
        for (mean, sample) in [
            (&mut self.rows, r),
            (&mut self.seconds, seconds),
            (&mut self.rows_squared, r * r),
            (&mut self.rows_seconds, r * seconds),
        ] {
            *mean += weight * (sample - *mean);
        }
        self.seen += 1;
        if let Some(mean) = self.by_rows.get_mut(rows) {
            average_by(mean, seconds, PASS_WEIGHT);
        }
    }

    /// What a pass of `rows` rows takes: as such passes took, or as the line says (none
    /// before any pass was timed).
    fn seconds(&self, rows: usize) -> Option<f32> {
        match self.by_rows.get(rows) {
            Some(&seconds) if seconds > 0.0 => Some(seconds),
            _ => self.fit().map(|line| line.seconds(rows)),
        }
    }

    /// The line, once passes were timed. While they all had the same rows, a row adds
    /// nothing (a longer draft is then tried, and timed); a fit that says more rows cost
    /// less is taken as flat.
    fn fit(&self) -> Option<PassLine> {
        if self.seen == 0 {
            return None;
        }
        let spread = self.rows_squared - self.rows * self.rows;
        let per_row = match spread > 1e-3 {
            true => ((self.rows_seconds - self.rows * self.seconds) / spread).max(0.0),
            false => 0.0,
        };
        let base = (self.seconds - per_row * self.rows).max(f32::MIN_POSITIVE);
        Some(PassLine { base, per_row })
    }
}

/// Up to `wanted` tokens that may follow `history`: what followed the latest earlier
/// occurrence of its last [`MAX_NGRAM`] tokens (or fewer, down to [`MIN_NGRAM`]). Empty
/// without a match.
pub fn ngram(history: &[u32], wanted: usize) -> Vec<u32> {
    (MIN_NGRAM..=MAX_NGRAM)
        .rev()
        .find_map(|n| continuation(history, n, wanted))
        .map_or_else(Vec::new, <[u32]>::to_vec)
}

/// Runs `model` over the tokens of `history` that its cache `cache` lacks, if they are more
/// than one pass of the decoding kernels takes ([`CATCH_UP_ROWS`], at most the backend's
/// batch), all but the last, as a prompt: what a draft model does after the prompt (with
/// the model's prefill), and after a pause let tokens by. The last is left for
/// [`from_model`].
pub fn catch_up<B: KernelBackend>(
    model: &Generator<B>,
    cache: &mut KvCache<B>,
    history: &[u32],
) -> Result<(), GenerateError> {
    let (done, end) = (cache.len(), history.len().saturating_sub(1));
    if history.len().saturating_sub(done) > B::DECODE_BATCH.min(CATCH_UP_ROWS) {
        model.forward_logits_wanted(&history[done..end], cache, WantedLogits::None)?;
    }
    Ok(())
}

/// Up to `wanted` tokens drafted by `model`, greedily, after `history`, its KV cache
/// `cache` holding the model's run of `history`'s first tokens (at least one is not yet in
/// it): at least one, then more while the model gives the last at least the chance
/// `least_chances` asks after as many (its entry `j` after the `j + 1`th; past its end,
/// none). All but the last are then in the cache.
///
/// The tokens it lacks go through the decoding kernels in one pass, as a verify pass does:
/// between two drafts, one or two (the pick after what was kept, and the last drafted token
/// if all were kept), since the prompt path's set-up costs several steps of a small model;
/// more only a few, once [`catch_up`] has run the rest.
pub fn from_model<B: KernelBackend>(
    model: &Generator<B>,
    cache: &mut KvCache<B>,
    history: &[u32],
    wanted: usize,
    least_chances: &[f32],
) -> Result<Vec<u32>, GenerateError> {
    let behind = &history[cache.len()..];
    let mut logits = model.decode_rows(behind, &mut [&mut *cache], &[behind.len()])?;
    // The last row's: what follows the history.
    logits.drain(..logits.len() - model.config.vocab_size);
    let mut drafted = Vec::with_capacity(wanted);
    loop {
        let token = argmax(&logits);
        drafted.push(token);
        let least_chance = least_chances.get(drafted.len() - 1);
        match least_chance {
            Some(&least) if drafted.len() < wanted && top_chance(&mut logits) >= least => {}
            _ => return Ok(drafted),
        }
        logits = model.forward_logits(&[token], cache, false)?;
    }
}

/// The chance `logits` give their largest: 1 / the sum of e^(logit - largest), the
/// softmax's vectorized sum, which leaves `logits` as its numerators.
fn top_chance(logits: &mut [f32]) -> f32 {
    let mut stats = [0.0; 2];
    simd::softmax_numerators(logits, &mut stats);
    1.0 / stats[1].max(1.0)
}

/// The up to `wanted` tokens after the latest earlier occurrence of `history`'s last `n`.
fn continuation(history: &[u32], n: usize, wanted: usize) -> Option<&[u32]> {
    let len = history.len();
    if len <= n {
        return None;
    }
    let tail = &history[len - n..];
    // Starts of earlier occurrences, latest first; the tail itself is not one.
    (0..len - n)
        .rev()
        .find(|&start| &history[start..start + n] == tail)
        .map(|start| &history[start + n..(start + n + wanted).min(len)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_latest_earlier_occurrence_of_the_longest_tail() {
        let mut drafter = Drafter::new(Draft::Ngram);
        // "1 2 3 4 5 ... 1 2 3" → 4 5 6 7 (the draft's first length).
        let history = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3];
        assert_eq!(drafter.propose(&history, 10), [4, 5, 6, 7]);
        assert_eq!(drafter.propose(&history, 2), [4, 5]);
        // The latest occurrence wins, and a continuation stops at the end of the text.
        let history = [7, 8, 1, 7, 8, 2, 3, 7, 8];
        assert_eq!(drafter.propose(&history, 10), [2, 3, 7, 8]);
        // A three-token match is preferred to a later two-token one.
        let history = [5, 6, 7, 1, 9, 6, 7, 2, 5, 6, 7];
        assert_eq!(drafter.propose(&history, 1), [1]);
        // No match of two tokens: nothing.
        assert!(drafter.propose(&[1, 2, 3, 4, 3], 10).is_empty());
        assert!(drafter.propose(&[], 10).is_empty());
    }

    #[test]
    fn the_top_chance_is_the_softmax_of_the_largest_logit() {
        // e^2 / (e^2 + 2) = 0.787.
        assert!((top_chance(&mut [0.0, 2.0, 0.0]) - 0.7870).abs() < 1e-4);
        // A long tail far below counts for nothing; a long one near enough, for much:
        // 1 / (1 + 49151 e^-5) = 0.0030.
        let mut far = vec![-30.0; 49_152];
        far[7] = 0.0;
        assert!(top_chance(&mut far) > 0.9999);
        let mut near = vec![-5.0; 49_152];
        near[7] = 0.0;
        assert!((top_chance(&mut near) - 0.00301).abs() < 1e-5);
    }

    #[test]
    fn a_cheap_draft_model_drafts_through_unsure_tokens_a_dear_one_does_not() {
        // Steps of 10 ms whatever their rows.
        let least_chance = |pass: f32| {
            let mut drafter = Drafter::new(Draft::Model);
            for _ in 0..TIMED_STEPS {
                assert_eq!(drafter.least_chances(2), [LEAST_CHANCE]);
                drafter.drafting_took(2.0 * pass);
                drafter.step_took(3, 3, 0.010);
                drafter.learn(2, 2);
            }
            drafter.least_chances(2)[0]
        };
        // A pass of 0.25 ms, a fortieth of a step: a tenth of the chance.
        assert!((least_chance(0.00025) - LEAST_CHANCE / 10.0).abs() < 1e-6);
        // Of 4 ms: all of it.
        assert_eq!(least_chance(0.004), LEAST_CHANCE);
        // Of 9 ms: more than that, its share of the step.
        assert!((least_chance(0.009) - 0.9).abs() < 1e-6);
    }

    /// A drafter whose passes of `rows` rows took `pass(rows)` seconds, each row count
    /// from 1 to 13 timed a few times, and whose drafts were all kept (`drafts` of them,
    /// a draft model's taking `draft_pass` seconds a token).
    fn timed(kind: Draft, pass: impl Fn(usize) -> f32, drafts: usize, draft_pass: f32) -> Drafter {
        let mut drafter = Drafter::new(kind);
        for _ in 0..3 {
            for rows in 1..=13 {
                drafter.step_took(rows, rows, pass(rows));
            }
        }
        for _ in 0..drafts {
            if kind == Draft::Model {
                drafter.drafting_took(2.0 * draft_pass);
            }
            drafter.step_took(3, 3, pass(3));
            drafter.learn(2, 2);
        }
        drafter
    }

    /// 10 ms and 1 ms a row up to seven rows; each row past seven 6 ms more, as where the
    /// kernels go over the weights again for more than seven.
    fn jump_past_seven(rows: usize) -> f32 {
        0.010 + 0.001 * rows as f32 + 0.006 * rows.saturating_sub(7) as f32
    }

    #[test]
    fn pass_times_keep_each_row_count_apart() {
        let drafter = timed(Draft::Ngram, jump_past_seven, 0, 0.0);
        for rows in [1, 7, 8, 13] {
            let seconds = drafter.passes.seconds(rows).expect("timed");
            assert!(
                (seconds - jump_past_seven(rows)).abs() < 1e-6,
                "{rows}: {seconds}"
            );
        }
        // A row count never timed: off the line through the others.
        let line = drafter.passes.fit().expect("timed");
        assert_eq!(drafter.passes.seconds(20), Some(line.seconds(20)));
        assert!(line.per_row > 0.001);
    }

    #[test]
    fn prompt_lookup_drafts_as_far_as_rows_pay() {
        // Every draft kept: a chance near 1 that the next is too.
        let line = |rows: usize| 0.010 + 0.001 * rows as f32;
        let cheap = timed(Draft::Ngram, line, 8, 0.0);
        assert!(cheap.kept_chance() > 0.9, "{}", cheap.kept_chance());
        assert_eq!(cheap.fastest_length(MAX_DRAFT), MAX_DRAFT);
        // Rows past seven cost 7 ms each: seven rows, a draft of six, make more tokens a
        // second than thirteen.
        let jump = timed(Draft::Ngram, jump_past_seven, 8, 0.0);
        assert_eq!(jump.fastest_length(MAX_DRAFT), 6);
        assert_eq!(jump.fastest_length(4), 4);
        assert_eq!(jump.fastest_length(0), 0);
        // Untimed: as long as asked.
        assert_eq!(Drafter::new(Draft::Ngram).fastest_length(9), 9);
    }

    #[test]
    fn a_draft_model_drafts_no_token_whose_row_costs_a_step() {
        // Steps of 11 ms (one row). A 1 ms draft pass with a 1 ms row is 0.18 of a step:
        // drafts go on through tokens at 0.55; a row past seven, 7 ms, brings it to 0.73,
        // and then the chance asked is LEAST_CHANCE.
        let cheap = timed(Draft::Model, jump_past_seven, TIMED_STEPS, 0.001);
        let chances = cheap.least_chances(MAX_DRAFT);
        assert_eq!(chances.len(), MAX_DRAFT - 1);
        assert!(
            chances[..5]
                .iter()
                .all(|&c| (c - 0.75 * 0.002 / 0.011 / CHEAP_PASS).abs() < 1e-4)
        );
        assert!(
            chances[5..].iter().all(|&c| c == LEAST_CHANCE),
            "{chances:?}"
        );
        // A 5 ms draft pass: LEAST_CHANCE up to seven rows; past them a row and a draft
        // cost more than the step they may save, and no chance is enough.
        let dear = timed(Draft::Model, jump_past_seven, TIMED_STEPS, 0.005);
        let chances = dear.least_chances(MAX_DRAFT);
        assert!(
            chances[..5].iter().all(|&c| c == LEAST_CHANCE),
            "{chances:?}"
        );
        assert!(chances[5..].iter().all(|&c| c > 1.0), "{chances:?}");
    }

    /// A draft model drafting one token a step, `seconds` a draft, whose drafts are kept
    /// as `kept` says, beside 10 ms passes whatever their rows: the step at which it
    /// pauses, if it does in 20.
    fn pauses_after(catch_up: f32, seconds: f32, kept: impl Fn(usize) -> bool) -> Option<usize> {
        let mut drafter = Drafter::new(Draft::Model);
        drafter.catching_up_took(10, 10.0 * catch_up);
        (0..20).find(|&step| {
            assert_eq!(drafter.wanted(99), MAX_DRAFT, "as many as it is sure of");
            drafter.drafting_took(seconds);
            drafter.step_took(2, 2, 0.010);
            drafter.learn(1, usize::from(kept(step)));
            drafter.paused > 0
        })
    }

    #[test]
    fn a_draft_model_pauses_when_its_steps_lose_more_than_catching_up_would() {
        // Kept: two tokens in 14 ms instead of 20. It never pauses.
        assert_eq!(pauses_after(0.0, 0.004, |_| true), None);
        // Never kept: one token in 14 ms instead of 10, but not on one step's say.
        assert_eq!(pauses_after(0.0, 0.004, |_| false), Some(TIMED_STEPS - 1));
        // A pause that lets catching up cost half a step a token is worth it only where
        // drafting loses more than a third: 10 ms in 18 does, 10 in 13 does not.
        assert_eq!(pauses_after(0.005, 0.008, |_| false), Some(TIMED_STEPS - 1));
        assert_eq!(pauses_after(0.005, 0.003, |_| false), None);
        // Drafts kept every other step make 1.5 tokens in 13 ms (15 plain): no pause.
        assert_eq!(pauses_after(0.0, 0.003, |step| step % 2 == 0), None);
    }

    #[test]
    fn a_draft_model_that_pays_in_no_run_between_two_pauses_stops_for_good() {
        for kind in [Draft::Model, Draft::Ngram] {
            let mut drafter = Drafter::new(kind);
            // Never kept, one token in 14 ms instead of 10: a pause, twice.
            let mut pauses = 0;
            for _ in 0..2 * (TIMED_STEPS + LONGEST_PAUSE) {
                if drafter.wanted(99) == 0 {
                    continue;
                }
                drafter.drafting_took(0.004);
                drafter.step_took(2, 2, 0.010);
                drafter.learn(1, 0);
                pauses += usize::from(drafter.paused > 0);
            }
            match kind {
                Draft::Model => assert_eq!((pauses, drafter.limit), (UNPAID_PAUSES, 0)),
                _ => assert!(pauses > UNPAID_PAUSES && drafter.limit == MAX_DRAFT),
            }
        }
        // A run that paid between two pauses: drafting goes on (a pause after the first
        // four, the drafts of the next six kept, a pause after four more not kept).
        let mut drafter = Drafter::new(Draft::Model);
        for kept in [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0] {
            while drafter.wanted(99) == 0 {}
            drafter.drafting_took(0.004);
            drafter.step_took(2, 2, 0.010);
            drafter.learn(1, kept);
        }
        assert_eq!((drafter.unpaid_pauses, drafter.limit), (1, MAX_DRAFT));
    }

    #[test]
    fn pass_times_fit_a_line_through_passes_of_varied_rows() {
        let mut passes = PassTimes::default();
        assert!(passes.fit().is_none());
        // Passes of one row only: a row is taken to add nothing.
        for _ in 0..5 {
            passes.add(1, 0.010);
        }
        let line = passes.fit().expect("timed");
        assert_eq!(line.per_row, 0.0);
        assert!((line.seconds(1) - 0.010).abs() < 1e-6);
        // 9 ms and 1 ms a row: one-row and five-row passes in turn.
        for _ in 0..100 {
            passes.add(1, 0.010);
            passes.add(5, 0.014);
        }
        let line = passes.fit().expect("timed");
        assert!((line.per_row - 0.001).abs() < 1e-5, "{line:?}");
        assert!((line.base - 0.009).abs() < 1e-4, "{line:?}");
        // Longer passes that took less time (noise) give no discount for rows: flat.
        for _ in 0..100 {
            passes.add(1, 0.020);
            passes.add(5, 0.010);
        }
        assert_eq!(passes.fit().expect("timed").per_row, 0.0);
    }

    #[test]
    fn the_length_adapts_and_drafting_pauses_while_it_does_not_pay() {
        let history: Vec<u32> = (0..40).chain(0..3).collect();
        let mut drafter = Drafter::new(Draft::Ngram);
        assert_eq!(drafter.propose(&history, 99).len(), FIRST_DRAFT);
        drafter.learn(4, 4);
        assert_eq!(drafter.propose(&history, 99).len(), 6);
        drafter.learn(6, 2);
        assert_eq!(drafter.propose(&history, 99).len(), 3);
        // Rejected again and again: the mean falls below what pays, and drafting stops
        // for FIRST_PAUSE steps.
        let mut rejected = 0;
        while drafter.paused == 0 {
            drafter.learn(2, 0);
            rejected += 1;
        }
        assert!(rejected <= 6, "{rejected}");
        for _ in 0..FIRST_PAUSE {
            assert!(drafter.propose(&history, 99).is_empty());
        }
        assert_eq!(drafter.propose(&history, 99).len(), FIRST_DRAFT);
        assert_eq!(drafter.next_pause, 2 * FIRST_PAUSE);
        assert_eq!(
            (drafter.drafted_total, drafter.accepted_total),
            (10 + 2 * rejected, 6)
        );
    }
}
