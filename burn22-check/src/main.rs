//! An artifact's model.bpk in a Burn 0.22 program: a small Llama written with Burn 0.22's
//! modules, its weights loaded with burn-store's `BurnpackStore` (every tensor of the file
//! into a parameter of the same path and shape, nothing missing and nothing left over),
//! then greedy decoding. `check.sh` compares the tokens with the runtime's.
//!
//! Usage: burn22-check ARTIFACT_DIR PROMPT MAX_NEW_TOKENS
//! Prints `{"tokens": [...]}` (the generated ids) on stdout, the text on stderr.

mod llama;

use std::path::Path;
use std::process::ExitCode;

use burn::prelude::*;
use burn::store::{BurnpackStore, ModuleSnapshot};
use burn::tensor::DType;

use crate::llama::{Config, Llama};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, prompt, max_new] = args.as_slice() else {
        return Err("usage: burn22-check ARTIFACT_DIR PROMPT MAX_NEW_TOKENS".into());
    };
    let dir = Path::new(dir);
    let max_new: usize = (max_new.parse()).map_err(|e| format!("MAX_NEW_TOKENS: {e}"))?;
    let config = Config::read(&dir.join("config.json"))?;
    let device = Device::flex();
    let mut model = Llama::new(&config, &device);

    let mut store = BurnpackStore::from_file(dir.join("model.bpk"));
    let loaded = model
        .load_from(&mut store)
        .map_err(|e| format!("model.bpk: {e}"))?;
    if !loaded.unused.is_empty() {
        return Err(format!(
            "model.bpk: tensors the model has no place for: {:?}",
            loaded.unused
        ));
    }
    // Names and shapes are checked by the store (a missing tensor or a wrong shape is an
    // error); every parameter must also be f32, as the record is.
    for tensor in model.collect(None, None, false) {
        if tensor.dtype != DType::F32 {
            return Err(format!("{} is {:?}, not F32", tensor.name, tensor.dtype));
        }
    }
    eprintln!("loaded {} tensors from model.bpk", loaded.applied.len());

    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| format!("tokenizer.json: {e}"))?;
    // As the runtime encodes a plain prompt: with the post-processor's special tokens.
    let ids = tokenizer
        .encode(prompt.as_str(), true)
        .map_err(|e| e.to_string())?;
    let tokens = model.generate(&config, ids.get_ids(), max_new, &device);
    let text = tokenizer
        .decode(&tokens, false)
        .map_err(|e| e.to_string())?;
    eprintln!("{prompt}{text}");
    println!("{}", serde_json::json!({ "tokens": tokens }));
    Ok(())
}
