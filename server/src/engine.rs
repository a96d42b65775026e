//! The engine: one thread that owns the model and runs up to `parallel` sequences, a token
//! of each per step, decoded together (`Generator::step_each`: one pass over the weights
//! for all of them, each sequence's tokens what it would get alone), so every running
//! request keeps streaming. New requests join between steps; prompts are prefilled a piece
//! at a time between the others' steps (`Generator::admit`, `Generator::prefill`), the
//! shortest waiting prompt first, so that a short request is not stuck behind a long one.
//! Requests beyond `parallel` wait in the queue (the channel) in arrival order; a request
//! whose client has gone (its event receiver dropped) is dropped before its next token.
//!
//! A sequence's KV cache grows as its positions fill (`runtime::model::cache`). Each finished
//! sequence's cache is kept with the ids it holds, within a memory budget (least recently
//! used dropped first); a new request starts from the kept cache of its scope sharing the
//! longest prefix with its prompt (the next turn of a conversation), so only what is new
//! is prefilled. Scopes (API key and `cache_salt`) keep one client's cached prefixes from
//! showing in another's `cached_tokens`.
//!
//! Embedding requests ([`Work::Embed`]) wait in a queue of their own and run between the
//! steps too, a piece of their texts at a time (each text whole, alone:
//! `Generator::embed`), so that streams keep going while a long list is embedded and a
//! text's embedding does not depend on what else runs.
//!
//! The model runs on this thread inside the rayon pool, as the command line runs it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use runtime::generate::sampling::TokenLogprob;
use runtime::generate::{
    GenerateError, GenerateOptions, Generator, Sequence, StopReason, common_prefix,
};
use runtime::model::backend::KernelBackend;
use runtime::model::cache::KvCache;
use runtime::text::grammar::Constraint;
use runtime::text::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

/// Prompts are prefilled a piece at a time, between decoding steps and admissions, so that
/// the running streams pause for one piece rather than a whole prompt, and a request that
/// arrives meanwhile waits at most for the piece under way. A piece is this many tokens at
/// the start of a prompt while others decode (docs/BENCHMARKS.md has what a piece costs)...
const PIECE_DECODING: usize = 128;

/// ...and this many when prefilling is all there is to do: fewer, larger pieces, since each
/// costs a pass over the weights of its own (bf16 weights widened for gemm: a piece
/// takes about a second on 2 cores, the longest a request arriving meanwhile waits).
const PIECE_ALONE: usize = 1024;

/// A piece shrinks as the prompt's position grows, so that it takes about as long at any
/// depth: each token attends to every one before it, and at about this many positions
/// attention costs what the token's products cost (SmolLM2 on 2 cores).
const PIECE_DEPTH: usize = 3072;

/// Tokens of a prompt at position `depth` that cost what `budget` tokens cost at position 0.
fn piece_at(depth: usize, budget: usize) -> usize {
    (budget * PIECE_DEPTH / (PIECE_DEPTH + depth)).max(1)
}

/// A request the engine runs.
struct Active<'t, B: KernelBackend> {
    sequence: Sequence<'t, B>,
    /// Where its events go; closed once its client has gone.
    events: UnboundedSender<Event>,
    /// Who may reuse its cache ([`Job::scope`]).
    scope: String,
    /// The other choices of its request ([`Job::forks`]), started once its prompt has run.
    forks: Vec<Fork>,
    /// Whether it is such a choice: its prompt is counted with the first choice.
    forked: bool,
}

impl<B: KernelBackend> Active<'_, B> {
    /// Decoding slots it holds, with its forks to come.
    fn slots(&self) -> usize {
        1 + self.forks.len()
    }
}

/// A finished sequence's cache, kept for a later request of the same scope.
struct KeptCache<B: KernelBackend> {
    cache: KvCache<B>,
    /// The ids whose keys and values it holds.
    ids: Vec<u32>,
    scope: String,
}

/// The kept caches, least recently used first.
struct KeptCaches<B: KernelBackend> {
    caches: Vec<KeptCache<B>>,
}

impl<B: KernelBackend> Default for KeptCaches<B> {
    fn default() -> Self {
        Self { caches: Vec::new() }
    }
}

impl<B: KernelBackend> KeptCaches<B> {
    fn bytes(&self) -> u64 {
        self.caches.iter().map(|k| k.cache.bytes()).sum()
    }

