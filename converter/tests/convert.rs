//! `converter convert` and `converter import-gguf` on small inputs the tests write
//! themselves: values survive the round trip into the runtime's module, and every kind of
//! bad input fails with one clear line and leaves nothing behind.

mod common;

use burn::tensor::Tensor;
use common::*;
use runtime::FlexBackend;
use runtime::weights::artifact::load_model;
use safetensors::Dtype;

/// Shape and values; a matrix loaded as bf16 (a bf16 checkpoint's) widens exactly.
fn values_of<const D: usize>(t: Tensor<FlexBackend, D>) -> (Vec<usize>, Vec<f32>) {
    let data = t.into_data().convert::<f32>();
    (data.shape.to_vec(), data.to_vec::<f32>().unwrap())
}

fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| values[r * cols + c]))
        .collect()
}

fn roundtrip(spec: Spec) {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("hf"), tmp.path().join("out"));
    write_checkpoint(&src, spec);
    let run = converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);

    let (model, config) = load_model::<FlexBackend>(&out, &Default::default()).unwrap();
    assert_eq!(config.tie_word_embeddings, spec.tied);
    let embed = values("model.embed_tokens.weight", VOCAB * HIDDEN, spec.dtype);
    assert_eq!(
        values_of(model.embed_tokens.weight.val()),
        (vec![VOCAB, HIDDEN], embed.clone())
    );
    // A Linear weight is the checkpoint's [out, in] tensor transposed to [in, out].
    let assert_linear = |weight: Tensor<FlexBackend, 2>, hf_name: &str, out_dim, in_dim| {
        let source = values(hf_name, out_dim * in_dim, spec.dtype);
        let expected = (vec![in_dim, out_dim], transposed(&source, out_dim, in_dim));
        assert_eq!(values_of(weight), expected, "{hf_name}");
    };
    // Tied: lm_head is the embedding.
    let head_source = if spec.tied {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    assert_linear(model.lm_head.weight.val(), head_source, VOCAB, HIDDEN);
    let layer = &model.layers[1];
    let k_proj = layer.self_attn.k_proj.weight.val();
    assert_linear(
        k_proj,
        "model.layers.1.self_attn.k_proj.weight",
        HEAD_DIM,
        HIDDEN,
    );
    let down_proj = layer.mlp.down_proj.weight.val();
    assert_linear(
        down_proj,
        "model.layers.1.mlp.down_proj.weight",
        HIDDEN,
        FFN,
    );
    let gamma = values(
        "model.layers.1.post_attention_layernorm.weight",
        HIDDEN,
        spec.dtype,
    );
    assert_eq!(
        values_of(layer.post_attention_layernorm.gamma.val()).1,
        gamma
    );

    let verify = converter(&[&"verify", &out, &"--source", &src]);
    assert!(verify.success, "{}", verify.stderr);
}

#[test]
fn tied_bf16_roundtrip() {
    roundtrip(Spec {
        dtype: Dtype::BF16,
        tied: true,
        shards: 1,
    });
}

#[test]
fn untied_f16_roundtrip() {
    roundtrip(Spec {
        dtype: Dtype::F16,
        tied: false,
        shards: 1,
    });
}

#[test]
fn sharded_f32_roundtrip() {
    roundtrip(Spec {
        dtype: Dtype::F32,
        tied: false,
        shards: 3,
    });
}

#[test]
fn converting_twice_gives_identical_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("hf");
    write_checkpoint(&src, TIED_BF16);
    for out in ["a", "b"] {
        assert!(converter(&[&"convert", &src, &tmp.path().join(out)]).success);
    }
    let read = |out: &str| std::fs::read(tmp.path().join(out).join("model.mpk")).unwrap();
    assert_eq!(read("a"), read("b"));
    let manifest = |out: &str| std::fs::read(tmp.path().join(out).join("manifest.json")).unwrap();
    assert_eq!(manifest("a"), manifest("b"));
}

