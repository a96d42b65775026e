//! Loads a converted model and generates text: the runtime embedded in a program.
//!
//! `cargo run --release -p runtime --example generate -- ARTIFACT_DIR ["PROMPT"]`

use std::path::PathBuf;

use runtime::generate::{GenerateOptions, Generator};
use runtime::{FlexBackend, generate::sampling::SamplingParams, text::tokenizer::Tokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: generate ARTIFACT_DIR [PROMPT]")?);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The capital of France is".into());

    let generator = Generator::<FlexBackend>::load(&dir, &Default::default())?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let prompt = tokenizer.encode(&prompt)?;
    let options = GenerateOptions {
        max_new_tokens: 40,
        sampling: SamplingParams::default(), // greedy; set `temperature` to sample
        stop: Vec::new(),
        grammar: None,
    };
    // The model runs inside the thread pool its kernels use.
    let generation = runtime::in_thread_pool(None, || {
        generator.generate(&tokenizer, &prompt, &options, |text| print!("{text}"))
    })??;
    println!();
    eprintln!(
        "{} tokens, {:.1} tok/s, stop: {:?}",
        generation.tokens.len(),
        generation.timings.decode_tokens_per_s,
        generation.stop_reason
    );
    Ok(())
}
