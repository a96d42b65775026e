//! Every ggml block type the GGUF importer decodes, against gguf-py's
//! `gguf.quants.dequantize` on 16 random blocks each (random quantized bits, random finite
//! f16 scales and minimums): the values must be the same f32 bit patterns.
//! Data: tests/data/quants, made by scripts/quant_oracle.py.

use converter::quants::{GgmlType, dequantize};

#[test]
fn every_block_type_decodes_as_gguf_py_does() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quants");
    let types = [
        (2, "Q4_0"),
        (3, "Q4_1"),
        (6, "Q5_0"),
        (7, "Q5_1"),
        (8, "Q8_0"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (12, "Q4_K"),
        (13, "Q5_K"),
        (14, "Q6_K"),
    ];
    for (id, name) in types {
        let ty = GgmlType::from_id(id).unwrap();
        assert_eq!(ty.name(), name);
        let blocks = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
        let expected: Vec<u32> = std::fs::read(dir.join(format!("{name}.f32")))
            .unwrap()
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let (per_block, block_bytes) = ty.block().unwrap();
        assert_eq!(
            blocks.len() as u64 / block_bytes * per_block,
            expected.len() as u64,
            "{name}: fixture sizes"
        );
        let ours = dequantize(ty, &blocks, expected.len()).unwrap();
        let mismatch = ours
            .iter()
            .map(|v| v.to_bits())
            .zip(&expected)
            .position(|(a, &b)| a != b);
        if let Some(i) = mismatch {
            panic!(
                "{name}: element {i} is {} where gguf-py gives {}",
                ours[i],
                f32::from_bits(expected[i])
            );
        }
    }
}
