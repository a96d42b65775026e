//! weights.bin as the runtime reads it: `WeightsFile::open` takes any bytes to a file or
//! one error (every block entry's shape, byte count and scales included); a file that
//! opens is checked against two one-layer models as loading checks it, and one that passes
//! loads with each `Weights` without a panic (blocks kept, decoded, or quantized again).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::FlexBackend;
use runtime::model::config::LlamaConfig;
use runtime::weights::layout::Weights;
use runtime::weights::load::{Source, check_laid_out, load_into};
use runtime::model::params::params;
use kernels::quant::BlockType;
use runtime::weights::file::WeightsFile;

fuzz_target!(|data: &[u8]| {
    // The reader maps a file: each input is written to one, per process.
    let path = std::env::temp_dir().join(format!("weights-fuzz-{}.bin", std::process::id()));
    std::fs::write(&path, data).expect("a writable temp dir");
    let Ok(file) = WeightsFile::open(&path) else {
        return;
    };
    let _ = file.check_record(0, "");
    // The seeds' models (fuzz/seeds/weights/): one layer each, so that a whole file (a
    // page per tensor) fits the 64 KiB inputs. tiny.bin: f32 and bf16; blocks.bin: inputs
    // of 32, projections as Q8_0, Q4_0 and Q5_0 blocks (written by the runtime's
    // `write_the_fuzz_seed`).
    let configs = [
        LlamaConfig::plain([8, 16, 1], [2, 1, 4], 10, 16),
        LlamaConfig::plain([32, 32, 1], [2, 1, 16], 10, 16),
    ];
    let device = Default::default();
    for config in configs {
        let declared = params(&config.init::<FlexBackend>(&device));
        if check_laid_out(&file, &declared, false).is_err() {
            continue;
        }
        for weights in [
            Weights::Auto,
            Weights::F32,
            Weights::Bf16,
            Weights::Blocks(BlockType::Q8_0),
            Weights::Blocks(BlockType::Q4_0),
        ] {
            let model = config.init::<FlexBackend>(&device);
            load_into(Source::LaidOut(&file), model, false, weights, &device)
                .expect("a file that passes the checks loads");
        }
    }
});
