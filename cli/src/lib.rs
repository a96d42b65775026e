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
pub mod logprobs;
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

/// Runs `work`, and if it takes more than a second, shows `message` with a spinner and the
/// time so far on stderr until it ends (only on a terminal: nothing in logs or pipes). For
/// loads, whose length the library does not report as it goes.
pub fn with_spinner<T>(message: &str, work: impl FnOnce() -> T) -> T {
    use std::io::IsTerminal;
    use std::sync::mpsc;
    use std::time::Duration;

    if !std::io::stderr().is_terminal() {
        return work();
    }
    let (done, finished) = mpsc::channel::<()>();
    let message = message.to_string();
    let shown = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(1)) != Err(mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let spinner = indicatif::ProgressBar::new_spinner()
            .with_message(message)
            .with_elapsed(Duration::from_secs(1));
        spinner.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .expect("a valid template"),
        );
        spinner.enable_steady_tick(Duration::from_millis(100));
        let _ = finished.recv();
        spinner.finish_and_clear();
    });
    let result = work();
    let _ = done.send(());
    let _ = shown.join();
    result
}
