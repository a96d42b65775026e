//! What the tests of the real model share.

use std::path::PathBuf;

/// The converted SmolLM2-135M-Instruct (`just fetch convert`), if it is there; without it
/// the test is skipped, unless `REQUIRE_MODEL` is set (`just test` sets it): then that is a
/// failure.
pub fn artifact_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/smollm2-135m-instruct");
    if dir.join("model.mpk").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("REQUIRE_MODEL").is_none(),
        "{} has no model.mpk: run `just fetch convert`",
        dir.display()
    );
    eprintln!(
        "skipped: no converted model in {} (run `just fetch convert`)",
        dir.display()
    );
    None
}
