//! A chat template as the runtime renders it (fuel, recursion and output limits), over a
//! tiny tokenizer: any template must render or fail with an error, within bounded time and
//! memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::text::tokenizer::Tokenizer;

const TOKENIZER: &str = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
 "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
 "decoder": null, "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hi": 1}, "unk_token": "<unk>"}}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(template) = std::str::from_utf8(data) else {
        return;
    };
    let config = serde_json::json!({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"});
    let Ok(tokenizer) = Tokenizer::from_json(TOKENIZER.as_bytes(), Some(&config.to_string())) else {
        return;
    };
    let _ = tokenizer.render_chat(Some("system text"), "user text");
});
