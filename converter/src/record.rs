//! The Burn record: the runtime's module filled from checkpoint tensors, and its file.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow};
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::record::{BurnRecord, FullPrecisionSettings, Record};
use burn::tensor::{Tensor, TensorData};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::artifact::{ArtifactRecorder, MODEL_FILE};
use runtime::model::Llama;
use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;
use crate::names::Transform;
use crate::staging::{Staging, finish};

/// The converter only holds tensors; any backend would do.
pub type B = runtime::FlexBackend;

/// Where a Burn parameter comes from.
pub struct Source {
    pub hf_name: String,
    pub transform: Transform,
}

/// Decodes each tensor into the module, one at a time, with a deterministic `ParamId`.
pub fn load_weights(
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
pub fn save_record(model: Llama<B>, staging: &Staging) -> Result<()> {
    let item = model.into_record().into_item::<FullPrecisionSettings>();
    let record = BurnRecord::<_, B>::new::<ArtifactRecorder>(item);
    let mut writer = staging.create_file(MODEL_FILE)?;
    rmp_serde::encode::write_named(&mut writer, &record).context("cannot write the record")?;
    finish(writer).context("cannot write the record")
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
