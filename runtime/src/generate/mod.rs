//! Text generation and perplexity on a loaded model: the token loop ([`Generator`], here),
//! the sequences it steps together ([`Sequence`]), stop strings, scoring and sampling. Uses
//! every layer below it (`model`, `weights`, `text`); only the binaries use it.

use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use burn::tensor::{Int, Tensor, TensorData};
use kernels::int8::Matmul;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::generate::sampling::{Sampler, SamplingParams, logprobs};
use crate::model::backend::KernelBackend;
use crate::model::cache::{CacheError, KvCache, KvDtype};
use crate::model::config::{ConfigError, GenerationConfig, LlamaConfig, Pooling};
use crate::model::llama::Llama;
use crate::model::rope::Rope;
use crate::text::grammar::{Constraint, Grammar, GrammarError, Grammars};
use crate::text::tokenizer::{Tokenizer, TokenizerError};
use crate::util::file_names::{GENERATION_CONFIG_FILE, POOLING_FILE};
use crate::weights::artifact;
use crate::weights::file::WeightsMemory;
use crate::weights::layout::{Kept, Weights};
use crate::weights::load::Progress;
use crate::weights::manifest::ArtifactError;

mod draft;
mod embedding;
mod prefill;
pub mod sampling;
mod scoring;
mod sequence;
mod stop;

pub use draft::{Draft, Drafter};
pub use prefill::Prefill;
pub use scoring::Perplexity;
pub use sequence::Sequence;
use sequence::{Picked, Picker};
use stop::StopText;

/// Prompts and perplexity texts run through the model this many tokens at a time, which
/// bounds the attention scores' memory (`heads × chunk × context` floats) for long inputs.
const PREFILL_CHUNK: usize = 512;

/// Errors while generating.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {tokens} tokens; the model's context holds {context} (max_position_embeddings) and needs room for at least one new token"
    )]
    PromptTooLong { tokens: usize, context: usize },
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("perplexity needs at least 2 tokens, the text has {0}")]
    TextTooShort(usize),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("token id {id} is outside the model's vocabulary (vocab_size {vocab_size})")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error(
        "logit bias for token id {id}, outside the model's vocabulary (vocab_size {vocab_size})"
    )]
    BiasOutOfRange { id: u32, vocab_size: usize },
    #[error("{0}")]
    Backend(String),
    #[error("a step before the sequence's prompt has all run (Generator::prefill)")]
    NotPrefilled,
    #[error("a sequence forks or takes a grammar only before its first token")]
    Started,
    /// Not the error's source as well: a chain would print the message twice.
    #[error("grammar: {0}")]
    Grammar(GrammarError),
    #[error(
        "the model's logits at position {position} are not finite (NaN or infinite): its weights or configuration are broken"
    )]
    NonFiniteLogits { position: usize },
    #[error(
        "this is an embedding model (a LlamaModel or Qwen3Model checkpoint, without lm_head): it cannot generate or score text; embed text with `runtime embed` or POST /v1/embeddings"
    )]
    EmbeddingModel,
    #[error(
        "the text is longer than the model's context: {tokens} tokens, at most {context} (max_position_embeddings)"
    )]
    TextTooLong { tokens: usize, context: usize },
    #[error(
        "the embedding cannot be cut to {dimensions} dimensions: this model's are {hidden}{}",
        match .allowed.is_empty() {
            true => " and it lists no shorter sizes (matryoshka_dimensions)".to_string(),
            false => format!(", or one of {:?} (matryoshka_dimensions)", .allowed),
        }
    )]
    Dimensions {
        dimensions: usize,
        hidden: usize,
        allowed: Vec<usize>,
    },
    #[error(
        "the draft model's vocabulary has {theirs} tokens, this model's {ours}: a draft model must share the model's tokenizer"
    )]
    DraftVocabulary { ours: usize, theirs: usize },
    #[error(
        "the embedding of position {position} is not finite (NaN or infinite): the model's weights or configuration are broken"
    )]
    NonFiniteEmbedding { position: usize },
}

impl From<GrammarError> for GenerateError {
    fn from(e: GrammarError) -> Self {
        GenerateError::Grammar(e)
    }
}