    /// Drops the least recently used caches until the rest fit in `budget` bytes.
    fn fit(&mut self, budget: u64) {
        let mut bytes = self.bytes();
        while bytes > budget && !self.caches.is_empty() {
            bytes -= self.caches.remove(0).cache.bytes();
        }
    }
}

/// A request for the engine: the prompt's ids and how to continue it, and where its events
/// go.
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Each generated token's log-probability, with this many alternatives.
    pub logprobs: Option<usize>,
    /// Most tokens drafted at once for this request, where the server drafts (0: none).
    pub draft_limit: Option<usize>,
    /// Who may share a kept cache with this request: requests reuse each other's caches
    /// only within one scope (the API key presented and the `cache_salt` field), so that
    /// `cached_tokens` cannot tell one client what another's prompt was.
    pub scope: String,
    pub events: UnboundedSender<Event>,
    /// The grammar the answer follows, compiled by the HTTP side.
    pub constraint: Option<Constraint>,
    /// More choices from the same prompt (OpenAI's `n`), each with its seed and events: the
    /// prompt runs once, then each choice starts from a copy of its cache
    /// ([`runtime::generate::Generator::fork`]).
    pub forks: Vec<Fork>,
}

/// What the HTTP side hands the engine: a generation, or texts to embed.
pub enum Work {
    /// Boxed: a job's options are large, an embedding job small.
    Generate(Box<Job>),
    Embed(EmbedJob),
}

/// Texts to embed (their token ids, each checked by the HTTP side: non-empty, within the
/// context and the vocabulary), cut to `dimensions` if asked, and where the embeddings go,
/// in the order of the texts.
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub dimensions: Option<usize>,
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

/// An embedding job under way: the embeddings of its first texts.
struct Embedding {
    job: EmbedJob,
    done: Vec<Vec<f32>>,
}

/// Another choice of a [`Job`]: its sampling seed and where its events go.
pub struct Fork {
    pub seed: u64,
    pub events: UnboundedSender<Event>,
}

impl Job {
    /// Decoding slots it needs.
    fn slots(&self) -> usize {
        1 + self.forks.len()
    }

    /// Whether every client of it has gone (their event receivers dropped).
    fn abandoned(&self) -> bool {
        self.events.is_closed() && self.forks.iter().all(|f| f.events.is_closed())
    }
}

/// Sends `event` to every choice of a job: its first's `events` and its `forks`.
fn tell(events: &UnboundedSender<Event>, forks: &[Fork], event: Event) {
    for events in std::iter::once(events).chain(forks.iter().map(|f| &f.events)) {
        let _ = events.send(event.clone());
    }
}

/// Jobs received and not yet admitted, in arrival order: the requests waiting for a slot
/// (`Metrics::queued` counts them, from when the HTTP side sends them until they leave).
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Waiting>,
    /// Embedding jobs in arrival order, the first under way.
    embeddings: VecDeque<Embedding>,
}

