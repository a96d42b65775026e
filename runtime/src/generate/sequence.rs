//! One sequence under way: its cache, sampler, constraint and text so far.

use std::time::{Duration, Instant};

use super::draft::{Draft, Drafter, catch_up, from_model, ngram};
use super::stop::StopText;
use super::{GenerateError, Generation, Generator, StopReason, Timings};
use crate::generate::sampling::{Sampler, TokenLogprob};
use crate::model::backend::KernelBackend;
use crate::model::cache::KvCache;
use crate::text::grammar::Constraint;
use crate::text::tokenizer::TextStream;

/// A generation under way ([`Generator::start`](super::Generator::start)): its KV cache,
/// sampler and text so far.
pub struct Sequence<'t, B: KernelBackend> {
    pub(super) cache: KvCache<B>,
    /// Positions this generation may fill (the cache may hold more).
    pub(super) capacity: usize,
    /// Prompt tokens found in a reused cache, not run again.
    pub(super) reused: usize,
    /// The grammar the text must follow
    /// ([`GenerateOptions::grammar`](super::GenerateOptions::grammar)).
    pub(super) constraint: Option<Constraint>,
    pub(super) sampler: Sampler,
    /// Prompt and generated ids (the repeat penalty's window).
    pub(super) history: Vec<u32>,
    pub(super) prompt_tokens: usize,
    pub(super) tokens: Vec<u32>,
    pub(super) stream: TextStream<'t>,
    pub(super) text: StopText,
    pub(super) max_new_tokens: usize,
    /// The next token's logits.
    pub(super) logits: Vec<f32>,
    /// The next token, already picked (by a draft's check, where the model's pick was not
    /// the drafted token): the next step takes it instead of picking again, so that the
    /// sampler draws exactly as often as without drafts.
    pub(super) pending: Option<Picked>,
    /// What guesses its next tokens, if anything ([`super::draft`]).
    pub(super) drafter: Option<Drafter>,
    /// The draft model's KV cache for this sequence ([`Draft::Model`]), made when first
    /// needed.
    pub(super) draft_cache: Option<KvCache<B>>,
    /// Whether to record each generated token's log-probability, with how many of the most
    /// likely alternatives ([`Sequence::record_logprobs`]).
    pub(super) logprobs_top: Option<usize>,
    pub(super) logprobs: Vec<TokenLogprob>,
    pub(super) stop_reason: Option<StopReason>,
    pub(super) started: Instant,
    pub(super) prefill: Duration,
    pub(super) decode_started: Instant,
    pub(super) decode: Duration,
}

