//! Loading a model from its record: each parameter copied once from the mapped file
//! (`crate::record`) into the layout the kernels read, matrices kept as bf16 where that
//! loses nothing.

use std::collections::HashSet;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorCreationOptions, TensorData, TensorPrimitive, bf16};
use rayon::prelude::*;

use crate::backend::KernelBackend;
use crate::model::Llama;
use crate::params::{FieldPath, params};
use crate::record::Record;

/// How the loader keeps the matrices (projections and the embedding) in memory. The record
/// holds f32; a bf16 checkpoint's values are bf16 values widened, 16 low bits zero, and
/// kept as bf16 they take half the memory and half the bytes a decoded token reads, with
/// the same products (`kernels::simd::Stored`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Weights {
    /// bf16 for each matrix whose every value is one (exact), f32 for any other, so an
    /// f32-trained checkpoint is never rounded silently.
    #[default]
    Auto,
    /// bf16, rounding (to nearest even) any value that is not one.
    Bf16,
    /// f32, as stored.
    F32,
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
        })
    }
}

impl std::str::FromStr for Weights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "bf16" => Ok(Self::Bf16),
            "f32" => Ok(Self::F32),
            other => Err(format!("{other:?} is not one of auto, bf16, f32")),
        }
    }
}

/// What the loader kept each matrix as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kept {
    pub bf16: usize,
    pub f32: usize,
    /// Matrices rounded to bf16 (`Weights::Bf16` on values that are not all bf16).
    pub rounded: usize,
}

/// Fills `model` (built by `LlamaConfig::init`, nothing allocated) from `record`, each
/// parameter copied once from the map into the layout the model keeps it in: every
/// projection column-major (what `Llama::with_matvec_layout` makes), matrices as `weights`
/// says where the backend computes on bf16 (f32 where it does not), and with `tied`
/// embeddings lm_head a view of the embedding, its stored copy not read.
pub fn load_into<B: KernelBackend>(
    record: &Record,
    model: Llama<B>,
    tied: bool,
    weights: Weights,
    device: &B::Device,
) -> Result<(Llama<B>, Kept), String> {
    let declared: Vec<String> = params(&model).into_iter().map(|p| p.path).collect();
    check_same_params(&record.param_paths(), &declared)?;
    let weights = if B::BF16_WEIGHTS {
        weights
    } else {
        Weights::F32
    };
    let mut loader = Loader {
        record,
        tied,
        weights,
        kept: Kept::default(),
        device: device.clone(),
        path: FieldPath::default(),
        embedding: None,
        error: None,
    };
    let model = model.map(&mut loader);
    match loader.error {
        Some(error) => Err(error),
        None => Ok((model, loader.kept)),
    }
}

/// The record's parameters against the ones the model declares, both ways, before any is
/// copied: the loader reads only what the model asks for, so a record with a layer
/// config.json does not declare would otherwise load with that layer silently unread.
fn check_same_params(stored: &[String], declared: &[String]) -> Result<(), String> {
    let absent_from = |names: &[String], other: &[String]| -> Vec<String> {
        let other: HashSet<&str> = other.iter().map(String::as_str).collect();
        (names.iter())
            .filter(|name| !other.contains(name.as_str()))
            .cloned()
            .collect()
    };
    let mut problems = Vec::new();
    let extra = absent_from(stored, declared);
    if !extra.is_empty() {
        problems.push(format!(
            "model.mpk holds {} config.json does not declare ({})",
            parameters(extra.len()),
            some_of(&extra)
        ));
    }
    let missing = absent_from(declared, stored);
    if !missing.is_empty() {
        problems.push(format!(
            "config.json declares {} model.mpk lacks ({})",
            parameters(missing.len()),
            some_of(&missing)
        ));
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{}: config.json and model.mpk disagree",
            problems.join("; ")
        )),
    }
}

fn parameters(n: usize) -> String {
    match n {
        1 => "1 parameter".into(),
        n => format!("{n} parameters"),
    }
}

