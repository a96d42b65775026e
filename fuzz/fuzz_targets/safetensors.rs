//! A safetensors file as `convert` reads it: header, then every tensor widened to f32.
#![no_main]

use converter::checkpoint::{decode_f32, read_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tensors) = read_header(data, 0) else {
        return;
    };
    for (name, meta) in &tensors {
        let _ = decode_f32(name, meta, data);
    }
});
