//! `converter`: Hugging Face checkpoints (or a GGUF) → Burn record artifacts for `runtime`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::{Parser, Subcommand};
use converter::{convert, import, verify};

#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Import a llama.cpp GGUF file as a Hugging Face checkpoint (model.safetensors,
    /// config.json, tokenizer.json, tokenizer_config.json, generation_config.json): bf16,
    /// or, when projections are Q8_0, Q4_0, Q5_0, Q4_K or Q6_K, f32 with those blocks
    /// beside it in blocks.safetensors, which `convert` keeps in weights.bin.
    ImportGguf {
        /// The .gguf file (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K tensors).
        gguf: PathBuf,
        /// The checkpoint directory to write (replaced as a whole).
        out_dir: PathBuf,
    },
    /// Convert a Hugging Face Llama checkpoint, or a GGUF, into a Burn record artifact
    /// (model.mpk, weights.bin, config and tokenizer files, manifest.json).
    Convert {
        /// Directory with config.json, tokenizer.json and model.safetensors (or shards); or
        /// a .gguf file, converted in one step: the artifact `import-gguf` then `convert`
        /// give, file for file, with no checkpoint written.
        hf_dir: PathBuf,
        /// The artifact directory to write.
        out_dir: PathBuf,
        /// Also write model.bpk: the record's parameters (the same paths, f32 values) in
        /// Burn's burnpack format, which Burn 0.22 loads (it cannot read model.mpk).
        #[arg(long)]
        burnpack: bool,
    },
    /// Internal: render a chat template request from stdin (see `runtime::text::chat`).
    #[command(hide = true)]
    RenderChat,
    /// Recompute an artifact's checksums and tokenizer probe and compare them with its
    /// manifest.json; names every file that differs.
    Verify {
        /// The artifact directory.
        out_dir: PathBuf,
        /// Also check the checkpoint files the artifact was converted from (a directory, or
        /// the .gguf a one-step conversion read).
        #[arg(long)]
        source: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let started = Instant::now();
    match cli.command {
        Command::RenderChat => runtime::text::chat::serve()?,
        Command::ImportGguf { gguf, out_dir } => {
            import::import_gguf(&gguf, &out_dir)?;
            eprintln!(
                "imported {} into {} in {:.1} s",
                gguf.display(),
                out_dir.display(),
                started.elapsed().as_secs_f64()
            );
        }
        Command::Convert {
            hf_dir,
            out_dir,
            burnpack,
        } => {
            let render = &runtime::text::chat::render_in_child;
            let options = convert::Options { burnpack };
            let manifest = convert::convert_with(&hf_dir, &out_dir, render, options)?;
            let bytes: u64 = manifest.files.iter().map(|f| f.bytes).sum();
            eprintln!(
                "converted {} into {} ({} files, {:.1} MB) in {:.1} s",
                hf_dir.display(),
                out_dir.display(),
                manifest.files.len(),
                bytes as f64 / 1e6,
                started.elapsed().as_secs_f64()
            );
        }
        Command::Verify { out_dir, source } => {
            let problems = verify::verify(
                &out_dir,
                source.as_deref(),
                &runtime::text::chat::render_in_child,
            )?;
            if !problems.is_empty() {
                for problem in &problems {
                    eprintln!("mismatch: {problem}");
                }
                eprintln!("error: {} does not match its manifest", out_dir.display());
                return Ok(ExitCode::FAILURE);
            }
            eprintln!("{}: every file matches manifest.json", out_dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
