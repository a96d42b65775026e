//! Minimal runtime for Llama-family models converted to Burn records by `converter`.
//!
//! Data flows one way: Hugging Face checkpoint → `converter` → artifact directory
//! ([`artifact`]) → [`generate::Generator`], which runs [`model::Llama`].

pub mod artifact;
pub mod cache;
pub mod config;
pub mod generate;
pub mod kernels;
pub mod model;
pub mod params;
pub mod sampling;
pub mod tokenizer;

/// The default CPU backend: burn-flex (gemm-based), 8-10x faster than ndarray at decode.
pub type FlexBackend = burn_flex::Flex<f32>;
/// The legacy CPU backend, kept selectable for comparison.
pub type NdArrayBackend = burn_ndarray::NdArray<f32>;

/// The CPU backends a command line can choose from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// burn-flex: gemm-based, the fast one.
    Flex,
    /// burn-ndarray: the legacy backend.
    Ndarray,
}

impl BackendKind {
    /// The name the command line uses (`flex`, `ndarray`).
    pub fn name(self) -> String {
        use clap::ValueEnum;
        let value = self.to_possible_value().expect("no variant is skipped");
        value.get_name().to_string()
    }
}

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
/// on free, so every layer pays page faults and page zeroing for the same sizes again; in a
/// 512-token prefill that was a fifth of the time. Keeping the memory costs nothing extra in
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
