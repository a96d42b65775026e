//! Hugging Face checkpoint → Burn record artifact.
//!
//! Everything that can be checked without reading weights is checked first (architecture,
//! every tensor's name, shape and dtype), so a bad checkpoint fails in milliseconds. Weights
//! are then decoded one tensor at a time straight into the runtime's own module, which is
//! saved with the runtime's recorder: record field paths can't drift from the model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail, ensure};
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::record::{BurnRecord, FullPrecisionSettings, Record};
use burn::tensor::{Tensor, TensorData};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::artifact::{
    self, ArtifactRecorder, CONFIG_FILE, FORMAT_VERSION, FileDigest, GENERATION_CONFIG_FILE,
    MANIFEST_FILE, MODEL_FILE, Manifest, PROBE_TEXT, Probe, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use runtime::config::{HfConfig, LlamaConfig};
use runtime::model::Llama;
use runtime::params::param_shapes;
use safetensors::Dtype;
use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;
use crate::names::{self, Transform};
use crate::staging::{Staging, finish};

/// The converter only holds tensors; any backend would do.
type B = runtime::FlexBackend;

/// Files copied from the checkpoint into the artifact: (name, required).
const SIDE_FILES: &[(&str, bool)] = &[
    (CONFIG_FILE, true),
    (GENERATION_CONFIG_FILE, false),
    (TOKENIZER_FILE, true),
    (TOKENIZER_CONFIG_FILE, false),
];

/// Where each Burn parameter comes from.
struct Source {
    hf_name: String,
    transform: Transform,
}

/// Converts the checkpoint in `src` into an artifact in `out` and returns its manifest.
pub fn convert(src: &Path, out: &Path) -> Result<Manifest> {
    let hf = HfConfig::from_file(&src.join(CONFIG_FILE))?;
    let config = LlamaConfig::from_hf(&hf)?;
    for &(name, required) in SIDE_FILES {
        if required && !src.join(name).is_file() {
            bail!("{}: missing {name}", src.display());
        }
    }
    let checkpoint = Checkpoint::open(src)?;
    let device = Default::default();
    let model = config.init::<B>(&device);
    let sources = plan(&checkpoint, &config, &model)?;

    // Creates `out` too (and removes it again if this run fails before finishing).
    let staging = Staging::create(out.join(".partial"))?;
    let model = load_weights(model, &checkpoint, sources)?;
    save_record(model, &staging)?;
    let mut artifact_files = vec![MODEL_FILE.to_string()];
    for &(name, _) in SIDE_FILES {
        if src.join(name).is_file() {
            std::fs::copy(src.join(name), staging.path(name))
                .with_context(|| format!("cannot copy {name}"))?;
            artifact_files.push(name.to_string());
        }
    }

    let source_files = SIDE_FILES
        .iter()
        .map(|&(name, _)| name.to_string())
        .filter(|name| src.join(name).is_file())
        .chain(checkpoint.files.iter().cloned());
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        converter: format!("converter {}", env!("CARGO_PKG_VERSION")),
        source: digests(src, source_files)?,
        files: digests(&staging.path(""), artifact_files.iter().cloned())?,
        probe: Probe::compute(&staging.path(""), PROBE_TEXT)?,
    };
    staging.commit_into(out, &artifact_files, (MANIFEST_FILE, &manifest.to_json()))?;
    Ok(manifest)
}

/// Matches every parameter of `model` to a checkpoint tensor and checks names, shapes and
/// dtypes, naming the first tensor that is missing, unmapped or wrong.
fn plan(
    checkpoint: &Checkpoint,
    config: &LlamaConfig,
    model: &Llama<B>,
) -> Result<BTreeMap<String, Source>> {
    let expected = param_shapes::<B, _>(model);
    let mut sources = BTreeMap::new();
    for (path, shape) in &expected {
        let (mut hf_name, transform) = names::to_hf(path)
            .ok_or_else(|| anyhow!("no name table entry for Burn parameter {path}"))?;
        if hf_name == names::LM_HEAD && config.tie_word_embeddings {
            // Tied: lm_head is the embedding, transposed to [hidden, vocab].
            hf_name = names::EMBEDDING.to_string();
        }
        let meta = checkpoint
            .tensors
            .get(&hf_name)
            .ok_or_else(|| anyhow!("missing tensor {hf_name}"))?;
        let source_shape = match transform {
            Transform::Keep => shape.clone(),
            Transform::Transpose => vec![shape[1], shape[0]],
        };
        ensure!(
            meta.shape == source_shape,
            "tensor {hf_name} has shape {:?}, expected {source_shape:?} from config.json",
            meta.shape
        );
        ensure!(
            matches!(meta.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16),
            "tensor {hf_name} has unsupported dtype {:?} (supported: F32, BF16, F16)",
            meta.dtype
        );
        sources.insert(path.clone(), Source { hf_name, transform });
    }
    let wanted: BTreeSet<&str> = expected.iter().map(|(p, _)| p.as_str()).collect();
    for name in checkpoint.tensors.keys() {
        if names::is_ignored(name) {
            continue;
        }
        match names::to_burn(name) {
            None => bail!("unmapped tensor {name}: not part of a Llama checkpoint"),
            Some((path, _)) if !wanted.contains(path.as_str()) => bail!(
                "tensor {name} does not fit config.json ({} layers)",
                config.num_layers
            ),
            Some(_) => {}
        }
    }
    Ok(sources)
}

