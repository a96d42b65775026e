//! The engine: one thread that owns the model and runs up to `parallel` sequences, a token
//! of each per step, decoded together (`Generator::step_each`: one pass over the weights
//! for all of them, each sequence's tokens what it would get alone), so every running
//! request keeps streaming. New requests join between steps; a long prompt is prefilled
//! a piece at a time between the others' steps (`Generator::admit`, `Generator::prefill`). Requests beyond that
//! wait in the queue (the channel) in arrival order; a request whose client has gone (its
//! event receiver dropped) is dropped before its next token.
//!
//! Each finished sequence's KV cache is kept (up to `parallel` of them) with the ids it
//! holds; a new request starts from the kept cache sharing the longest prefix with its
//! prompt (the next turn of a conversation), so only what is new is prefilled.
//!
//! The model runs on this thread inside the rayon pool, as the command line runs it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use runtime::backend::KernelBackend;
use runtime::cache::KvCache;
use runtime::generate::{GenerateOptions, Generator, Sequence, StopReason, common_prefix};
use runtime::sampling::TokenLogprob;
use runtime::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

/// Prompt tokens prefilled between two decoding steps while other sequences are running:
/// a long prompt joins in pieces, and the running streams pause for one piece at a time
/// rather than for all of it (docs/BENCHMARKS.md has what a piece costs).
const PREFILL_PIECE: usize = 128;

/// A request for the engine: the prompt's ids and how to continue it, and where its events
/// go.
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Each generated token's log-probability, with this many alternatives.
    pub logprobs: Option<usize>,
    /// Who may share a kept cache with this request: requests reuse each other's caches
    /// only within one scope (the API key presented and the `cache_salt` field), so that
    /// `cached_tokens` cannot tell one client what another's prompt was.
    pub scope: String,
    pub events: UnboundedSender<Event>,
}

/// What the engine tells a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Generated text, complete characters, never part of a stop string.
    Text(String),
    /// The log-probabilities of tokens just generated, sent before any text of the same
    /// step. A token's text may come later (a character split over tokens is sent once
    /// whole, a possible start of a stop string once it is known not to be one) or never (a
    /// stop string's own tokens): the HTTP side pairs each token with the text that
    /// completes its `bytes`.
    Logprobs(Vec<Logprob>),
    Done {
        reason: StopReason,
        prompt_tokens: usize,
        /// Prompt tokens found in a kept cache and not run again.
        cached_tokens: usize,
        completion_tokens: usize,
    },
    Failed(String),
}

/// A generated token's log-probability and the most likely tokens' at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    /// Its text (a token that holds part of a character shows U+FFFD).
    pub token: String,
    /// The bytes of text it stands for, exact also for part of a character: the bytes of a
    /// generation's tokens, one after another, are its text's.
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The most likely tokens at its step, most likely first (each with no `top` of its
    /// own).
    pub top: Vec<Logprob>,
}

/// Counters for `/metrics`, shared with the HTTP side.
#[derive(Debug, Default)]
pub struct Metrics {
    pub ready: AtomicBool,
    pub queued: AtomicUsize,
    pub running: AtomicUsize,
    pub requests: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Nanoseconds spent running sequences (prefill and decode), for tok/s.
    pub busy_ns: AtomicU64,
}

/// The model and tokenizer, once loaded; `parallel` sequences at most.
pub struct Engine<B: KernelBackend> {
    pub generator: Generator<B>,
    pub tokenizer: Arc<Tokenizer>,
    pub parallel: usize,
}

