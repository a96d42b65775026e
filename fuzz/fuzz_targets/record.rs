//! model.mpk as the runtime reads it: `Record::open` parses any bytes into a record or one
//! error, and every parameter a tiny model has can be asked for without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::weights::record::Record;

fuzz_target!(|data: &[u8]| {
    // The reader maps a file: each input is written to one, per process.
    let path = std::env::temp_dir().join(format!("record-fuzz-{}.mpk", std::process::id()));
    std::fs::write(&path, data).expect("a writable temp dir");
    if let Ok(record) = Record::open(&path) {
        for name in [
            "embed_tokens.weight",
            "layers.0.self_attn.q_proj.weight",
            "layers.1.mlp.down_proj.bias",
            "norm.gamma",
            "lm_head.weight",
        ] {
            if let Ok(param) = record.param(name) {
                assert_eq!(param.bytes.len(), 4 * param.shape.iter().product::<usize>());
                record.release(&param);
            }
        }
    }
});