/// The first few of `names`, and how many more: a whole layer is nine names.
fn some_of(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let shown = names[..names.len().min(SHOWN)].join(", ");
    match names.len().saturating_sub(SHOWN) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

struct Loader<'a, B: Backend> {
    record: &'a Record,
    tied: bool,
    weights: Weights,
    kept: Kept,
    device: B::Device,
    path: FieldPath,
    /// The embedding, `[vocab, hidden]`, for a tied lm_head.
    embedding: Option<TensorPrimitive<B>>,
    /// `ModuleMapper` can't return errors: the first one is kept here.
    error: Option<String>,
}

impl<B: Backend> Loader<'_, B> {
    fn tensor<const D: usize>(
        &mut self,
        path: &str,
        owner: &str,
        expected: &[usize],
    ) -> Result<(ParamId, Tensor<B, D>), String> {
        let stored = self.record.param(path)?;
        if stored.shape != expected {
            return Err(format!(
                "{path} has shape {:?}, config.json implies {expected:?}",
                stored.shape
            ));
        }
        let id = ParamId::try_deserialize(stored.id)
            .ok_or_else(|| format!("{path} has a corrupt parameter id"))?;
        if self.tied && path == "lm_head.weight" {
            let embedding = (self.embedding.clone()).ok_or("lm_head comes before the embedding")?;
            let view = Tensor::<B, 2>::from_primitive(embedding).transpose();
            return Ok((id, Tensor::from_primitive(view.into_primitive())));
        }
        let exact = expected.len() == 2 && self.weights != Weights::F32 && all_bf16(stored.bytes);
        let as_bf16 = exact || (expected.len() == 2 && self.weights == Weights::Bf16);
        self.kept.rounded += usize::from(as_bf16 && !exact);
        if expected.len() == 2 {
            if as_bf16 {
                self.kept.bf16 += 1;
            } else {
                self.kept.f32 += 1;
            }
        }
        // A projection, `[d_in, d_out]` stored row-major, is kept as `[d_out, d_in]`
        // row-major seen transposed: each output's weights contiguous, as the matrix-vector
        // kernel reads them.
        let linear = match (owner, expected) {
            ("Linear", &[d_in, d_out]) => Some((d_in, d_out)),
            _ => None,
        };
        let shape = linear.map_or(expected.to_vec(), |(d_in, d_out)| vec![d_out, d_in]);
        let bytes = stored.bytes;
        let (data, dtype) = match (as_bf16, exact) {
            (false, _) => (laid_out(bytes, linear, shape, |v| v), DType::F32),
            // The high half of an f32 whose low half is zero is that value's bf16.
            (true, true) => {
                let narrow = |v: f32| bf16::from_bits((v.to_bits() >> 16) as u16);
                (laid_out(bytes, linear, shape, narrow), DType::BF16)
            }
            (true, false) => (laid_out(bytes, linear, shape, bf16::from_f32), DType::BF16),
        };
        let tensor = self.tensor_of::<D>(data, dtype);
        let tensor = if linear.is_some() {
            tensor.transpose()
        } else {
            tensor
        };
        self.record.release(&stored);
        if path == "embed_tokens.weight" {
            self.embedding = Some(tensor.clone().into_primitive());
        }
        Ok((id, tensor))
    }

    fn tensor_of<const D: usize>(&self, data: TensorData, dtype: DType) -> Tensor<B, D> {
        let options = TensorCreationOptions::new(self.device.clone()).with_dtype(dtype);
        Tensor::from_data(data, options)
    }
}

impl<B: Backend> ModuleMapper<B> for Loader<'_, B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let (path, owner) = (self.path.path(), self.path.owner().to_string());
        let expected = param.lazy_shape().to_vec();
        match self.tensor::<D>(&path, &owner, &expected) {
            Ok((id, tensor)) => Param::initialized(id, tensor),
            Err(error) => {
                self.error = Some(error);
                param
            }
        }
    }
}

