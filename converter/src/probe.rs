//! The manifest's tokenizer probe: token ids of a fixed text that touches the tricky parts
//! (digits split one by one, CJK, emoji, code, a special token), so a changed tokenizer
//! changes the manifest.

use std::path::Path;

use anyhow::{Result, anyhow};
use runtime::artifact::Probe;
use tokenizers::Tokenizer;

pub const PROBE_TEXT: &str =
    "Hello, world! 12345 日本語 🦀 fn main() { println!(\"hi\"); } <|im_start|>user";

/// Tokenizes [`PROBE_TEXT`] with `tokenizer.json`.
pub fn probe(tokenizer_json: &Path) -> Result<Probe> {
    probe_with_text(tokenizer_json, PROBE_TEXT)
}

/// Tokenizes `text` with `tokenizer.json`, adding no special tokens.
pub fn probe_with_text(tokenizer_json: &Path, text: &str) -> Result<Probe> {
    let tokenizer = Tokenizer::from_file(tokenizer_json)
        .map_err(|e| anyhow!("{}: invalid tokenizer: {e}", tokenizer_json.display()))?;
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| anyhow!("{}: cannot tokenize: {e}", tokenizer_json.display()))?;
    Ok(Probe {
        text: text.to_string(),
        token_ids: encoding.get_ids().to_vec(),
    })
}
