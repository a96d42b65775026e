//! manifest.json: any manifest that parses must write back to text that parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::weights::manifest::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(manifest) = serde_json::from_slice::<Manifest>(data) {
        let again: Manifest = serde_json::from_str(&manifest.to_json()).expect("own output parses");
        assert_eq!(again, manifest);
    }
});
