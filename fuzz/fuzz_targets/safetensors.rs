//! A safetensors file as `convert` reads it: header, then every tensor widened to f32; and
//! as a blocks.safetensors (`converter::blocks::read_header`: each tensor's ggml type from
//! the metadata, rows of whole blocks), every tensor's blocks scanned for bad scales.
#![no_main]

use converter::checkpoint::{read_header, write_tensor};
use converter::names::Transform;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = converter::blocks::read_header(data) {
        for tensor in tensors.values() {
            let range = tensor.range().expect("read from the file");
            let _ = tensor.ty.first_bad_scale(&data[range]);
        }
    }
    let Ok(tensors) = read_header(data, 0) else {
        return;
    };
    for (name, meta) in &tensors {
        for transform in [Transform::Keep, Transform::Transpose, Transform::AddOne] {
            let _ = write_tensor(name, meta, data, transform, 1 << 10, &mut std::io::sink());
        }
    }
});
