//! Minimal runtime for Llama-family models converted to Burn records by `converter`.
//!
//! Data flows one way: Hugging Face checkpoint → `converter` → artifact directory
//! ([`artifact`]) → [`generate::Generator`], which runs [`model::Llama`].

pub mod artifact;
pub mod cache;
pub mod config;
pub mod generate;
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

/// Sizes the worker pool that both backends' parallel kernels run on (rayon's global pool).
/// Call it once, before any tensor work.
pub fn set_threads(threads: usize) -> Result<(), rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
}