/// Decodes each tensor into the module, one at a time, with a deterministic `ParamId`.
fn load_weights(
    model: Llama<B>,
    checkpoint: &Checkpoint,
    sources: BTreeMap<String, Source>,
) -> Result<Llama<B>> {
    let progress = ProgressBar::new(sources.len() as u64).with_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} tensors")
            .expect("valid template")
            .progress_chars("=> "),
    );
    progress.set_message("converting");
    let mut loader = Loader {
        checkpoint,
        sources,
        path: Vec::new(),
        progress,
        error: None,
    };
    let model = model.map(&mut loader);
    loader.progress.finish_and_clear();
    match loader.error {
        Some(error) => Err(error),
        None => Ok(model),
    }
}

struct Loader<'a> {
    checkpoint: &'a Checkpoint,
    sources: BTreeMap<String, Source>,
    path: Vec<String>,
    progress: ProgressBar,
    /// `ModuleMapper` can't return errors: the first one is kept here.
    error: Option<anyhow::Error>,
}

impl Loader<'_> {
    fn tensor<const D: usize>(&self, path: &str, shape: Vec<usize>) -> Result<Tensor<B, D>> {
        let source = self
            .sources
            .get(path)
            .ok_or_else(|| anyhow!("no source planned for {path}"))?;
        let mut values = self.checkpoint.read_f32(&source.hf_name)?;
        if source.transform == Transform::Transpose {
            values = transpose(&values, shape[1], shape[0]);
        }
        Ok(Tensor::from_data(
            TensorData::new(values, shape),
            &Default::default(),
        ))
    }
}

impl ModuleMapper<B> for Loader<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let path = self.path.join(".");
        match self.tensor::<D>(&path, param.lazy_shape().to_vec()) {
            Ok(tensor) => {
                self.progress.inc(1);
                Param::initialized(param_id(&path), tensor)
            }
            Err(e) => {
                self.error = Some(e);
                param
            }
        }
    }
}

/// Burn draws `ParamId`s at random, which would make every save differ; derive them from
/// the field path instead so the same checkpoint always gives the same bytes.
fn param_id(path: &str) -> ParamId {
    let digest = Sha256::digest(path.as_bytes());
    ParamId::from(u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")))
}

/// Row-major `[rows, cols]` → `[cols, rows]`, in tiles to stay in cache.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut out = vec![0.0; values.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = values[r * cols + c];
                }
            }
        }
    }
    out
}

/// Saves the module exactly as `NamedMpkFileRecorder::record` would (same `BurnRecord`
/// envelope, same `rmp_serde::encode::write_named`), but through a writer whose flush and
/// fsync errors we see: the recorder drops its `BufWriter`, losing a failed final write.
fn save_record(model: Llama<B>, staging: &Staging) -> Result<()> {
    let item = model.into_record().into_item::<FullPrecisionSettings>();
    let record = BurnRecord::<_, B>::new::<ArtifactRecorder>(item);
    let mut writer = staging.create_file(MODEL_FILE)?;
    rmp_serde::encode::write_named(&mut writer, &record).context("cannot write the record")?;
    finish(writer).context("cannot write the record")
}

/// sha256 and size of each named file in `dir`, sorted by name.
fn digests(dir: &Path, names: impl Iterator<Item = String>) -> Result<Vec<FileDigest>> {
    let mut names: Vec<String> = names.collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(&name);
            let (sha256, bytes) = artifact::digest_file(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            Ok(FileDigest {
                name,
                sha256,
                bytes,
            })
        })
        .collect()
}

/// Differences between the artifact in `out` (and, if given, the checkpoint in `src`) and
/// the manifest, one line each; empty when everything matches.
pub fn verify(out: &Path, src: Option<&Path>) -> Result<Vec<String>> {
    let manifest = Manifest::read(out)?;
    let mut problems = Vec::new();
    let mut check = |dir: &Path, expected: &[FileDigest], what: &str| {
        for file in expected {
            let path = dir.join(&file.name);
            match artifact::digest_file(&path) {
                Err(e) => problems.push(format!("{what} {}: {e}", path.display())),
                Ok((sha, bytes)) if sha != file.sha256 || bytes != file.bytes => {
                    problems.push(format!(
                        "{what} {}: sha256 {sha} ({bytes} bytes), manifest says {} ({} bytes)",
                        path.display(),
                        file.sha256,
                        file.bytes
                    ))
                }
                Ok(_) => {}
            }
        }
    };
    check(out, &manifest.files, "artifact");
    if let Some(src) = src {
        check(src, &manifest.source, "source");
    }
    let tokenizer = out.join(TOKENIZER_FILE);
    match Probe::compute(out, &manifest.probe.text) {
        Ok(probe) if probe.token_ids != manifest.probe.token_ids => problems.push(format!(
            "{}: probe text tokenizes to {:?}, manifest says {:?}",
            tokenizer.display(),
            probe.token_ids,
            manifest.probe.token_ids
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("tokenizer probe: {e}")),
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_moves_every_element() {
        let (rows, cols) = (37, 70);
        let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let t = transpose(&values, rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(t[c * rows + r], values[r * cols + c]);
            }
        }
    }
}