impl<B: KernelBackend> Engine<B> {
    /// Serves `jobs` until the channel closes and every running sequence has ended.
    pub fn run(&self, jobs: mpsc::Receiver<Job>, metrics: &Metrics) {
        let mut running: Vec<(Sequence<'_, B>, UnboundedSender<Event>)> = Vec::new();
        // Admitted, their prompts not yet all run, first come first served.
        let mut prefilling: VecDeque<(Sequence<'_, B>, UnboundedSender<Event>)> = VecDeque::new();
        let mut kept: Vec<(KvCache<B>, Vec<u32>)> = Vec::new();
        let context = self.generator.config.max_position_embeddings;
        let mut open = true;
        loop {
            // Admit waiting jobs into free slots; with nothing to do, wait for one.
            while open && running.len() + prefilling.len() < self.parallel {
                let idle = running.is_empty() && prefilling.is_empty();
                let job = if idle {
                    match jobs.recv() {
                        Ok(job) => job,
                        Err(_) => {
                            open = false;
                            break;
                        }
                    }
                } else {
                    match jobs.try_recv() {
                        Ok(job) => job,
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                };
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                if job.events.is_closed() {
                    continue;
                }
                // The kept cache sharing most with the prompt, else a fresh one for the whole
                // context (pages are only touched as positions fill), so that the next turn
                // fits in it.
                let best = (0..kept.len()).max_by_key(|&i| common_prefix(&kept[i].1, &job.prompt));
                let reuse = match best {
                    Some(i) => Some(kept.swap_remove(i)),
                    None => self
                        .generator
                        .new_cache(context)
                        .ok()
                        .map(|c| (c, Vec::new())),
                };
                match (self.generator).admit(&self.tokenizer, reuse, &job.prompt, job.options) {
                    Ok(mut sequence) => {
                        if let Some(top) = job.logprobs {
                            sequence.record_logprobs(top);
                        }
                        metrics.running.fetch_add(1, Ordering::Relaxed);
                        prefilling.push_back((sequence, job.events));
                    }
                    Err(e) => {
                        let _ = job.events.send(Event::Failed(e.to_string()));
                    }
                }
            }
            if running.is_empty() && prefilling.is_empty() {
                if open {
                    continue;
                }
                return;
            }
            // A piece of the first waiting prompt: all of it when nothing is decoding, else
            // PREFILL_PIECE tokens, so that the running streams wait at most that long.
            if let Some((sequence, events)) = prefilling.front_mut() {
                let piece = if running.is_empty() {
                    usize::MAX
                } else {
                    PREFILL_PIECE
                };
                let started = Instant::now();
                let prefilled = if events.is_closed() {
                    Err("the client went away".to_string())
                } else {
                    (self.generator.prefill(sequence, piece)).map_err(|e| e.to_string())
                };
                add_busy(metrics, started);
                if !matches!(prefilled, Ok(false)) {
                    let (sequence, events) = prefilling.pop_front().expect("the front");
                    match prefilled {
                        Ok(_) => running.push((sequence, events)),
                        Err(e) => {
                            let busy = running.len() + prefilling.len();
                            self.retire(sequence, events, Err(e), busy, &mut kept, metrics);
                        }
                    }
                }
            }
            // A client that has gone is dropped before its next token.
            let mut i = 0;
            while i < running.len() {
                if running[i].1.is_closed() {
                    let (sequence, events) = running.swap_remove(i);
                    let gone = Err("the client went away".to_string());
                    let busy = running.len() + prefilling.len();
                    self.retire(sequence, events, gone, busy, &mut kept, metrics);
                } else {
                    i += 1;
                }
            }
            if running.is_empty() {
                continue;
            }
            // One token of every running sequence, decoded together: one pass over the
            // weights for all of them.
            let started = Instant::now();
            let mut texts = vec![String::new(); running.len()];
            let results = {
                let mut sequences: Vec<&mut Sequence<'_, B>> =
                    running.iter_mut().map(|(sequence, _)| sequence).collect();
                (self.generator).step_each(&mut sequences, |i, piece| texts[i].push_str(piece))
            };
            add_busy(metrics, started);
            // From the last, so that swap_remove moves only sequences already seen.
            for (i, (result, text)) in results.into_iter().zip(texts).enumerate().rev() {
                let logprobs = running[i].0.take_logprobs();
                if !logprobs.is_empty() {
                    let logprobs = logprobs.iter().map(|l| self.logprob(l)).collect();
                    let _ = running[i].1.send(Event::Logprobs(logprobs));
                }
                if !text.is_empty() {
                    let _ = running[i].1.send(Event::Text(text));
                }
                let outcome = match result {
                    Ok(None) => continue,
                    Ok(Some(_)) => Ok(()),
                    Err(e) => Err(e.to_string()),
                };
                let (sequence, events) = running.swap_remove(i);
                let busy = running.len() + prefilling.len();
                self.retire(sequence, events, outcome, busy, &mut kept, metrics);
            }
        }
    }

    /// `logprob` with its tokens' text and bytes.
    fn logprob(&self, logprob: &TokenLogprob) -> Logprob {
        let token = |id: u32, logprob: f32, top: Vec<Logprob>| Logprob {
            token: self.tokenizer.decode(&[id]).unwrap_or_default(),
            // Interim: exact except for a token holding part of a character (U+FFFD's
            // bytes then), until the tokenizer gives a token's raw bytes.
            bytes: (self.tokenizer.decode(&[id]).unwrap_or_default()).into_bytes(),
            logprob,
            top,
        };
        let top = (logprob.top.iter())
            .map(|&(id, lp)| token(id, lp, Vec::new()))
            .collect();
        token(logprob.id, logprob.logprob, top)
    }

    /// Ends a sequence that has stopped (or failed, or lost its client): sends what is left
    /// of its text and how it ended, counts it, and keeps its cache for a later turn (at
    /// most `parallel` caches in all, `running` of them in use: the oldest kept goes).
    fn retire(
        &self,
        sequence: Sequence<'_, B>,
        events: UnboundedSender<Event>,
        outcome: Result<(), String>,
        running: usize,
        kept: &mut Vec<(KvCache<B>, Vec<u32>)>,
        metrics: &Metrics,
    ) {
        metrics.running.fetch_sub(1, Ordering::Relaxed);
        let mut rest = String::new();
        let cached_tokens = sequence.reused_tokens();
        let (generation, cache) = sequence.finish_keeping_cache(&mut |piece| rest.push_str(piece));
        while !kept.is_empty() && kept.len() + running >= self.parallel {
            kept.remove(0);
        }
        kept.push(cache);
        if !rest.is_empty() {
            let _ = events.send(Event::Text(rest));
        }
        metrics
            .prompt_tokens
            .fetch_add(generation.prompt_tokens as u64, Ordering::Relaxed);
        metrics
            .completion_tokens
            .fetch_add(generation.tokens.len() as u64, Ordering::Relaxed);
        metrics.requests.fetch_add(1, Ordering::Relaxed);
        let _ = events.send(match outcome {
            Err(e) => Event::Failed(e),
            Ok(()) => Event::Done {
                reason: generation.stop_reason,
                prompt_tokens: generation.prompt_tokens,
                cached_tokens,
                completion_tokens: generation.tokens.len(),
            },
        });
    }
}

fn add_busy(metrics: &Metrics, started: Instant) {
    let ns = started.elapsed().as_nanos() as u64;
    metrics.busy_ns.fetch_add(ns, Ordering::Relaxed);
}