struct Waiting {
    job: Job,
    /// Whether it has been told it waits ([`Event::Waiting`]).
    told: bool,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.embeddings.is_empty()
    }

    fn push(&mut self, work: Work) {
        match work {
            Work::Generate(job) => self.jobs.push_back(Waiting {
                job: *job,
                told: false,
            }),
            Work::Embed(job) => self.embeddings.push_back(Embedding {
                job,
                done: Vec::new(),
            }),
        }
    }

    /// Takes every job sent so far; false once the channel has closed.
    fn receive(&mut self, jobs: &mpsc::Receiver<Work>) -> bool {
        loop {
            match jobs.try_recv() {
                Ok(job) => self.push(job),
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Drops the jobs whose clients have gone, each counted as a cancelled request: its
    /// prompt is never run.
    fn drop_abandoned(&mut self, metrics: &Metrics) {
        self.embeddings.retain(|embedding| {
            let abandoned = embedding.job.reply.is_closed();
            if abandoned {
                // Counted out of the queue when its first text ran.
                if embedding.done.is_empty() {
                    metrics.queued.fetch_sub(1, Ordering::Relaxed);
                }
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                metrics.requests.fetch_add(1, Ordering::Relaxed);
            }
            !abandoned
        });
        self.jobs.retain(|waiting| {
            let abandoned = waiting.job.abandoned();
            if abandoned {
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                metrics.requests.fetch_add(1, Ordering::Relaxed);
            }
            !abandoned
        });
    }

    /// The oldest job, taken if its choices fit the slots left with `taken` of `parallel`
    /// in use (or none are: `n` is at most `parallel`). In arrival order: a job that does
    /// not fit yet keeps those after it waiting.
    fn next_fitting(&mut self, taken: usize, parallel: usize, metrics: &Metrics) -> Option<Job> {
        let fits = |w: &Waiting| taken == 0 || taken + w.job.slots() <= parallel;
        if !self.jobs.front().is_some_and(fits) {
            return None;
        }
        metrics.queued.fetch_sub(1, Ordering::Relaxed);
        self.jobs.pop_front().map(|w| w.job)
    }

    /// Tells each job not yet told that it waits for a slot (a stream says so at once).
    fn tell_waiting(&mut self) {
        for waiting in self.jobs.iter_mut().filter(|w| !w.told) {
            tell(&waiting.job.events, &waiting.job.forks, Event::Waiting);
            waiting.told = true;
        }
    }
}

/// What the engine tells a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Too few slots are free: the request waits in the queue. Sent at most once, before
    /// any other event.
    Waiting,
    /// Generated text, complete characters, never part of a stop string.
    Text(String),
    /// The log-probabilities of tokens just generated, sent before any text of the same
    /// step. A token's text may come later (a character split over tokens is sent once
    /// whole, a possible start of a stop string once it is known not to be one) or never (a
    /// stop string's own tokens): the HTTP side pairs each token with the text that
    /// completes its `bytes`.
    Logprobs(Vec<Logprob>),
    /// The generation ended: why, and what it counted.
    Done(Finished),
    Failed(String),
    /// The request cannot be served as asked, found only while generating: its grammar
    /// went past llguidance's limits (a 400 naming the field the grammar came from, if
    /// nothing was sent).
    Refused(String),
}

/// How a generation ended ([`Event::Done`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens found in a kept cache and not run again.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The stop string that ended the text (`reason` is then `Stop`).
    pub stop_string: Option<String>,
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
    /// Requests waiting for a slot: counted in by the HTTP side as it sends them (against
    /// `--max-queue`), out by the engine as it admits or drops them.
    pub queued: AtomicUsize,
    pub running: AtomicUsize,
    /// Requests the engine ended: answered, failed once admitted, or cancelled.
    pub requests: AtomicU64,
    /// Requests dropped because their client went away (closed the connection), while
    /// queued or running.
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Tokens drafted (`--draft`) and, of those, kept: each kept one is a step saved.
    pub draft_tokens: AtomicU64,
    pub draft_tokens_accepted: AtomicU64,
    /// Nanoseconds spent running sequences (prefill and decode), for tok/s.
    pub busy_ns: AtomicU64,
    /// Responses the router gave, by route (its pattern, so the labels stay few) and
    /// status; requests refused before routing (`guard`) are not among them.
    pub responses: Mutex<BTreeMap<(String, u16), u64>>,
}

/// The model and tokenizer, once loaded; `parallel` sequences at most.
pub struct Engine<B: KernelBackend> {
    pub generator: Generator<B>,
    pub tokenizer: Arc<Tokenizer>,
    pub parallel: usize,
    /// Bytes the kept caches of finished requests may take in all.
    pub cache_budget: u64,
}