impl<B: KernelBackend> Sequence<'_, B> {
    /// Whether the next step picks a token for this sequence: not if it has ended or has
    /// its `max_new_tokens`; an error if its prompt is not all in its cache yet.
    pub(super) fn ready(&self) -> Result<bool, GenerateError> {
        if self.stop_reason.is_some() {
            return Ok(false);
        }
        if self.cache.len() < self.prompt_tokens {
            return Err(GenerateError::NotPrefilled);
        }
        Ok(self.tokens.len() < self.max_new_tokens)
    }

    /// Drafts tokens for this sequence from now on, with `draft` (speculative decoding:
    /// the same tokens, [`super::draft`]).
    pub fn start_drafting(&mut self, draft: Draft) {
        self.drafter = Some(Drafter::new(draft));
    }

    /// Drafts no more tokens for this sequence (a request that opts out of speculation, a
    /// draft model that failed). What it drafted so far still counts in [`Self::drafted`].
    pub fn stop_drafting(&mut self) {
        if let Some(drafter) = &mut self.drafter {
            drafter.limit = 0;
        }
        self.draft_cache = None;
    }

    /// Drafts at most `limit` tokens at once for this sequence (0: none), if it drafts.
    pub fn limit_drafts(&mut self, limit: usize) {
        match limit {
            0 => self.stop_drafting(),
            limit => (self.drafter.iter_mut()).for_each(|drafter| drafter.limit = limit),
        }
    }

    /// Tokens drafted for this sequence, and how many of them were kept.
    pub fn drafted(&self) -> (usize, usize) {
        (self.drafter.as_ref()).map_or((0, 0), |d| (d.drafted_total, d.accepted_total))
    }

    /// The tokens to check after `next` (just picked, not yet run): the drafter's guess, as
    /// long as the sequence has room for (its `max_new_tokens`, and its cache with a
    /// position to spare, so that no check stops it where a plain step would not). A
    /// [`Draft::Model`] drafter asks `model` (none: no draft).
    pub(super) fn draft(
        &mut self,
        model: Option<&Generator<B>>,
    ) -> Result<Vec<u32>, GenerateError> {
        let Some(drafter) = &mut self.drafter else {
            return Ok(Vec::new());
        };
        let tokens_left = self.max_new_tokens.saturating_sub(self.tokens.len());
        let room = self.capacity.saturating_sub(self.cache.len() + 2);
        let wanted = drafter.wanted(tokens_left.min(room));
        match (drafter.kind, model) {
            (_, _) if wanted == 0 => Ok(Vec::new()),
            (Draft::Ngram, _) => Ok(ngram(&self.history, wanted)),
            (Draft::Model, None) => Ok(Vec::new()),
            (Draft::Model, Some(model)) => {
                let cache = draft_cache(&mut self.draft_cache, model, self.capacity)?;
                // What a pause let by is a cost of resuming, paid once, not the draft's:
                // it weighs on whether to pause.
                let (started, before) = (Instant::now(), cache.len());
                catch_up(model, cache, &self.history)?;
                let caught_up = cache.len() - before;
                drafter.catching_up_took(caught_up, started.elapsed().as_secs_f32());
                let started = Instant::now();
                let least_chances = drafter.least_chances(wanted);
                let drafted = from_model(model, cache, &self.history, wanted, &least_chances)?;
                drafter.drafting_took(started.elapsed().as_secs_f32());
                Ok(drafted)
            }
        }
    }

    /// Runs the prompt through the draft model, if the sequence drafts with one, as its
    /// own prompt is run: its time is the prompt's, not decoding's. A draft model that
    /// fails leaves the sequence to decode plainly.
    pub(super) fn prefill_draft(&mut self, model: Option<&Generator<B>>) {
        let (Some(drafter), Some(model)) = (&mut self.drafter, model) else {
            return;
        };
        if drafter.kind != Draft::Model || drafter.limit == 0 {
            return;
        }
        let started = Instant::now();
        let prefilled = draft_cache(&mut self.draft_cache, model, self.capacity)
            .and_then(|cache| catch_up(model, cache, &self.history).map(|()| cache.len()));
        match prefilled {
            Ok(tokens) => drafter.catching_up_took(tokens, started.elapsed().as_secs_f32()),
            Err(_) => self.stop_drafting(),
        }
    }

    /// After a check of `drafted` tokens drafted after the first `fed` of the history, of
    /// which `kept` were kept: the draft model's cache forgets what it ran past them.
    pub(super) fn drafts_checked(&mut self, fed: usize, drafted: usize, kept: usize) {
        if let Some(cache) = &mut self.draft_cache {
            // It ran the history and every drafted token but the last.
            cache.truncate(fed + kept.min(drafted.saturating_sub(1)));
        }
        if let Some(drafter) = &mut self.drafter {
            drafter.learn(drafted, kept);
            if drafter.limit == 0 {
                // It stopped itself (it did not pay): its draft model's cache goes too.
                self.stop_drafting();
            }
        }
    }

    /// The state its pick reads and changes, apart from the rest.
    pub(super) fn picker(&mut self) -> Picker<'_> {
        Picker {
            sampler: &mut self.sampler,
            logits: &mut self.logits,
            history: &self.history,
            constraint: self.constraint.as_mut(),
            keep_raw: self.logprobs_top.is_some(),
        }
    }

    /// Makes the text follow `constraint` (compiled by the caller, say off a server's
    /// engine thread, from the same [`Grammars`](crate::text::grammar::Grammars) as
    /// [`GenerateOptions::grammar`](super::GenerateOptions::grammar) would be):
    /// only before the first token, else [`GenerateError::Started`].
    pub fn constrain(&mut self, constraint: Constraint) -> Result<(), GenerateError> {
        if !self.tokens.is_empty() || self.stop_reason.is_some() {
            return Err(GenerateError::Started);
        }
        self.constraint = Some(constraint);
        Ok(())
    }

    /// Records, from the next token on, each generated token's log-probability and the
    /// `top` most likely tokens' at its step ([`Self::take_logprobs`]).
    pub fn record_logprobs(&mut self, top: usize) {
        self.logprobs_top = Some(top);
    }

    /// The log-probabilities recorded since the last call, one per generated token.
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.logprobs)
    }

    /// Generated token ids so far (an ending EOS is not included).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Prompt tokens not run yet ([`Generator::prefill`](super::Generator::prefill) runs
    /// them).
    pub fn prompt_left(&self) -> usize {
        self.prompt_tokens.saturating_sub(self.cache.len())
    }

    /// Prompt tokens in the cache: run, or reused from a kept cache.
    pub fn prefilled(&self) -> usize {
        self.cache.len().min(self.prompt_tokens)
    }

    /// Prompt tokens taken from a reused cache instead of run
    /// ([`Generator::start_from`](super::Generator::start_from)).
    pub fn reused_tokens(&self) -> usize {
        self.reused
    }

    /// The result, passing whatever text was still held back (a possible start of a stop
    /// string, at the end) to `on_text`. A sequence not ended yet ends here, as at length.
    pub fn finish(self, on_text: &mut impl FnMut(&str)) -> Generation {
        self.finish_keeping_cache(on_text).0
    }

    /// [`Self::finish`], also giving back the cache and the ids whose keys and values it
    /// holds, for [`Generator::start_from`](super::Generator::start_from).
    pub fn finish_keeping_cache(
        mut self,
        on_text: &mut impl FnMut(&str),
    ) -> (Generation, (KvCache<B>, Vec<u32>)) {
        if self.stop_reason.is_none() {
            self.decode = self.decode_started.elapsed();
        }
        self.text.finish(on_text);
        let per_s = |n: usize, t: Duration| {
            if t.is_zero() {
                0.0
            } else {
                n as f64 / t.as_secs_f64()
            }
        };
        let mut ids = self.history;
        ids.truncate(self.cache.len());
        let generation = Generation {
            stop_string: self.text.matched().map(str::to_string),
            text: self.text.into_text(),
            prompt_tokens: self.prompt_tokens,
            stop_reason: self.stop_reason.unwrap_or(StopReason::Length),
            timings: Timings {
                prefill_s: self.prefill.as_secs_f64(),
                decode_s: self.decode.as_secs_f64(),
                prefill_tokens_per_s: per_s(self.prompt_tokens - self.reused, self.prefill),
                decode_tokens_per_s: per_s(self.tokens.len().saturating_sub(1), self.decode),
            },
            tokens: self.tokens,
        };
        (generation, (self.cache, ids))
    }
}

