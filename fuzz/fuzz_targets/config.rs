//! config.json as both sides read it: parse, then validate and resolve the Llama config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::model::config::{HfConfig, LlamaConfig};

fuzz_target!(|data: &[u8]| {
    if let Ok(hf) = serde_json::from_slice::<HfConfig>(data) {
        let _ = LlamaConfig::from_hf(&hf);
    }
});