/// `bytes` (little-endian f32) through `convert`, transposed for a projection
/// (`linear: Some((d_in, d_out))`), as one tensor's data.
fn laid_out<E: Copy + Default + Send + burn::tensor::Element>(
    bytes: &[u8],
    linear: Option<(usize, usize)>,
    shape: Vec<usize>,
    convert: impl Fn(f32) -> E + Sync,
) -> TensorData {
    let values = match linear {
        Some((d_in, d_out)) => transposed(bytes, d_in, d_out, convert),
        None => floats(bytes, convert),
    };
    TensorData::new(values, shape)
}

/// Whether every little-endian f32 of `bytes` is a bf16 value (its low 16 bits zero).
fn all_bf16(bytes: &[u8]) -> bool {
    // Branch-free within a chunk (an OR of the low halves), so it vectorizes.
    bytes.par_chunks(4 << 16).all(|chunk| {
        let low = chunk
            .chunks_exact(4)
            .fold(0u16, |low, b| low | u16::from_le_bytes([b[0], b[1]]));
        low == 0
    })
}

/// Little-endian f32 `bytes` as values, each through `convert`.
fn floats<E: Copy + Default + Send>(bytes: &[u8], convert: impl Fn(f32) -> E + Sync) -> Vec<E> {
    let mut values = vec![E::default(); bytes.len() / 4];
    values
        .par_chunks_mut(1 << 16)
        .zip(bytes.par_chunks(4 << 16))
        .for_each(|(values, bytes)| {
            for (v, b) in values.iter_mut().zip(bytes.chunks_exact(4)) {
                *v = convert(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        });
    values
}

/// Little-endian f32 `bytes` of a row-major `[rows, cols]` matrix as the values (through
/// `convert`) of its transpose, `[cols, rows]` row-major. Blocks of output rows in
/// parallel; within a block, tiles of source rows so the output lines written stay in cache.
fn transposed<E: Copy + Default + Send>(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    convert: impl Fn(f32) -> E + Sync,
) -> Vec<E> {
    const TILE: usize = 32;
    let mut out = vec![E::default(); rows * cols];
    if rows == 0 {
        return out;
    }
    out.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(block, out)| {
            let (first, n) = (block * TILE, out.len() / rows);
            for r0 in (0..rows).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    let source = &bytes[(r * cols + first) * 4..][..n * 4];
                    for (c, b) in source.chunks_exact(4).enumerate() {
                        out[c * rows + r] = convert(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    }
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-layer model saved by Burn's own recorder, loaded with configs of 2, 1 and 3
    /// layers: the one with a layer fewer must not load with the record's last layer
    /// unread, the one with a layer more must name what is missing.
    #[test]
    fn a_record_and_a_config_that_disagree_on_parameters_are_refused() {
        use burn::record::Recorder;
        type B = crate::FlexBackend;
        let device = Default::default();
        let config = |layers| crate::config::LlamaConfig::plain([8, 16, layers], [2, 1, 4], 10, 16);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.mpk");
        let model = config(2).init::<B>(&device);
        crate::artifact::ArtifactRecorder::new()
            .record(model.into_record(), path.clone())
            .unwrap();
        let record = Record::open(&path).unwrap();
        let load = |layers| {
            let model = config(layers).init::<B>(&device);
            load_into(&record, model, false, Weights::Auto, &device).map(|_| ())
        };
        assert_eq!(load(2), Ok(()));
        let fewer = load(1).unwrap_err();
        assert!(
            fewer.starts_with(
                "model.mpk holds 9 parameters config.json does not declare (layers.1."
            ),
            "{fewer}"
        );
        assert!(
            fewer.ends_with("and 6 more): config.json and model.mpk disagree"),
            "{fewer}"
        );
        let more = load(3).unwrap_err();
        assert!(
            more.starts_with("config.json declares 9 parameters model.mpk lacks (layers.2."),
            "{more}"
        );
    }

    #[test]
    fn transposed_moves_every_element() {
        for (rows, cols) in [(37, 70), (64, 32), (1, 5), (5, 1)] {
            let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(floats(&bytes, |v| v), values);
            let t = transposed(&bytes, rows, cols, |v| v);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(t[c * rows + r], values[r * cols + c]);
                }
            }
        }
    }
}