/// Refuses logits that are not all finite: a broken model (a NaN weight, a scale that
/// overflowed) would otherwise pick or score from garbage and end as if nothing were
/// wrong. `position` names the token position for the error.
pub(crate) fn check_finite(logits: &[f32], position: usize) -> Result<(), GenerateError> {
    // A sum is NaN if any value is NaN or infinite (inf - inf, or inf itself): one pass
    // the compiler vectorizes, where `any` would test value by value.
    let sum: f32 = logits.iter().map(|&l| l * 0.0).sum();
    if sum == 0.0 {
        Ok(())
    } else {
        Err(GenerateError::NonFiniteLogits { position })
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// The text reached a `--stop` string.
    Stop,
    /// `max_new_tokens` or the context length was reached.
    Length,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// What the generated text must match ([`crate::text::grammar`]), if anything.
    pub grammar: Option<Grammar>,
}

/// Prefill and decode speed of one generation.
#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    pub prefill_s: f64,
    pub decode_s: f64,
    pub prefill_tokens_per_s: f64,
    /// Tokens after the first, over the time spent on them.
    pub decode_tokens_per_s: f64,
}

/// The result of [`Generator::generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    pub text: String,
    /// Generated token ids (no prompt; an ending EOS is not included).
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub stop_reason: StopReason,
    /// The stop string that ended it (with [`StopReason::Stop`]).
    pub stop_string: Option<String>,
    pub timings: Timings,
}

/// A model ready to run: weights and the ids that end a sequence.
pub struct Generator<B: KernelBackend> {
    pub model: Llama<B>,
    pub config: LlamaConfig,
    /// What the loader kept the matrices as.
    pub kept: Kept,
    /// What new KV caches store keys and values as.
    pub kv_dtype: KvDtype,
    /// How products over quantized weights take their inputs.
    pub matmul: Matmul,
    /// How prompts run: fast, or through the decoding kernels so that every position is
    /// the same bits however it is reached ([`Prefill`]).
    pub prefill: Prefill,
    /// What drafts tokens for the sequences started here (speculative decoding), if
    /// anything: it changes no token ([`draft`]).
    pub draft: Option<Draft>,
    /// The model [`Draft::Model`] drafts with: smaller, the same tokenizer
    /// ([`Self::set_draft_model`]).
    pub draft_model: Option<Box<Generator<B>>>,
    /// How a text's hidden states become its embedding ([`Self::embed`]): the artifact's
    /// pooling.json, else the last token's, normalized.
    pub pooling: Pooling,
    eos_ids: Vec<u32>,
    device: B::Device,
    /// Rotary tables shared by the caches made here (the same whichever cache reads them),
    /// grown to the largest capacity asked for: a server's caches don't each hold a copy.
    rope: Mutex<Option<Rope<B>>>,
    /// The vocabulary as grammars see it, made for the first sequence that has one.
    grammars: OnceLock<Result<Grammars, GrammarError>>,
}

