//! tokenizer.json as the runtime loads it, then encoding and decoding a text that touches
//! the usual traps (digits, CJK, emoji, whitespace runs, a special token): a tokenizer file
//! from an artifact must give errors, never a panic or unbounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::text::tokenizer::Tokenizer;

const TEXT: &str = "Hello, world! 12345 日本語 🦀 \n\n  tabs\there <|im_start|>user aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!";

fuzz_target!(|data: &[u8]| {
    if let Ok(tokenizer) = Tokenizer::from_json(data, None) {
        if let Ok(ids) = tokenizer.encode(TEXT) {
            let _ = tokenizer.decode(&ids);
        }
        let _ = tokenizer.max_id();
        let _ = tokenizer.max_token_bytes();
    }
});
