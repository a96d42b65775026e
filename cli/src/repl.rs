//! `runtime chat`: a conversation in the terminal. Each turn renders the whole conversation
//! with the model's chat template and starts from the previous turn's KV cache, so only the
//! new messages are prefilled. Ctrl-C stops the answer being written (what was written stays
//! in the conversation); `/reset` starts a new conversation; `/exit` or end of input quits.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use runtime::generate::{GenerateOptions, Generator};
use runtime::model::backend::KernelBackend;
use runtime::model::cache::KvCache;
use runtime::text::chat::{Message, render_in_child};
use runtime::text::tokenizer::{ContentSpecials, Tokenizer};

/// Runs the conversation on stdin and stdout until `/exit` or end of input.
pub fn run<B: KernelBackend>(
    generator: &Generator<B>,
    tokenizer: &Tokenizer,
    system: Option<&str>,
    options: GenerateOptions,
    specials: ContentSpecials,
) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let interrupted = interrupted.clone();
        ctrlc::set_handler(move || interrupted.store(true, Ordering::Relaxed))
            .context("cannot handle Ctrl-C")?;
    }
    let start = || -> Vec<Message> {
        system
            .map(|s| Message::new("system", s))
            .into_iter()
            .collect()
    };
    let mut messages = start();
    let context = generator.config.max_position_embeddings;
    // A cache for the whole context, kept across turns (its pages fill as it is used).
    let mut kept: Option<(KvCache<B>, Vec<u32>)> = None;
    eprintln!("Ctrl-C stops an answer; /reset starts over; /exit or Ctrl-D quits.");
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout();
    loop {
        write!(stdout, "> ")?;
        stdout.flush()?;
        let mut line = String::new();
        if stdin.read_line(&mut line)? == 0 {
            writeln!(stdout)?;
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" => return Ok(()),
            "/reset" => {
                messages = start();
                eprintln!("(new conversation)");
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", line));
        // In a child process, as `--chat` renders: the template comes with the model.
        let prompt = tokenizer
            .encode_messages(messages.clone(), &render_in_child, specials)
            .map_err(anyhow::Error::from);
        let prompt = match prompt {
            Ok(prompt) => prompt,
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
                continue;
            }
        };
        let reuse = kept
            .take()
            .or_else(|| generator.new_cache(context).ok().map(|c| (c, Vec::new())));
        let mut sequence = match generator.start_from(tokenizer, reuse, &prompt, options.clone()) {
            Ok(sequence) => sequence,
            Err(e) => {
                eprintln!("error: {e} (/reset starts a new conversation)");
                messages.pop();
                continue;
            }
        };
        interrupted.store(false, Ordering::Relaxed);
        let mut show = |piece: &str| {
            let _ = stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush());
        };
        let mut failed = None;
        while !interrupted.load(Ordering::Relaxed) {
            match generator.step(&mut sequence, &mut show) {
                Ok(None) => {}
                Ok(Some(_)) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let (answer, cache) = sequence.finish_keeping_cache(&mut show);
        writeln!(stdout)?;
        if let Some(e) = failed {
            eprintln!("error: {e}");
        } else if interrupted.load(Ordering::Relaxed) {
            eprintln!("(stopped)");
        }
        kept = Some(cache);
        messages.push(Message::new("assistant", answer.text));
    }
}
