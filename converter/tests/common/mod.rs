//! Tiny synthetic checkpoints written by the tests themselves, and a way to run the binary.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;

pub const VOCAB: usize = 32;
pub const HIDDEN: usize = 8;
pub const FFN: usize = 12;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = HIDDEN / HEADS;

/// How a synthetic checkpoint is stored.
#[derive(Clone, Copy)]
pub struct Spec {
    pub dtype: Dtype,
    pub tied: bool,
    pub shards: usize,
}

/// The checkpoint most tests start from.
pub const TIED_BF16: Spec = Spec {
    dtype: Dtype::BF16,
    tied: true,
    shards: 1,
};

/// A tensor to write: (name, shape, bytes).
pub type RawTensor = (String, Vec<usize>, Vec<u8>);

/// Every tensor of a Llama checkpoint with the sizes above: (HF name, shape).
pub fn tensor_shapes(tied: bool) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".to_string(), vec![HIDDEN]),
    ];
    if !tied {
        out.push(("lm_head.weight".to_string(), vec![VOCAB, HIDDEN]));
    }
    let kv = KV_HEADS * HEAD_DIM;
    for i in 0..LAYERS {
        let l = format!("model.layers.{i}");
        out.extend([
            (format!("{l}.input_layernorm.weight"), vec![HIDDEN]),
            (format!("{l}.post_attention_layernorm.weight"), vec![HIDDEN]),
            (format!("{l}.self_attn.q_proj.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{l}.self_attn.k_proj.weight"), vec![kv, HIDDEN]),
            (format!("{l}.self_attn.v_proj.weight"), vec![kv, HIDDEN]),
            (format!("{l}.self_attn.o_proj.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{l}.mlp.gate_proj.weight"), vec![FFN, HIDDEN]),
            (format!("{l}.mlp.up_proj.weight"), vec![FFN, HIDDEN]),
            (format!("{l}.mlp.down_proj.weight"), vec![HIDDEN, FFN]),
        ]);
    }
    out
}

/// Deterministic values, different for every tensor, as the checkpoint's dtype stores them
/// (so the widened f32 is exactly what the converter must produce).
pub fn values(name: &str, numel: usize, dtype: Dtype) -> Vec<f32> {
    let salt = name.bytes().map(usize::from).sum::<usize>();
    (0..numel)
        .map(|i| ((i * 7919 + salt * 31) % 2001) as f32 / 1000.0 - 1.0)
        .map(|v| match dtype {
            Dtype::BF16 => bf16::from_f32(v).to_f32(),
            Dtype::F16 => f16::from_f32(v).to_f32(),
            _ => v,
        })
        .collect()
}

pub fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F32 => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        other => panic!("test helper does not encode {other:?}"),
    }
}

pub fn config_json(tied: bool) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "tie_word_embeddings": tied, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2
    })
}

/// A word-level tokenizer.json over `t0 … t31`.
pub fn tokenizer_json() -> serde_json::Value {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..VOCAB).map(|i| (format!("t{i}"), json!(i))).collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    })
}

/// Writes a complete synthetic checkpoint into `dir`.
pub fn write_checkpoint(dir: &Path, spec: Spec) {
    std::fs::create_dir_all(dir).unwrap();
    write_json(&dir.join("config.json"), &config_json(spec.tied));
    write_json(&dir.join("tokenizer.json"), &tokenizer_json());
    let tensors: Vec<RawTensor> = tensor_shapes(spec.tied)
        .into_iter()
        .map(|(name, shape)| {
            let bytes = encode(
                &values(&name, shape.iter().product(), spec.dtype),
                spec.dtype,
            );
            (name, shape, bytes)
        })
        .collect();
    if spec.shards <= 1 {
        write_safetensors(&dir.join("model.safetensors"), &tensors, spec.dtype);
        return;
    }
    let mut weight_map = serde_json::Map::new();
    let per_shard = tensors.len().div_ceil(spec.shards);
    for (k, chunk) in tensors.chunks(per_shard).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, spec.shards);
        write_safetensors(&dir.join(&file), chunk, spec.dtype);
        for (name, _, _) in chunk {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {}, "weight_map": weight_map}),
    );
}

