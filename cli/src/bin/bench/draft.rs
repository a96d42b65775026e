//! `bench --draft ngram`: speculative decoding's speed against plain decoding, and against
//! llama.cpp's prompt-lookup decoding (`--gguf`, scripts/llamacpp_lookup.py). Three chat
//! requests, each answered greedily: one whose answer copies its prompt with a change, one
//! that edits code, one open question (where drafts are mostly wrong, and drafting should
//! cost nearly nothing). Each is decoded plain and drafted in the same child process, and the
//! drafted tokens are checked to be the plain ones (speculation changes no token).

use anyhow::{Result, bail};
use runtime::generate::GenerateOptions;
use runtime::generate::sampling::SamplingParams;
use runtime::model::backend::KernelBackend;
use runtime::text::tokenizer::Tokenizer;
use runtime::weights::file::WeightsMemory;
use serde::{Deserialize, Serialize};

use super::{Cli, Engine, alternate, child, llama_cpp, median};

/// Most tokens an answer may have.
const MAX_TOKENS: usize = 256;

/// The requests: (name, the user's message).
const TASKS: [(&str, &str); 3] = [
    (
        "copy",
        "Rewrite the following paragraph, replacing every \"cat\" with \"dog\" and changing \
         nothing else:\n\nMy neighbour has a cat called Pepper. Every morning the cat sits \
         on the wall between our gardens and watches the birds in the old apple tree. When \
         it rains, the cat hides under the bench by the back door, and when the sun comes \
         out again the cat stretches on the warm stones of the path. In the evening my \
         neighbour calls the cat in for dinner, and the cat walks slowly home as if it had \
         all the time in the world.",
    ),
    (
        "code",
        "Rename the variable `total` to `running_sum` in this Python function, and write \
         out the whole function:\n\n```python\ndef average(values):\n    total = 0\n    \
         count = 0\n    for value in values:\n        if value is None:\n            \
         continue\n        total += value\n        count += 1\n    if count == 0:\n        \
         return 0.0\n    return total / count\n```",
    ),
    ("chat", "Tell me about the history of the Roman Empire."),
];

/// One answer's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DraftSample {
    task: String,
    /// Whether drafts were checked; llama.cpp's runs: prompt lookup.
    drafted: bool,
    tokens: usize,
    decode_tok_s: f64,
    /// Tokens drafted and kept (ours).
    #[serde(default)]
    proposed: usize,
    #[serde(default)]
    kept: usize,
    /// Whether the weights were read over the file's map (ours only).
    #[serde(default)]
    mapped: Option<bool>,
}

/// The child's run: each task's answer plain, then drafted (the same tokens, or an error).
pub fn measure<B: KernelBackend>(cli: &Cli, kind: &str) -> Result<Vec<DraftSample>> {
    let mut generator = super::load::<B>(cli)?;
    cli::set_draft(
        &mut generator,
        kind,
        cli.draft_weights,
        WeightsMemory::from_flags(cli.mmap, cli.no_mmap),
    )?;
    let draft = generator.draft.take().expect("set_draft sets a drafter");
    let tokenizer = Tokenizer::from_dir(&cli.artifacts)?;
    let options = GenerateOptions {
        max_new_tokens: MAX_TOKENS,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: Vec::new(),
        grammar: None,
    };
    let mut samples = Vec::new();
    for (task, message) in TASKS {
        let prompt = tokenizer.encode_chat(None, message)?;
        let mut plain_tokens = None;
        for drafted in [false, true] {
            let mut sequence = generator.admit(&tokenizer, None, &prompt, options.clone())?;
            if drafted {
                sequence.start_drafting(draft);
            }
            // A draft model runs the prompt with the model, as a server's sequence does.
            generator.prefill(&mut sequence, usize::MAX)?;
            while generator.step(&mut sequence, &mut |_| {})?.is_none() {}
            let (proposed, kept) = sequence.drafted();
            let tokens = sequence.tokens().to_vec();
            let generation = sequence.finish(&mut |_| {});
            match &plain_tokens {
                None => plain_tokens = Some(tokens),
                Some(plain) if *plain != tokens => {
                    bail!("{task}: the drafted answer's tokens are not the plain answer's")
                }
                Some(_) => {}
            }
            samples.push(DraftSample {
                task: task.to_string(),
                drafted,
                tokens: generation.tokens.len(),
                decode_tok_s: generation.timings.decode_tokens_per_s,
                proposed,
                kept,
                mapped: Some(generator.kept.mapped),
            });
        }
    }
    Ok(samples)
}

