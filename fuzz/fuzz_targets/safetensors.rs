//! A safetensors file as `convert` reads it: header, then every tensor widened to f32.
#![no_main]

use converter::checkpoint::{read_header, write_tensor};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tensors) = read_header(data, 0) else {
        return;
    };
    for (name, meta) in &tensors {
        for transpose in [false, true] {
            let _ = write_tensor(name, meta, data, transpose, 1 << 10, &mut std::io::sink());
        }
    }
});
