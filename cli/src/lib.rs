//! What the command-line programs share.

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
pub mod repl;

/// `--threads` as every command line reads it (clap's value parser): a count from 1 to the
/// cores of this machine. The decode threads spin while a token runs, so more threads than
/// cores only wait for each other.
pub fn thread_count(arg: &str) -> Result<usize, String> {
    let threads: usize = arg
        .parse()
        .map_err(|_| format!("--threads {arg} is not a whole number"))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match threads {
        0 => Err("--threads 0: at least one thread is needed".into()),
        t if t > cores => Err(format!(
            "--threads {t} is more than the {cores} cores this machine has"
        )),
        t => Ok(t),
    }
}
