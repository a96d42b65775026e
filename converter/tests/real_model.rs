//! The imported SmolLM2-135M-Instruct checkpoint (`just fetch`) is bit-exact: every tensor's
//! sha256 matches tests/data/checkpoint_tensors.sha256, copied from
//! ../shared/reference/checkpoint_tensors.sha256 (sha256 of each tensor's raw little-endian
//! bf16 bytes, computed by the reference's own import of the same GGUF).
//!
//! Skipped when models/ has no checkpoint; `REQUIRE_MODEL=1` (set by `just test`) makes
//! that a failure instead.

mod common;

use sha2::{Digest, Sha256};

#[test]
fn imported_checkpoint_matches_reference_checksums() {
    let dir = common::workspace_root().join("models/smollm2-135m-instruct");
    let Some(path) = common::model_file(dir.join("model.safetensors"), "just fetch") else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let reference = include_str!("data/checkpoint_tensors.sha256");
    let mut checked = 0;
    for line in reference.lines() {
        // <sha256> <name> <dtype> <shape>
        let mut fields = line.splitn(4, ' ');
        let (sha, name, dtype, shape) = (
            fields.next().unwrap(),
            fields.next().unwrap(),
            fields.next().unwrap(),
            fields.next().unwrap(),
        );
        let tensor = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("{name} missing from the import"));
        assert_eq!(dtype, "bfloat16");
        assert_eq!(format!("{:?}", tensor.dtype()), "BF16", "{name}");
        assert_eq!(format!("{:?}", tensor.shape()), shape, "{name}");
        let ours: String = Sha256::digest(tensor.data())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(ours, sha, "{name}");
        checked += 1;
    }
    assert_eq!(checked, 272);
    assert_eq!(
        st.len(),
        checked,
        "the import has tensors the reference does not list"
    );
}