impl<B: KernelBackend> Engine<B> {
    /// Serves `jobs` until the channel closes and every running sequence has ended.
    pub fn run(&self, jobs: mpsc::Receiver<Work>, metrics: &Metrics) {
        let mut running: Vec<Active<'_, B>> = Vec::new();
        // Admitted, their prompts not yet all run, in arrival order.
        let mut prefilling: VecDeque<Active<'_, B>> = VecDeque::new();
        let mut queue = Queue::default();
        let mut kept = KeptCaches::default();
        // Pieces the oldest waiting prompt has gone without in a row.
        let mut passed_over = 0;
        let mut open = true;
        loop {
            let idle = running.is_empty() && prefilling.is_empty() && queue.is_empty();
            if idle {
                // With nothing to do, wait for a job.
                match jobs.recv() {
                    Ok(job) => queue.push(job),
                    Err(_) => return,
                }
            }
            if open {
                open = queue.receive(&jobs);
            }
            // Between steps: a client that left while its request waited is dropped now,
            // not when a slot frees.
            queue.drop_abandoned(metrics);
            loop {
                let taken = running.len() + prefilling.iter().map(Active::slots).sum::<usize>();
                let Some(job) = queue.next_fitting(taken, self.parallel, metrics) else {
                    break;
                };
                self.admit(job, &mut kept, &mut prefilling, metrics);
            }
            queue.tell_waiting();
            if !queue.embeddings.is_empty() {
                let budget = if running.is_empty() {
                    PIECE_ALONE
                } else {
                    PIECE_DECODING
                };
                self.embed_piece(&mut queue.embeddings, budget, metrics);
            }
            if running.is_empty() && prefilling.is_empty() {
                continue;
            }
            // A piece of the waiting prompt with the least left (a short request is not
            // stuck behind a long prompt), or of the oldest once it has been passed over
            // twice (a long prompt is not stuck behind a stream of short ones).
            let shortest =
                (0..prefilling.len()).min_by_key(|&i| prefilling[i].sequence.prompt_left());
            let chosen = match shortest {
                Some(i) if i != 0 && passed_over >= 2 => Some(0),
                other => other,
            };
            passed_over = match chosen {
                Some(i) if i != 0 => passed_over + 1,
                _ => 0,
            };
            if let Some(i) = chosen {
                let budget = if running.is_empty() {
                    PIECE_ALONE
                } else {
                    PIECE_DECODING
                };
                let Active {
                    sequence, events, ..
                } = &mut prefilling[i];
                let tokens = piece_at(sequence.prefilled(), budget);
                let started = Instant::now();
                let prefilled = if events.is_closed() {
                    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    Err(Event::Failed("the client went away".into()))
                } else {
                    (self.generator.prefill(sequence, tokens)).map_err(failure)
                };
                add_busy(metrics, started);
                if !matches!(prefilled, Ok(false)) {
                    let mut active = prefilling.remove(i).expect("a chosen index");
                    match prefilled {
                        Ok(_) => {
                            for fork in std::mem::take(&mut active.forks) {
                                self.start_fork(&active, fork, &mut running, metrics);
                            }
                            running.push(active);
                        }
                        Err(e) => {
                            self.retire(active, Err(e), &mut kept, metrics);
                        }
                    }
                }
            }
            // A client that has gone is dropped before its next token.
            let mut i = 0;
            while i < running.len() {
                if running[i].events.is_closed() {
                    let active = running.swap_remove(i);
                    metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                    let gone = Err(Event::Failed("the client went away".into()));
                    self.retire(active, gone, &mut kept, metrics);
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
                let mut sequences: Vec<&mut Sequence<'_, B>> = running
                    .iter_mut()
                    .map(|active| &mut active.sequence)
                    .collect();
                (self.generator).step_each(&mut sequences, |i, piece| texts[i].push_str(piece))
            };
            add_busy(metrics, started);
            // From the last, so that swap_remove moves only sequences already seen.
            for (i, (result, text)) in results.into_iter().zip(texts).enumerate().rev() {
                let logprobs = running[i].sequence.take_logprobs();
                if !logprobs.is_empty() {
                    let logprobs = logprobs.iter().map(|l| self.logprob(l)).collect();
                    let _ = running[i].events.send(Event::Logprobs(logprobs));
                }
                if !text.is_empty() {
                    let _ = running[i].events.send(Event::Text(text));
                }
                let outcome = match result {
                    Ok(None) => continue,
                    Ok(Some(_)) => Ok(()),
                    Err(e) => Err(failure(e)),
                };
                let active = running.swap_remove(i);
                self.retire(active, outcome, &mut kept, metrics);
            }
        }
    }

    /// Embeds the next texts of the first embedding job, about `budget` tokens of them (at
    /// least one text, each whole), and answers the job once all its texts are done.
    fn embed_piece(&self, embeddings: &mut VecDeque<Embedding>, budget: usize, metrics: &Metrics) {
        let Some(embedding) = embeddings.front_mut() else {
            return;
        };
        if embedding.done.is_empty() {
            metrics.queued.fetch_sub(1, Ordering::Relaxed);
        }
        let started = Instant::now();
        let mut spent = 0;
        let mut failed = None;
        while let Some(ids) = embedding.job.inputs.get(embedding.done.len()) {
            if spent > 0 && spent + ids.len() > budget {
                break;
            }
            spent += ids.len();
            match self.generator.embed(ids, embedding.job.dimensions) {
                Ok(vector) => embedding.done.push(vector),
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        add_busy(metrics, started);
        let finished = embedding.done.len() == embedding.job.inputs.len();
        if !finished && failed.is_none() {
            return;
        }
        let Embedding { job, done } = embeddings.pop_front().expect("the job embedded");
        let tokens: usize = job.inputs.iter().map(Vec::len).sum();
        metrics
            .prompt_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        metrics.requests.fetch_add(1, Ordering::Relaxed);
        let _ = job.reply.send(match failed {
            Some(e) => Err(e),
            None => Ok(done),
        });
    }

    /// Admits `job` (its prompt to be run); a job the generator refuses gets its error,
    /// every choice of it.
    fn admit<'t>(
        &'t self,
        job: Job,
        kept: &mut KeptCaches<B>,
        prefilling: &mut VecDeque<Active<'t, B>>,
        metrics: &Metrics,
    ) {
        let reuse = self.cache_for(kept, &job.prompt, &job.scope);
        match (self.generator).admit(&self.tokenizer, reuse, &job.prompt, job.options) {
            Ok(mut sequence) => {
                if let Some(limit) = job.draft_limit {
                    sequence.limit_drafts(limit);
                }
                if let Some(top) = job.logprobs {
                    sequence.record_logprobs(top);
                }
                if let Some(constraint) = job.constraint {
                    sequence
                        .constrain(constraint)
                        .expect("a sequence just admitted has generated nothing");
                }
                metrics.running.fetch_add(1, Ordering::Relaxed);
                prefilling.push_back(Active {
                    sequence,
                    events: job.events,
                    scope: job.scope,
                    forks: job.forks,
                    forked: false,
                });
            }
            Err(e) => tell(&job.events, &job.forks, Event::Failed(e.to_string())),
        }
    }

    /// Starts another choice of `active`'s request from its prompt's cache.
    fn start_fork<'t>(
        &'t self,
        active: &Active<'t, B>,
        fork: Fork,
        running: &mut Vec<Active<'t, B>>,
        metrics: &Metrics,
    ) {
        match (self.generator).fork(&self.tokenizer, &active.sequence, fork.seed) {
            Ok(sequence) => {
                metrics.running.fetch_add(1, Ordering::Relaxed);
                running.push(Active {
                    sequence,
                    events: fork.events,
                    scope: active.scope.clone(),
                    forks: Vec::new(),
                    forked: true,
                });
            }
            Err(e) => {
                let _ = fork.events.send(failure(e));
            }
        }
    }

    /// `logprob` with its tokens' text and bytes.
    fn logprob(&self, logprob: &TokenLogprob) -> Logprob {
        let token = |id: u32, logprob: f32, top: Vec<Logprob>| Logprob {
            token: self.tokenizer.decode(&[id]).unwrap_or_default(),
            bytes: self.tokenizer.token_bytes(id),
            logprob,
            top,
        };
        let top = (logprob.top.iter())
            .map(|&(id, lp)| token(id, lp, Vec::new()))
            .collect();
        token(logprob.id, logprob.logprob, top)
    }

    /// The cache a prompt starts from: a kept one of its scope sharing a prefix with it,
    /// taken if the prompt goes on from (at least half of) what it holds, as the next turn
    /// of its conversation does, else a copy of the shared prefix (another conversation with
    /// the same system prompt), which leaves the kept one for its own conversation; with no
    /// prefix shared, a new cache for the whole context (its memory grows as it fills).
    fn cache_for(
        &self,
        kept: &mut KeptCaches<B>,
        prompt: &[u32],
        scope: &str,
    ) -> Option<(KvCache<B>, Vec<u32>)> {
        let context = self.generator.config.max_position_embeddings;
        let shared =
            |k: &KeptCache<B>| common_prefix(&k.ids[..k.cache.len().min(k.ids.len())], prompt);
        let best = (kept.caches.iter().enumerate())
            .filter(|(_, k)| k.scope == scope)
            .map(|(i, k)| (i, shared(k)))
            .filter(|&(_, shared)| shared > 0)
            .max_by_key(|&(_, shared)| shared);
        match best {
            Some((i, shared)) if 2 * shared >= kept.caches[i].cache.len() => {
                let taken = kept.caches.remove(i);
                Some((taken.cache, taken.ids))
            }
            Some((i, shared)) => {
                // The kept one was used: it is now the most recently used.
                let source = kept.caches.remove(i);
                let fork = (
                    source.cache.fork(shared, context),
                    source.ids[..shared].to_vec(),
                );
                kept.caches.push(source);
                Some(fork)
            }
            None => self
                .generator
                .new_cache(context)
                .ok()
                .map(|c| (c, Vec::new())),
        }
    }

    /// Ends a sequence that has stopped (or failed, or lost its client): sends what is left
    /// of its text and how it ended, counts it, and keeps its cache for a later turn (kept
    /// caches fit in `cache_budget` bytes: the least recently used go first).
    fn retire(
        &self,
        Active {
            sequence,
            events,
            scope,
            forks,
            forked,
        }: Active<'_, B>,
        outcome: Result<(), Event>,
        kept: &mut KeptCaches<B>,
        metrics: &Metrics,
    ) {
        metrics.running.fetch_sub(1, Ordering::Relaxed);
        for fork in forks {
            let _ = fork.events.send(match &outcome {
                Err(event) => event.clone(),
                Ok(()) => Event::Failed("the prompt ended before its other choices started".into()),
            });
        }
        let mut rest = String::new();
        // A request's prompt, run once, is counted with its first choice.
        let counted = |tokens: usize| if forked { 0 } else { tokens };
        let cached_tokens = counted(sequence.reused_tokens());
        let (drafted, kept_drafts) = sequence.drafted();
        metrics
            .draft_tokens
            .fetch_add(drafted as u64, Ordering::Relaxed);
        metrics
            .draft_tokens_accepted
            .fetch_add(kept_drafts as u64, Ordering::Relaxed);
        let (generation, (cache, ids)) =
            sequence.finish_keeping_cache(&mut |piece| rest.push_str(piece));
        kept.caches.push(KeptCache { cache, ids, scope });
        kept.fit(self.cache_budget);
        if !rest.is_empty() {
            let _ = events.send(Event::Text(rest));
        }
        let prompt_tokens = counted(generation.prompt_tokens);
        metrics
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        metrics
            .completion_tokens
            .fetch_add(generation.tokens.len() as u64, Ordering::Relaxed);
        metrics
            .requests
            .fetch_add(counted(1) as u64, Ordering::Relaxed);
        let _ = events.send(match outcome {
            Err(event) => event,
            Ok(()) => Event::Done(Finished {
                reason: generation.stop_reason,
                prompt_tokens,
                cached_tokens,
                completion_tokens: generation.tokens.len(),
                stop_string: generation.stop_string,
            }),
        });
    }
}

/// What a failed generation tells its request: a grammar's failure is the request's
/// (`Refused`), any other the server's.
fn failure(e: GenerateError) -> Event {
    match e {
        GenerateError::Grammar(e) => Event::Refused(e.to_string()),
        e => Event::Failed(e.to_string()),
    }
}

fn add_busy(metrics: &Metrics, started: Instant) {
    let ns = started.elapsed().as_nanos() as u64;
    metrics.busy_ns.fetch_add(ns, Ordering::Relaxed);
}

/// What the tests of the answers' builders (`reply`, `messages`, `responses`) feed them.
#[cfg(test)]
pub(crate) mod testing {
    use runtime::generate::StopReason;
    use tokio::sync::mpsc as async_mpsc;

    use super::{Event, Finished};

    /// The engine's events for `text` in pieces of `size` bytes (ASCII), ended as `reason`
    /// after `tokens` tokens, 3 of the prompt's 7 from a cache; a stop string is `"\n\nUser"`.
    pub(crate) fn events(
        text: &str,
        size: usize,
        reason: StopReason,
        tokens: usize,
    ) -> async_mpsc::UnboundedReceiver<Event> {
        let (sender, receiver) = async_mpsc::unbounded_channel();
        for piece in text.as_bytes().chunks(size) {
            let piece = String::from_utf8(piece.to_vec()).unwrap();
            sender.send(Event::Text(piece)).unwrap();
        }
        let done = Event::Done(Finished {
            reason,
            prompt_tokens: 7,
            cached_tokens: 3,
            completion_tokens: tokens,
            stop_string: (reason == StopReason::Stop).then(|| "\n\nUser".to_string()),
        });
        sender.send(done).unwrap();
        receiver
    }
}
