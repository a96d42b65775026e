//! Minimal runtime for Llama-family models converted to Burn records by `converter`.
//!
//! Data flows one way: Hugging Face checkpoint → `converter` → artifact directory
//! ([`weights::artifact`]) → [`generate::Generator`], which runs [`model::llama::Llama`].
//! The crate is in layers, each a folder that uses only the ones before it:
//! - [`util`]: reading files within limits, the artifact's file names, panics as errors.
//! - [`text`]: tokenizer, chat templates, grammars, tool calls, reasoning; no Burn type.
//! - [`model`]: config.json, the Burn module and its backends over the `kernels` crate,
//!   the KV cache.
//! - [`weights`]: the artifact's manifest, the record, the weights file, loading.
//! - [`generate`]: the generator, its sequences, sampling, scoring.
//!
//! Generating text from a converted model:
//!
//! ```no_run
//! use std::path::Path;
//! use runtime::generate::{GenerateOptions, Generator};
//! use runtime::{FlexBackend, generate::sampling::SamplingParams, text::tokenizer::Tokenizer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = Path::new("artifacts/smollm2-135m-instruct");
//! let generator = Generator::<FlexBackend>::load(dir, &Default::default())?;
//! let tokenizer = Tokenizer::from_dir(dir)?;
//! let prompt = tokenizer.encode("The capital of France is")?;
//! let options = GenerateOptions {
//!     max_new_tokens: 20,
//!     sampling: SamplingParams::default(), // greedy; set `temperature` to sample
//!     stop: Vec::new(),
//!     grammar: None,
//! };
//! // Inside the thread pool the kernels use (see `in_thread_pool`).
//! let generation = runtime::in_thread_pool(None, || {
//!     generator.generate(&tokenizer, &prompt, &options, |text| print!("{text}"))
//! })??;
//! println!("\n{} tokens, {:?}", generation.tokens.len(), generation.stop_reason);
//! # Ok(())
//! # }
//! ```
//!
//! `runtime/examples/generate.rs` is this as a program.

// Layers, lowest first: each uses only those before it (docs/ARCHITECTURE.md; checked by
// scripts/check_layers.py). The kernels are a crate of their own, below them all.
/// Files within limits, the artifact's file names, panics as errors.
pub mod util;
/// Tokenizer, chat templates, grammars, tool calls, reasoning: text as token ids.
pub mod text;
/// config.json, the Burn module, its backends over the kernels, the KV cache.
pub mod model;
/// The manifest, the record, the weights file, loading a model.
pub mod weights;
/// The generator, its sequences, sampling, scoring.
pub mod generate;

/// The default CPU backend: burn-flex (gemm-based), with this crate's fused kernels.
pub type FlexBackend = burn_flex::Flex<f32>;
/// The legacy CPU backend, kept selectable for comparison.
pub type NdArrayBackend = burn_ndarray::NdArray<f32>;

/// Runs `work` on a worker of a pool of `threads` threads (default: one per core), the
/// pool that both backends' parallel kernels and the model's split projections then use.
///
/// Running the model *inside* the pool matters: a parallel operation started from a thread
/// outside it hands its job over and sleeps until the pool is done, two context switches per
/// operation, hundreds of times per decoded token. From a worker it is a cheap fork-join.
pub fn in_thread_pool<R: Send>(
    threads: Option<usize>,
    work: impl FnOnce() -> R + Send,
) -> Result<R, rayon::ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()?;
    Ok(pool.install(work))
}

/// Tells glibc's allocator to keep freed memory instead of returning it to the kernel.
///
/// A forward pass allocates and frees multi-megabyte temporaries (attention scores,
/// activations) in every layer. By default glibc serves each from a fresh `mmap` and unmaps it
/// on free, so every layer pays page faults and page zeroing for the same sizes again, a
/// large share of a long prefill's time (docs/BENCHMARKS.md). Keeping the memory costs nothing extra in
/// peak RSS: the same sizes are reused. Call it first thing in `main`. A no-op off glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; called before other threads start.
    unsafe {
        // Serve blocks up to 32 MiB (glibc's cap) from the heap, where freed memory is
        // reused; the per-layer temporaries are at most ~10 MB. Never trim the heap's top.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