pub fn write_safetensors(path: &Path, tensors: &[RawTensor], dtype: Dtype) {
    let views = tensors.iter().map(|(name, shape, bytes)| {
        (
            name.clone(),
            TensorView::new(dtype, shape.clone(), bytes).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, path).unwrap();
}

pub fn write_json(path: &Path, value: &serde_json::Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// The family fixtures in tests/data (scripts/make_tiny_fixture.py), one checkpoint each.
pub const FAMILIES: [&str; 10] = [
    "tiny",
    "tiny-llama3",
    "tiny-linear",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-yarn",
    "tiny-qwen3",
    "tiny-smollm3",
    "tiny-gemma3",
    "tiny-phi3",
];

/// A tied bf16 checkpoint in `tmp/hf`, converted into `tmp/out`.
pub fn converted_tiny() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("hf"), tmp.path().join("out"));
    write_checkpoint(&src, TIED_BF16);
    let run = converter(&[&"convert", &src, &out]);
    assert!(run.success, "{}", run.stderr);
    (tmp, src, out)
}

/// Removes the artifact's weights file and its manifest entry, as an older converter wrote
/// the artifact: the runtime then loads the record.
pub fn drop_weights_file(out: &Path) {
    std::fs::remove_file(out.join("weights.bin")).unwrap();
    let path = out.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let files = manifest["files"].as_array_mut().unwrap();
    files.retain(|f| f["name"] != "weights.bin");
    write_json(&path, &manifest);
}

/// Output of one run of the converter binary.
pub struct Run {
    pub success: bool,
    pub stderr: String,
}

pub fn converter(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_converter"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap();
    Run {
        success: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `path`, a file of a real model, if it is there; else `None` after saying the test is
/// skipped, or, under `REQUIRE_MODEL` (set by `just test`), a failure. `fetch` is the
/// command that makes it.
pub fn model_file(path: PathBuf, fetch: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("REQUIRE_MODEL").is_none(),
        "{} is missing: run `{fetch}`",
        path.display()
    );
    eprintln!("skipped: {} is missing (run `{fetch}`)", path.display());
    None
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

// ---- GGUF ----

/// A minimal GGUF v3 writer: metadata of the kinds the importer reads, and raw tensors.
pub struct GgufBuilder {
    /// Each metadata entry: its key, then its type and value as written.
    kv: Vec<(String, Vec<u8>)>,
    infos: Vec<u8>,
    data: Vec<u8>,
    n_tensors: u64,
}

impl GgufBuilder {
    pub fn new() -> Self {
        Self {
            kv: vec![],
            infos: vec![],
            data: vec![],
            n_tensors: 0,
        }
    }

    fn string(buf: &mut Vec<u8>, s: &str) {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s.as_bytes());
    }

    /// Starts an entry (a key given twice is two entries, as a broken file has them);
    /// returns where its value goes.
    fn key(&mut self, key: &str, type_id: u32) -> &mut Vec<u8> {
        self.kv.push((key.into(), type_id.to_le_bytes().to_vec()));
        &mut self.kv.last_mut().expect("just pushed").1
    }

    /// Without the metadata entries of `key`: to give one of a fixture's keys another
    /// value or type.
    pub fn without(mut self, key: &str) -> Self {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    /// A metadata entry of any type, its value given as raw bytes.
    pub fn raw(mut self, key: &str, type_id: u32, value: &[u8]) -> Self {
        self.key(key, type_id).extend(value);
        self
    }

    pub fn u32(mut self, key: &str, v: u32) -> Self {
        self.key(key, 4).extend(v.to_le_bytes());
        self
    }

    pub fn f32(mut self, key: &str, v: f32) -> Self {
        self.key(key, 6).extend(v.to_le_bytes());
        self
    }

    pub fn str(mut self, key: &str, v: &str) -> Self {
        Self::string(self.key(key, 8), v);
        self
    }

    pub fn strings(mut self, key: &str, items: &[&str]) -> Self {
        let value = self.key(key, 9);
        value.extend(8u32.to_le_bytes());
        value.extend((items.len() as u64).to_le_bytes());
        for item in items {
            Self::string(value, item);
        }
        self
    }

    /// A tensor info with any offset, and no data: for malformed files.
    pub fn tensor_info(mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        Self::string(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(type_id.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// `dims` innermost first, as GGUF stores them.
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, bytes: &[u8]) -> Self {
        Self::string(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(type_id.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.data.resize(self.data.len().div_ceil(32) * 32, 0);
        self.n_tensors += 1;
        self
    }

    pub fn build(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (key, value) in &self.kv {
            Self::string(&mut out, key);
            out.extend(value);
        }
        out.extend(self.infos);
        out.resize(out.len().div_ceil(32) * 32, 0);
        out.extend(self.data);
        out
    }
}

/// A llama GGUF with one F32 embedding [3 tokens × 4] and one Q8_0 q projection [4 × 32].
pub fn tiny_gguf() -> GgufBuilder {
    tiny_gguf_with("llama", "gpt2", "smollm")
}

/// [`tiny_gguf`] with another architecture, tokenizer model or pre-tokenizer.
pub fn tiny_gguf_with(arch: &str, tokenizer: &str, pre: &str) -> GgufBuilder {
    with_tiny_tensors(tiny_gguf_metadata(arch, tokenizer, pre))
}

/// `gguf` with [`tiny_gguf`]'s tensors.
fn with_tiny_tensors(gguf: GgufBuilder) -> GgufBuilder {
    let embed: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let mut q8 = Vec::new();
    for row in 0..4u8 {
        q8.extend(f16::from_f32(0.5).to_le_bytes());
        q8.extend((0..32u8).map(|c| row * 10 + c));
    }
    gguf.tensor("token_embd.weight", &[4, 3], 0, &embed).tensor(
        "blk.0.attn_q.weight",
        &[32, 4],
        8,
        &q8,
    )
}

/// [`tiny_gguf_with`]'s metadata, no tensors.
pub fn tiny_gguf_metadata(arch: &str, tokenizer: &str, pre: &str) -> GgufBuilder {
    metadata_under("llama", arch, tokenizer, pre)
}

/// [`tiny_gguf`] for `arch`, its hyperparameters under `arch`'s own key prefix
/// (`gemma3.block_count`), as a real file of that architecture has them.
pub fn tiny_gguf_as(arch: &str) -> GgufBuilder {
    with_tiny_tensors(metadata_under(arch, arch, "gpt2", "smollm"))
}

/// The tiny GGUF's metadata, its hyperparameters under `prefix`.
fn metadata_under(prefix: &str, arch: &str, tokenizer: &str, pre: &str) -> GgufBuilder {
    let key = |name: &str| format!("{prefix}.{name}");
    GgufBuilder::new()
        .str("general.architecture", arch)
        .u32(&key("block_count"), 1)
        .u32(&key("context_length"), 16)
        .u32(&key("embedding_length"), 4)
        .u32(&key("feed_forward_length"), 8)
        .u32(&key("attention.head_count"), 1)
        .u32(&key("attention.head_count_kv"), 1)
        .f32(&key("attention.layer_norm_rms_epsilon"), 1e-5)
        .str("tokenizer.ggml.model", tokenizer)
        .str("tokenizer.ggml.pre", pre)
        .strings("tokenizer.ggml.tokens", &["a", "b", "ab"])
        .strings("tokenizer.ggml.merges", &["a b"])
}

/// Logits of a 40-token prompt at every position, then of 8 tokens decoded one at a time,
/// as bits.
pub fn logits<B: runtime::model::backend::KernelBackend>(
    generator: &runtime::generate::Generator<B>,
) -> Vec<u32> {
    let vocab = generator.config.vocab_size as u32;
    let ids: Vec<u32> = (0..48).map(|i| (i * 37 + 5) % vocab).collect();
    let mut cache = generator.new_cache(ids.len()).unwrap();
    let mut all = generator
        .forward_logits(&ids[..40], &mut cache, true)
        .unwrap();
    for &id in &ids[40..] {
        all.extend(generator.forward_logits(&[id], &mut cache, false).unwrap());
    }
    all.into_iter().map(f32::to_bits).collect()
}
