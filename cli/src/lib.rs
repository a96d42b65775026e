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
pub mod plot;
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

/// Whether progress may be drawn: stderr is a terminal (nothing in logs or pipes).
pub fn shows_progress() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

/// A bar on stderr for `len` steps of `unit`, or bytes if `unit` is empty (hidden unless
/// [`shows_progress`]).
pub fn progress_bar(message: &str, len: u64, unit: &str) -> indicatif::ProgressBar {
    if !shows_progress() {
        return indicatif::ProgressBar::hidden();
    }
    let count = match unit {
        "" => "{bytes}/{total_bytes}".to_string(),
        unit => format!("{{pos}}/{{len}} {unit}"),
    };
    let template = format!("{{msg}} [{{bar:30}}] {count} {{elapsed}} (eta {{eta}})");
    let style = indicatif::ProgressStyle::with_template(&template)
        .expect("a valid template")
        .progress_chars("=> ");
    indicatif::ProgressBar::new(len)
        .with_style(style)
        .with_message(message.to_string())
}

/// Runs `work`, handing it a [`runtime::weights::load::Progress`] to count in; if it takes more than
/// a second, shows `message` with a bar of the weights' bytes read so far on stderr until it
/// ends (only on a terminal).
pub fn with_load_progress<T>(
    message: &str,
    work: impl FnOnce(&runtime::weights::load::Progress) -> T,
) -> T {
    use std::sync::mpsc;
    use std::time::Duration;

    let progress = std::sync::Arc::new(runtime::weights::load::Progress::default());
    if !shows_progress() {
        return work(&progress);
    }
    let (done, finished) = mpsc::channel::<()>();
    let message = message.to_string();
    let watched = progress.clone();
    let shown = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(1)) != Err(mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let bar = progress_bar(&message, watched.total(), "").with_elapsed(Duration::from_secs(1));
        while finished.recv_timeout(Duration::from_millis(100))
            == Err(mpsc::RecvTimeoutError::Timeout)
        {
            bar.set_length(watched.total());
            bar.set_position(watched.done());
        }
        bar.finish_and_clear();
    });
    let result = work(&progress);
    let _ = done.send(());
    let _ = shown.join();
    result
}

/// `--draft`: `ngram` (prompt lookup), or the artifact directory of a draft model sharing
/// the model's tokenizer, loaded with `weights` into `memory` (and the generator's cache
/// type and products), which then drafts for `generator`.
pub fn set_draft<B: runtime::model::backend::KernelBackend>(
    generator: &mut runtime::generate::Generator<B>,
    draft: &str,
    weights: runtime::weights::layout::Weights,
    memory: runtime::weights::file::WeightsMemory,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use runtime::generate::{Draft, Generator};

    if let Ok(draft) = draft.parse::<Draft>() {
        generator.draft = Some(draft);
        return Ok(());
    }
    let dir = std::path::Path::new(draft);
    anyhow::ensure!(
        dir.is_dir(),
        "--draft {draft:?} is neither ngram nor a directory holding a draft model's artifact"
    );
    let mut model = with_load_progress("loading the draft model", |progress| {
        Generator::<B>::load_watched(dir, &Default::default(), weights, memory, progress)
    })
    .with_context(|| format!("cannot load the draft model in {}", dir.display()))?;
    model.kv_dtype = generator.kv_dtype;
    model.matmul = generator.matmul;
    generator.set_draft_model(model)?;
    Ok(())
}