impl<B: KernelBackend> Generator<B> {
    /// Loads the artifact in `dir`, its matrices as bf16 where that is exact.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, GenerateError> {
        Self::load_with(dir, device, Weights::Auto)
    }

    /// Loads the artifact in `dir`, its matrices kept as `weights` says.
    pub fn load_with(
        dir: &Path,
        device: &B::Device,
        weights: Weights,
    ) -> Result<Self, GenerateError> {
        Self::load_watched(
            dir,
            device,
            weights,
            WeightsMemory::default(),
            &Progress::default(),
        )
    }

    /// [`Self::load_with`], the weights file in `memory`, counting each parameter made in
    /// `progress` (for a progress bar drawn by another thread).
    pub fn load_watched(
        dir: &Path,
        device: &B::Device,
        weights: Weights,
        memory: WeightsMemory,
        progress: &Progress,
    ) -> Result<Self, GenerateError> {
        let (model, config, kept) =
            artifact::load_model_watched::<B>(dir, device, weights, memory, progress)?;
        let mut eos_ids = config.eos_token_ids.clone();
        // generation_config.json is optional; when present it may name more end tokens.
        let generation = GenerationConfig::from_file(&dir.join(GENERATION_CONFIG_FILE))?;
        if let Some(ids) = generation.and_then(|g| g.eos_token_id) {
            eos_ids.extend(ids.to_vec());
        }
        eos_ids.sort_unstable();
        eos_ids.dedup();
        for &id in &eos_ids {
            config.check_token_id(id, "end-of-sequence id")?;
        }
        let pooling = Pooling::from_file(&dir.join(POOLING_FILE))?.unwrap_or_default();
        pooling.check(config.hidden_size)?;
        Ok(Self {
            model,
            config,
            kept,
            kv_dtype: KvDtype::default(),
            matmul: Matmul::default(),
            prefill: Prefill::default(),
            draft: None,
            draft_model: None,
            pooling,
            eos_ids,
            device: device.clone(),
            rope: Mutex::new(None),
            grammars: OnceLock::new(),
        })
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Drafts with `draft` ([`Draft::Model`]): a model with this one's vocabulary, else an
    /// error saying so (its token ids would mean other tokens).
    pub fn set_draft_model(&mut self, draft: Generator<B>) -> Result<(), GenerateError> {
        let (ours, theirs) = (self.config.vocab_size, draft.config.vocab_size);
        if ours != theirs {
            return Err(GenerateError::DraftVocabulary { ours, theirs });
        }
        draft.check_generates()?;
        self.draft_model = Some(Box::new(draft));
        self.draft = Some(Draft::Model);
        Ok(())
    }

    /// Refuses an embedding model, which has no lm_head: its logits would be the
    /// embedding's rows against the hidden states, text that means nothing.
    pub fn check_generates(&self) -> Result<(), GenerateError> {
        if self.config.embedding_model {
            return Err(GenerateError::EmbeddingModel);
        }
        Ok(())
    }

    /// An empty KV cache for `capacity` positions (its memory grows as they fill).
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache<B>, CacheError> {
        let (config, dtype) = (&self.config, self.kv_dtype);
        KvCache::<B>::check_memory(config, 1, capacity, dtype)?;
        let mut rope = self.rope.lock().unwrap_or_else(PoisonError::into_inner);
        let rope = match rope.as_ref() {
            Some(rope) if rope.positions() >= capacity => rope.clone(),
            _ => rope
                .insert(Rope::new(config, capacity, &self.device))
                .clone(),
        };
        Ok(KvCache::with_rope(
            config,
            1,
            capacity,
            dtype,
            rope,
            &self.device,
        ))
    }

    /// Runs `ids` through the model after what `cache` holds, in chunks, and returns the
    /// logits of every position (`all`) or of the last one, flattened row by row.
    pub fn forward_logits(
        &self,
        ids: &[u32],
        cache: &mut KvCache<B>,
        all: bool,
    ) -> Result<Vec<f32>, GenerateError> {
        let wanted = if all {
            WantedLogits::All
        } else {
            WantedLogits::Last
        };
        self.forward_logits_wanted(ids, cache, wanted)
    }

    /// [`Self::forward_logits`] returning the logits `wanted` names.
    fn forward_logits_wanted(
        &self,
        ids: &[u32],
        cache: &mut KvCache<B>,
        wanted: WantedLogits,
    ) -> Result<Vec<f32>, GenerateError> {
        self.check_generates()?;
        // Checked for the whole input, so a long one fails before any work.
        cache.check_room(1, ids.len())?;
        self.check_ids(ids)?;
        let mut out = Vec::new();
        let n_chunks = ids.len().div_ceil(PREFILL_CHUNK);
        for (i, chunk) in ids.chunks(PREFILL_CHUNK).enumerate() {
            let wanted = match (wanted, i + 1 == n_chunks) {
                (WantedLogits::All, _) => WantedLogits::All,
                (wanted, true) => wanted,
                (_, false) => WantedLogits::None,
            };
            if let Some(logits) = self.chunk_logits(chunk, cache, wanted)? {
                out.extend(
                    logits.into_vec::<f32>().map_err(|e| {
                        GenerateError::Backend(format!("cannot read logits: {e:?}"))
                    })?,
                );
            }
        }
        Ok(out)
    }

    /// Generates a continuation of `prompt` (token ids), calling `on_text` with each piece of
    /// text as soon as it is complete (whole UTF-8 characters, never part of a stop string).
    pub fn generate(
        &self,
        tokenizer: &Tokenizer,
        prompt: &[u32],
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<Generation, GenerateError> {
        let mut sequence = self.start(tokenizer, prompt, options.clone())?;
        while self.step(&mut sequence, &mut on_text)?.is_none() {}
        Ok(sequence.finish(&mut on_text))
    }

    /// A generation begun: the prompt checked and prefilled, the first token's logits ready.
    /// [`Self::step`] then produces one token at a time, so a caller can interleave
    /// sequences or stop one.
    pub fn start<'t>(
        &self,
        tokenizer: &'t Tokenizer,
        prompt: &[u32],
        options: GenerateOptions,
    ) -> Result<Sequence<'t, B>, GenerateError> {
        self.start_from(tokenizer, None, prompt, options)
    }

    /// [`Self::start`] reusing `reuse`, a cache and the ids it holds (what
    /// [`Sequence::into_cache`] gives back): the prompt's longest prefix it already holds is
    /// not run again (the next turn of a conversation prefills only the new messages). A
    /// cache too small for this generation is not reused.
    pub fn start_from<'t>(
        &self,
        tokenizer: &'t Tokenizer,
        reuse: Option<(KvCache<B>, Vec<u32>)>,
        prompt: &[u32],
        options: GenerateOptions,
    ) -> Result<Sequence<'t, B>, GenerateError> {
        let mut sequence = self.admit(tokenizer, reuse, prompt, options)?;
        self.prefill(&mut sequence, usize::MAX)?;
        Ok(sequence)
    }

    /// [`Self::start_from`] without running the prompt: the prompt checked (every failure
    /// that does not depend on running it happens here) and the cache chosen. Then
    /// [`Self::prefill`] runs the prompt, in as many pieces as the caller wants (a server
    /// prefills a long prompt a piece at a time between decoding steps of the others).
    pub fn admit<'t>(
        &self,
        tokenizer: &'t Tokenizer,
        reuse: Option<(KvCache<B>, Vec<u32>)>,
        prompt: &[u32],
        options: GenerateOptions,
    ) -> Result<Sequence<'t, B>, GenerateError> {
        self.check_generates()?;
        let context = self.config.max_position_embeddings;
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if prompt.len() >= context {
            return Err(GenerateError::PromptTooLong {
                tokens: prompt.len(),
                context,
            });
        }
        self.check_ids(prompt)?;
        let vocab_size = self.config.vocab_size;
        if let Some(&(id, _)) =
            (options.sampling.logit_bias.iter()).find(|&&(id, _)| id as usize >= vocab_size)
        {
            return Err(GenerateError::BiasOutOfRange { id, vocab_size });
        }
        let capacity = context.min(prompt.len() + options.max_new_tokens);
        let (cache, reused) = match reuse {
            Some((mut cache, ids)) if cache.capacity() >= capacity => {
                // At least the prompt's last token runs: its logits start generation.
                let shared = common_prefix(&ids[..cache.len().min(ids.len())], prompt);
                let reused = shared.min(prompt.len() - 1);
                cache.truncate(reused);
                (cache, reused)
            }
            _ => (self.new_cache(capacity)?, 0),
        };
        cache.check_room(1, prompt.len() - reused)?;
        let constraint = match &options.grammar {
            Some(grammar) => Some(self.grammars(tokenizer)?.constraint(grammar)?),
            None => None,
        };
        let started = Instant::now();
        Ok(Sequence {
            cache,
            capacity,
            reused,
            constraint,
            sampler: Sampler::new(options.sampling.clone()),
            history: prompt.to_vec(),
            prompt_tokens: prompt.len(),
            tokens: Vec::new(),
            stream: tokenizer.decode_stream(),
            text: StopText::new(options.stop.clone()),
            max_new_tokens: options.max_new_tokens,
            logits: Vec::new(),
            pending: None,
            drafter: self.draft.map(Drafter::new),
            draft_cache: None,
            logprobs_top: None,
            logprobs: Vec::new(),
            stop_reason: None,
            started,
            prefill: Duration::ZERO,
            decode_started: started,
            decode: Duration::ZERO,
        })
    }

    /// Runs up to `max_tokens` more of the sequence's prompt (all of it with `usize::MAX`);
    /// `true` once the whole prompt has run and the first token's logits are ready, when
    /// [`Self::step`] may go on. Prefilling a prompt in pieces gives the same cache and
    /// logits as in one go: to the bit with [`Prefill::Invariant`], else up to the order of
    /// summation in the products.
    pub fn prefill(
        &self,
        sequence: &mut Sequence<'_, B>,
        max_tokens: usize,
    ) -> Result<bool, GenerateError> {
        let s = sequence;
        // The prompt's positions in the cache: every one once it has run.
        let done = s.cache.len();
        if done >= s.prompt_tokens {
            return Ok(true);
        }
        let end = s.prompt_tokens.min(done.saturating_add(max_tokens));
        let ids = &s.history[done..end];
        if end < s.prompt_tokens {
            self.forward_logits_wanted(ids, &mut s.cache, WantedLogits::None)?;
            return Ok(false);
        }
        s.logits = self.forward_logits_wanted(ids, &mut s.cache, WantedLogits::Last)?;
        s.prefill_draft(self.draft_model.as_deref());
        Ok(true)
    }

    /// The vocabulary as grammars see it, made the first time one is asked for (its trie
    /// and slices take a moment at a large vocabulary).
    fn grammars(&self, tokenizer: &Tokenizer) -> Result<&Grammars, GrammarError> {
        let made = self
            .grammars
            .get_or_init(|| Grammars::new(tokenizer, self.config.vocab_size, &self.eos_ids));
        made.as_ref().map_err(Clone::clone)
    }

    /// Another generation from `sequence`'s prompt, sampled with `seed`: its cache a copy
    /// of the prompt's (which is not run again), its first token drawn from the same logits.
    /// How OpenAI's `n` gets several choices from one prompt. Only between the prompt and
    /// the first token: once `sequence` has generated a token, [`GenerateError::Started`].
    pub fn fork<'t>(
        &self,
        tokenizer: &'t Tokenizer,
        sequence: &Sequence<'_, B>,
        seed: u64,
    ) -> Result<Sequence<'t, B>, GenerateError> {
        let s = sequence;
        if s.prompt_left() > 0 || s.logits.is_empty() {
            return Err(GenerateError::NotPrefilled);
        }
        if !s.tokens.is_empty() || s.stop_reason.is_some() {
            return Err(GenerateError::Started);
        }
        let started = Instant::now();
        Ok(Sequence {
            cache: s.cache.fork(s.cache.len(), s.capacity),
            capacity: s.capacity,
            reused: s.reused,
            constraint: s.constraint.as_ref().map(Constraint::fork),
            sampler: s.sampler.reseeded(seed),
            history: s.history.clone(),
            prompt_tokens: s.prompt_tokens,
            tokens: Vec::new(),
            stream: tokenizer.decode_stream(),
            text: StopText::new(s.text.stops.clone()),
            max_new_tokens: s.max_new_tokens,
            logits: s.logits.clone(),
            pending: None,
            drafter: s.drafter.clone(),
            draft_cache: None,
            logprobs_top: s.logprobs_top,
            logprobs: Vec::new(),
            stop_reason: None,
            started,
            prefill: Duration::ZERO,
            decode_started: started,
            decode: Duration::ZERO,
        })
    }

    /// Samples the sequence's next token, passes its text (what is complete) to `on_text`,
    /// and runs it through the model unless the sequence ends with it: `Some` reason when it
    /// has ended (then and on every later call).
    pub fn step(
        &self,
        sequence: &mut Sequence<'_, B>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Option<StopReason>, GenerateError> {
        let mut results = self.step_each(&mut [sequence], |_, piece| on_text(piece));
        results.pop().expect("one result per sequence")
    }

    /// [`Self::step`] for several sequences at once: each samples its next token (`on_text`
    /// gets the sequence's index with its text), then the tokens of those still running go
    /// through the model together, one pass over the weights for all of them
    /// ([`Llama::decode_each`]). A sequence's tokens are the ones it would get stepped
    /// alone, bit for bit the same logits. One result per sequence, in order.
    ///
    /// A sequence with a drafter ([`Generator::draft`]) runs its drafted tokens in the same
    /// pass, after its own ([`Llama::decode_rows`]: each row the bits a step of its own
    /// gives), and keeps those it picks itself, picking from each row in turn as a step
    /// would: several tokens in one step, the same tokens as without the draft.
    pub fn step_each(
        &self,
        sequences: &mut [&mut Sequence<'_, B>],
        mut on_text: impl FnMut(usize, &str),
    ) -> Vec<Result<Option<StopReason>, GenerateError>> {
        let mut results: Vec<Result<Option<StopReason>, GenerateError>> =
            Vec::with_capacity(sequences.len());
        // Sequences whose sampled token runs through the model, with the tokens drafted
        // after it.
        let mut running: Vec<(usize, u32, Vec<u32>)> = Vec::new();
        // Each sequence's pick (biases, penalties, its grammar's mask, the draw: O(vocab)
        // each) on its own state, in parallel; then, in order, what follows from it. A pick
        // made while checking a draft is taken as it is.
        let ready: Vec<Result<bool, GenerateError>> = sequences.iter().map(|s| s.ready()).collect();
        let pending: Vec<Option<Picked>> = sequences.iter_mut().map(|s| s.pending.take()).collect();
        let picks: Vec<Option<Result<Picked, GenerateError>>> = {
            let mut pickers: Vec<Option<Picker<'_>>> = (sequences.iter_mut().zip(&ready))
                .zip(&pending)
                .map(|((s, ready), pending)| {
                    (matches!(ready, Ok(true)) && pending.is_none()).then(|| s.picker())
                })
                .collect();
            (pickers.par_iter_mut())
                .map(|picker| picker.as_mut().map(Picker::pick))
                .collect()
        };
        let picks = picks
            .into_iter()
            .zip(pending)
            .map(|(picked, pending)| match pending {
                Some(pending) => Some(Ok(pending)),
                None => picked,
            });
        for ((i, s), (ready, picked)) in sequences
            .iter_mut()
            .enumerate()
            .zip(ready.into_iter().zip(picks))
        {
            let mut on_text = |piece: &str| on_text(i, piece);
            let sampled = match (ready, picked) {
                (Err(e), _) | (_, Some(Err(e))) => Err(e),
                (Ok(_), Some(Ok(picked))) => self.finish_step(s, Some(picked), &mut on_text),
                (Ok(_), None) => self.finish_step(s, None, &mut on_text),
            };
            if let Ok(Some(next)) = sampled {
                // A draft is only a guess: a draft model that fails leaves the sequence to
                // decode plainly, with the same tokens.
                let drafted = s.draft(self.draft_model.as_deref()).unwrap_or_else(|_| {
                    s.stop_drafting();
                    Vec::new()
                });
                running.push((i, next, drafted));
            }
            results.push(sampled.map(|_| None));
        }
        if !running.is_empty() {
            let ids: Vec<u32> = (running.iter())
                .flat_map(|(_, next, drafted)| std::iter::once(next).chain(drafted))
                .copied()
                .collect();
            let rows: Vec<usize> = running
                .iter()
                .map(|(.., drafted)| 1 + drafted.len())
                .collect();
            let mut caches: Vec<&mut KvCache<B>> = Vec::with_capacity(running.len());
            // The running sequences' caches, each borrowed apart from the others.
            let mut rest: &mut [&mut Sequence<'_, B>] = sequences;
            let mut skipped = 0;
            for &(i, ..) in &running {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - skipped);
                let (sequence, tail) = tail.split_first_mut().expect("an index in range");
                caches.push(&mut sequence.cache);
                rest = tail;
                skipped = i + 1;
            }
            let started = Instant::now();
            let checked = self.decode_rows(&ids, &mut caches, &rows);
            let seconds = started.elapsed().as_secs_f32();
            match checked {
                Ok(logits) => {
                    let vocab_size = self.config.vocab_size;
                    let mut rest = logits.as_slice();
                    for (i, _, drafted) in &running {
                        let s = &mut sequences[*i];
                        let own = 1 + drafted.len();
                        (s.drafter.iter_mut())
                            .for_each(|drafter| drafter.step_took(ids.len(), own, seconds));
                        // This sequence's rows, whichever of them its check reads.
                        let (rows, after) = rest.split_at((1 + drafted.len()) * vocab_size);
                        rest = after;
                        let rows = rows.chunks_exact(vocab_size);
                        let checked = self
                            .check_draft(s, drafted, rows, &mut |piece: &str| on_text(*i, piece));
                        if let Err(e) = checked {
                            results[*i] = Err(e);
                        }
                    }
                }
                Err(e) => {
                    for &(i, ..) in &running {
                        results[i] = Err(GenerateError::Backend(e.to_string()));
                    }
                }
            }
        }
        for (s, result) in sequences.iter_mut().zip(&mut results) {
            if let Err(_) | Ok(Some(_)) = result {
                continue;
            }
            *result = Ok(s.stop_reason);
        }
        results
    }

    /// Takes a running sequence's logits after its step: `rows`, the logits of its token and
    /// of each `drafted` one after it. Picks from each row in turn as a step would, keeping
    /// each drafted token while it is the pick; the first pick that is not is kept for the
    /// next step ([`Sequence::pending`]), and the cache forgets the positions past what was
    /// kept, as if only those tokens had been run.
    fn check_draft<'r>(
        &self,
        s: &mut Sequence<'_, B>,
        drafted: &[u32],
        mut rows: impl Iterator<Item = &'r [f32]>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<(), GenerateError> {
        let row = rows.next().expect("a row for the sequence's token");
        // Into the sequence's buffer: no allocation per token.
        s.logits.clear();
        s.logits.extend_from_slice(row);
        if drafted.is_empty() {
            return Ok(());
        }
        // Where the sequence's own token went; then the drafted tokens'.
        let first = s.cache.len() - drafted.len() - 1;
        let fed = s.history.len();
        let mut run = 1;
        let mut accepted = 0;
        for (&token, row) in drafted.iter().zip(rows) {
            let picked = s.picker().pick()?;
            if picked.next != token {
                s.pending = Some(picked);
                break;
            }
            accepted += 1;
            if self.finish_step(s, Some(picked), on_text)?.is_none() {
                break;
            }
            run += 1;
            s.logits.clear();
            s.logits.extend_from_slice(row);
        }
        s.cache.truncate(first + run);
        s.drafts_checked(fed, drafted.len(), accepted);
        Ok(())
    }

    /// Runs `ids[b]` after what `caches[b]` holds, for every `b`, a batch at a time
    /// ([`KernelBackend::DECODE_BATCH`] sequences in one pass over the weights), and returns
    /// the logits, `vocab_size` per sequence in order: each, bit for bit, what decoding that
    /// sequence alone gives.
    pub fn decode_each(
        &self,
        ids: &[u32],
        caches: &mut [&mut KvCache<B>],
    ) -> Result<Vec<f32>, GenerateError> {
        assert_eq!(ids.len(), caches.len(), "decode_each: one id per cache");
        self.decode_rows(ids, caches, &vec![1; ids.len()])
    }

    /// [`Self::decode_each`] for `rows[b]` consecutive tokens after `caches[b]` (`ids` holds
    /// each sequence's in order): `vocab_size` logits per token, each, bit for bit, what
    /// decoding the tokens one at a time gives ([`Llama::decode_rows`]). The sequences go
    /// through in passes of at most [`KernelBackend::DECODE_BATCH`] rows (a sequence with
    /// more, alone), the rows a pass of the matrix-vector kernels takes: more would send
    /// the lm_head's product through another kernel, which sums in another order.
    pub fn decode_rows(
        &self,
        ids: &[u32],
        caches: &mut [&mut KvCache<B>],
        rows: &[usize],
    ) -> Result<Vec<f32>, GenerateError> {
        assert_eq!(
            caches.len(),
            rows.len(),
            "decode_rows: a row count per cache"
        );
        assert_eq!(
            ids.len(),
            rows.iter().sum::<usize>(),
            "decode_rows: an id per row"
        );
        self.check_ids(ids)?;
        let vocab_size = self.config.vocab_size;
        let mut out = Vec::with_capacity(ids.len() * vocab_size);
        let (mut ids, mut caches, mut rows) = (ids, caches, rows);
        while !rows.is_empty() {
            // The most sequences whose rows fit one pass, at least one.
            let mut total = 0;
            let count = (rows.iter())
                .take_while(|&&r| {
                    total += r;
                    total <= B::DECODE_BATCH
                })
                .count()
                .max(1);
            let (pass_caches, rest_caches) = std::mem::take(&mut caches).split_at_mut(count);
            let (pass_rows, rest_rows) = rows.split_at(count);
            let (pass_ids, rest_ids) = ids.split_at(pass_rows.iter().sum());
            (caches, rows, ids) = (rest_caches, rest_rows, rest_ids);
            let tokens = self.id_tensor(pass_ids, [pass_ids.len(), 1]);
            let logits = self
                .model
                .decode_rows(tokens, pass_caches, pass_rows, self.matmul)?
                .into_data();
            out.extend(
                logits
                    .into_vec::<f32>()
                    .map_err(|e| GenerateError::Backend(format!("cannot read logits: {e:?}")))?,
            );
        }
        Ok(out)
    }

    /// `ids` as the model takes them, shaped `shape`: `[1, n]` for a run of positions of
    /// one sequence, `[n, 1]` for rows ([`Llama::decode_rows`]).
    fn id_tensor(&self, ids: &[u32], shape: [usize; 2]) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        Tensor::from_data(TensorData::new(ids, shape), &self.device)
    }

    /// Fails unless every id is inside the vocabulary: an id past the embedding would index
    /// out of its bounds inside the backend.
    fn check_ids(&self, ids: &[u32]) -> Result<(), GenerateError> {
        let vocab_size = self.config.vocab_size;
        match ids.iter().find(|&&id| id as usize >= vocab_size) {
            Some(&id) => Err(GenerateError::TokenOutOfRange { id, vocab_size }),
            None => Ok(()),
        }
    }

    /// What follows a sequence's pick: the token taken (or the sequence stopped), its text
    /// streamed. `picked` is `None` when the sequence was not [`Sequence::ready`] to pick.
    fn finish_step(
        &self,
        s: &mut Sequence<'_, B>,
        picked: Option<Picked>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Option<u32>, GenerateError> {
        let reason = 'step: {
            let Some(Picked { next, raw }) = picked else {
                if s.stop_reason.is_some() {
                    return Ok(None);
                }
                break 'step StopReason::Length;
            };
            if s.tokens.is_empty() {
                // The first token's time belongs to the prompt: it waits on the prefill.
                s.prefill = s.started.elapsed();
                s.decode_started = Instant::now();
            }
            if self.eos_ids.contains(&next) {
                break 'step StopReason::Eos;
            }
            if let Some(constraint) = &mut s.constraint {
                constraint.consume(next)?;
            }
            if let (Some(raw), Some(top)) = (raw, s.logprobs_top) {
                s.logprobs.push(logprobs(&raw, next, top));
            }
            s.tokens.push(next);
            s.history.push(next);
            if let Some(piece) = s.stream.push(next)?
                && s.text.push(&piece, on_text)
            {
                break 'step StopReason::Stop;
            }
            if s.tokens.len() == s.max_new_tokens || s.cache.len() == s.capacity {
                break 'step StopReason::Length;
            }
            return Ok(Some(next));
        };
        s.decode = s.decode_started.elapsed();
        s.stop_reason = Some(reason);
        Ok(None)
    }
}

/// How many leading ids `a` and `b` share: what [`Generator::start_from`] can reuse of a
/// cache holding `a` for the prompt `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// Which positions of a chunk of tokens logits are computed for.
#[derive(Debug, Clone, Copy)]
enum WantedLogits {
    None,
    Last,
    All,
}