/// One sequence's pick, on its own state only, so that a step's sequences pick in parallel.
pub(super) struct Picker<'a> {
    sampler: &'a mut Sampler,
    logits: &'a mut Vec<f32>,
    history: &'a [u32],
    constraint: Option<&'a mut Constraint>,
    /// Whether to keep the logits as the model gave them (for log-probabilities).
    keep_raw: bool,
}

/// A picked token, and the model's logits it was picked from when they are wanted.
pub(super) struct Picked {
    pub(super) next: u32,
    pub(super) raw: Option<Vec<f32>>,
}

impl Picker<'_> {
    /// Biases, penalties, the grammar's mask, then the draw ([`Sampler::sample_masked`]).
    pub(super) fn pick(&mut self) -> Result<Picked, GenerateError> {
        super::check_finite(self.logits, self.history.len())?;
        // The sampler changes the logits in place; log-probabilities are the model's.
        let raw = self.keep_raw.then(|| self.logits.clone());
        let mut masked = Ok(());
        let next = match &mut self.constraint {
            None => self.sampler.sample(self.logits, self.history),
            Some(constraint) => (self.sampler)
                .sample_masked(self.logits, self.history, |l| masked = constraint.mask(l)),
        };
        masked?;
        Ok(Picked { next, raw })
    }
}

/// A sequence's KV cache for the draft model, made for `capacity` positions when first
/// needed.
fn draft_cache<'c, B: KernelBackend>(
    cache: &'c mut Option<KvCache<B>>,
    model: &Generator<B>,
    capacity: usize,
) -> Result<&'c mut KvCache<B>, GenerateError> {
    Ok(match cache {
        Some(cache) => cache,
        None => cache.insert(model.new_cache(capacity)?),
    })
}
