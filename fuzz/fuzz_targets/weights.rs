//! weights.bin as the runtime reads it: `WeightsFile::open` takes any bytes to a file or
//! one error; a file that opens is checked against a one-layer model as loading checks it,
//! and one that passes loads with each `Weights` without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::FlexBackend;
use runtime::config::LlamaConfig;
use runtime::load::{Source, Weights, check_laid_out, load_into};
use runtime::params::params;
use runtime::weights_file::WeightsFile;

fuzz_target!(|data: &[u8]| {
    // The reader maps a file: each input is written to one, per process.
    let path = std::env::temp_dir().join(format!("weights-fuzz-{}.bin", std::process::id()));
    std::fs::write(&path, data).expect("a writable temp dir");
    let Ok(file) = WeightsFile::open(&path) else {
        return;
    };
    let _ = file.check_record(0, "");
    // The seed's model (fuzz/seeds/weights/tiny.bin): one layer, so that a whole file
    // (a page per tensor) fits the 64 KiB inputs.
    let config = LlamaConfig::plain([8, 16, 1], [2, 1, 4], 10, 16);
    let device = Default::default();
    let declared = params(&config.init::<FlexBackend>(&device));
    if check_laid_out(&file, &declared, false).is_ok() {
        for weights in [Weights::Auto, Weights::F32, Weights::Bf16] {
            let model = config.init::<FlexBackend>(&device);
            load_into(Source::LaidOut(&file), model, false, weights, &device)
                .expect("a file that passes the checks loads");
        }
    }
});