#[test]
fn verify_names_a_changed_file() {
    let (_tmp, _src, out) = converted_tiny();
    let mut bytes = std::fs::read(out.join("model.mpk")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(out.join("model.mpk"), bytes).unwrap();
    let run = converter(&[&"verify", &out]);
    assert!(!run.success);
    assert!(run.stderr.contains("model.mpk"), "{}", run.stderr);
    assert!(!run.stderr.contains("config.json:"), "{}", run.stderr);
}

#[test]
fn failed_conversion_keeps_the_previous_artifact() {
    let (_tmp, src, out) = converted_tiny();
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    std::fs::remove_file(src.join("tokenizer.json")).unwrap();
    assert!(!converter(&[&"convert", &src, &out]).success);
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
    assert!(!out.join(".partial").exists());
    assert!(converter(&[&"verify", &out]).success);
}

// ---- GGUF import ----

/// tiny_gguf's q projection is Q8_0, a type the runtime keeps: the checkpoint is f32 (the
/// exact values) and blocks.safetensors holds its blocks, rows moved as the values' are.
#[test]
fn gguf_import_dequantizes_and_unpermutes() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, out) = (tmp.path().join("m.gguf"), tmp.path().join("hf"));
    std::fs::write(&gguf, tiny_gguf().build()).unwrap();
    let run = converter(&[&"import-gguf", &gguf, &out]);
    assert!(run.success, "{}", run.stderr);

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::F32);
        t.data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let embed = st.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embed.shape(), [3, 4]);
    assert_eq!(
        f32s("model.embed_tokens.weight"),
        (0..12).map(|i| i as f32 * 0.5).collect::<Vec<_>>()
    );
    // One head of 4 rows: GGUF rows (0, 1, 2, 3) hold HF rows (0, 2, 1, 3).
    let q = f32s("model.layers.0.self_attn.q_proj.weight");
    let blocks = std::fs::read(out.join("blocks.safetensors")).unwrap();
    let blocks = safetensors::SafeTensors::deserialize(&blocks).unwrap();
    let q_blocks = blocks
        .tensor("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(
        (q_blocks.dtype(), q_blocks.shape()),
        (Dtype::U8, &[4, 34][..])
    );
    assert_eq!(blocks.len(), 1);
    for (hf_row, gguf_row) in [(0, 0), (1, 2), (2, 1), (3, 3)] {
        let expected: Vec<f32> = (0..32).map(|c| 0.5 * (gguf_row * 10 + c) as f32).collect();
        assert_eq!(
            q[hf_row * 32..hf_row * 32 + 32],
            expected[..],
            "row {hf_row}"
        );
        let block = &q_blocks.data()[hf_row * 34..][..34];
        assert_eq!(block[..2], half::f16::from_f32(0.5).to_le_bytes());
        assert!(
            block[2..]
                .iter()
                .copied()
                .eq((0..32).map(|c| gguf_row as u8 * 10 + c))
        );
    }
    let (_, metadata) = safetensors::SafeTensors::read_metadata(
        &std::fs::read(out.join("blocks.safetensors")).unwrap(),
    )
    .unwrap();
    let types = metadata.metadata().clone().unwrap();
    assert_eq!(
        types,
        [(
            "model.layers.0.self_attn.q_proj.weight".to_string(),
            "Q8_0".to_string()
        )]
        .into()
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["rms_norm_eps"], serde_json::json!(1e-5));
    assert_eq!(config["tie_word_embeddings"], serde_json::json!(true));
    let tokenizer = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    assert_eq!(tokenizer.encode("ab", false).unwrap().get_ids(), [2]);
}

/// A GGUF whose projections are of no type the runtime keeps as blocks (here F32, and Q4_1)
/// imports as before: a bf16 checkpoint, values rounded to nearest even, no blocks file.
#[test]
fn gguf_without_kept_blocks_imports_as_bf16() {
    let embed: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.3).to_le_bytes())
        .collect();
    let q_f32: Vec<u8> = (0..128)
        .flat_map(|i| (i as f32 * 0.1).to_le_bytes())
        .collect();
    // Q4_1: `d: f16, m: f16, qs: [u8; 16]`, value `d * q + m`; a block a row.
    let mut q_q4_1 = Vec::new();
    for row in 0..4u8 {
        q_q4_1.extend(half::f16::from_f32(0.1).to_le_bytes());
        q_q4_1.extend(half::f16::from_f32(-0.3).to_le_bytes());
        q_q4_1.extend((0..16u8).map(|j| j.wrapping_mul(row + 3)));
    }
    for (type_id, q) in [(0, q_f32), (3, q_q4_1)] {
        let tmp = tempfile::tempdir().unwrap();
        let (gguf, out) = (tmp.path().join("m.gguf"), tmp.path().join("hf"));
        let file = tiny_gguf_metadata("llama", "gpt2", "smollm")
            .tensor("token_embd.weight", &[4, 3], 0, &embed)
            .tensor("blk.0.attn_q.weight", &[32, 4], type_id, &q);
        std::fs::write(&gguf, file.build()).unwrap();
        let run = converter(&[&"import-gguf", &gguf, &out]);
        assert!(run.success, "{}", run.stderr);
        assert!(!out.join("blocks.safetensors").exists());
        let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (_, tensor) in st.tensors() {
            assert_eq!(tensor.dtype(), Dtype::BF16);
        }
        let embed = st.tensor("model.embed_tokens.weight").unwrap();
        let first: Vec<u8> = embed.data()[2..4].to_vec();
        assert_eq!(first, half::bf16::from_f32(0.3).to_le_bytes());
    }
}

#[test]
fn loading_checks_record_shapes_against_config() {
    let (_tmp, _src, out) = converted_tiny();
    // Same length, so the manifest's size check passes and the shape check must catch it.
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    let edited = config.replace("\"intermediate_size\": 12", "\"intermediate_size\": 14");
    assert_ne!(config, edited);
    std::fs::write(out.join("config.json"), edited).unwrap();
    let err = load_model::<FlexBackend>(&out, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layers.0.mlp.gate_proj.weight has shape [8, 12]"),
        "{err}"
    );
}
