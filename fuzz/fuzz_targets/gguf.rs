//! GGUF header parsing, tensor decoding and the q/k row un-permutation, as `import-gguf`
//! runs them, on arbitrary bytes: errors are fine, panics and unbounded allocations are not.
#![no_main]

use converter::gguf::{self, Value};
use converter::import::unpermute_rows;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((metadata, tensors)) = gguf::parse(data) else {
        return;
    };
    let heads = metadata
        .get("llama.attention.head_count")
        .and_then(Value::as_u64)
        .unwrap_or(1) as usize;
    for info in &tensors {
        if let Ok(values) = gguf::read_tensor(data, info) {
            let _ = unpermute_rows(&values, &info.shape(), heads);
        }
    }
});