/// The parent: ours and llama.cpp's (plain and prompt lookup), run by run in turn, then a
/// table of medians and a JSON line per row. The speedup is the median of each run's
/// drafted over plain, not the ratio of the two medians.
pub fn parent(cli: &Cli, draft: &str, threads: usize) -> Result<()> {
    let engines: Vec<Engine> = std::iter::once(Engine::Ours("flex".into()))
        .chain(cli.gguf.iter().map(Engine::LlamaCpp))
        .collect();
    // The prompts as token ids (a JSON list), for llama.cpp.
    let tokenizer = Tokenizer::from_dir(&cli.artifacts)?;
    let prompts = (TASKS.iter())
        .map(|(task, message)| {
            Ok((
                *task,
                serde_json::to_string(&tokenizer.encode_chat(None, message)?)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let samples = alternate(
        cli.runs,
        &engines,
        |engine| engine,
        |engine| match engine {
            Engine::Ours(_) => child::<Vec<DraftSample>>(
                cli,
                "flex",
                threads,
                &[
                    "--draft".to_string(),
                    draft.to_string(),
                    "--draft-weights".to_string(),
                    cli.draft_weights.to_string(),
                ],
            ),
            Engine::LlamaCpp(gguf) => {
                let mut samples = Vec::new();
                for (task, ids) in &prompts {
                    for mode in ["plain", "lookup"] {
                        let args = [
                            threads.to_string(),
                            MAX_TOKENS.to_string(),
                            ids.clone(),
                            mode.to_string(),
                        ];
                        let run: LookupRun = llama_cpp(cli, "llamacpp_lookup.py", gguf, &args)?;
                        samples.push(DraftSample {
                            task: task.to_string(),
                            drafted: mode == "lookup",
                            tokens: run.tokens,
                            decode_tok_s: run.decode_tok_s,
                            proposed: 0,
                            kept: 0,
                            mapped: None,
                        });
                    }
                }
                Ok(samples)
            }
        },
    )?;
    println!(
        "| engine | task | tokens | plain tok/s | drafted tok/s | speedup | drafted tokens kept |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut json_lines = Vec::new();
    for (engine, samples) in engines.iter().zip(&samples) {
        let name = engine.name();
        let samples = match samples {
            Ok(samples) => samples,
            Err(e) => {
                println!("| {name} | {e} | | | | | |");
                continue;
            }
        };
        for (task, _) in TASKS {
            let runs = |drafted: bool| {
                samples
                    .iter()
                    .filter(move |s| s.task == task && s.drafted == drafted)
            };
            let speed = |drafted| median(runs(drafted).map(|s| s.decode_tok_s).collect());
            let (plain, drafted) = (speed(false), speed(true));
            // Each run's drafted answer over its own plain one, decoded just before it in
            // the same process: a shared host's load drifts between runs far more than
            // within one (docs/BENCHMARKS.md, session 35).
            let speedup = median(
                (runs(false).zip(runs(true)))
                    .map(|(plain, drafted)| drafted.decode_tok_s / plain.decode_tok_s)
                    .collect(),
            );
            let tokens = runs(true).map(|s| s.tokens).max().unwrap_or(0);
            let (proposed, kept) =
                runs(true).fold((0, 0), |(p, k), s| (p + s.proposed, k + s.kept));
            let kept_cell = match engine {
                Engine::Ours(_) => format!("{kept} of {proposed}"),
                Engine::LlamaCpp(_) => "-".to_string(),
            };
            println!(
                "| {name} | {task} | {tokens} | {plain:.1} | {drafted:.1} | {speedup:.2}x | {kept_cell} |"
            );
            json_lines.push(serde_json::json!({
                "engine": name, "kind": engine.kind(), "task": task, "threads": threads,
                "runs": cli.runs, "tokens": tokens, "plain_tok_s": plain,
                "drafted_tok_s": drafted, "speedup": speedup, "draft": draft,
                "proposed": proposed, "kept": kept,
                "weights": cli.weights.to_string(), "matmul": cli.matmul.to_string(),
                "mmap": samples.first().and_then(|s| s.mapped),
            }));
        }
    }
    for line in json_lines {
        println!("{line}");
    }
    Ok(())
}

/// One scripts/llamacpp_lookup.py run.
#[derive(Deserialize)]
struct LookupRun {
    tokens: usize,
    decode_tok_s: f64,
}
