//! The Burn record: the runtime's module, written with the runtime's recorder format, its
//! parameters' values streamed from the checkpoint one tensor at a time.
//!
//! Why streamed: the record is f32, twice the bytes of a bf16 checkpoint, and Burn's
//! recorder serializes a module whose tensors are all in memory: a 1B-parameter model would
//! need 5 GB of f32 tensors at once. Instead the module's parameters are placeholders
//! (zeroed allocations the OS never backs with memory until written, and nothing writes
//! them) and the file writer swaps each placeholder's bytes, as the serializer reaches
//! them, for the tensor's values decoded from the checkpoint. Memory holds one tensor at a
//! time; the bytes are those `NamedMpkFileRecorder` writes (tests/convert.rs compares them).

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;

use anyhow::{Context, Result, anyhow, bail};
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::record::{BurnRecord, FullPrecisionSettings, Record};
use burn::tensor::{Tensor, TensorData};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::model::llama::Llama;
use runtime::model::params::FieldPath;
use runtime::util::file_names::MODEL_FILE;
use runtime::weights::manifest::ArtifactRecorder;
use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;
use crate::names::Transform;
use crate::staging::{Staging, finish};

/// The converter only holds tensors; any backend would do.
pub type B = runtime::FlexBackend;

/// Where a Burn parameter comes from.
pub struct Source {
    pub hf_name: String,
    /// The block of the tensor's rows it is, if it is part of a fused one.
    pub rows: Option<std::ops::Range<usize>>,
    pub transform: Transform,
}

/// Writes the record of `model` into `staging`, each parameter (by record field path) from
/// its source in `checkpoint`. Saves exactly as `NamedMpkFileRecorder::record` would (same
/// `BurnRecord` envelope, same `rmp_serde::encode::write_named`), but through a writer
/// whose flush and fsync errors we see: the recorder drops its `BufWriter`, losing a failed
/// final write.
pub fn write_record(
    model: Llama<B>,
    checkpoint: &Checkpoint,
    sources: BTreeMap<String, Source>,
    staging: &Staging,
) -> Result<()> {
    let (model, order) = with_placeholders(model);
    let progress = ProgressBar::new(order.len() as u64).with_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} tensors")
            .expect("valid template")
            .progress_chars("=> "),
    );
    progress.set_message("converting");
    let item = model.into_record().into_item::<FullPrecisionSettings>();
    let record = BurnRecord::<_, B>::new::<ArtifactRecorder>(item);
    let mut writer = Substitute {
        file: staging.create_file(MODEL_FILE)?,
        pending: order,
        checkpoint,
        sources,
        progress,
        error: None,
    };
    let written = rmp_serde::encode::write_named(&mut writer, &record);
    writer.progress.finish_and_clear();
    if let Some(error) = writer.error {
        return Err(error);
    }
    written.context("cannot write the record")?;
    if let Some(placeholder) = writer.pending.front() {
        bail!(
            "the record's layout changed: parameter {} was not written",
            placeholder.path
        );
    }
    finish(writer.file).context("cannot write the record")
}

/// `model` with every parameter a placeholder under its record id ([`param_id`]), and the
/// placeholders in the order the record serializes them.
pub(crate) fn with_placeholders(model: Llama<B>) -> (Llama<B>, VecDeque<Placeholder>) {
    let mut placeholders = Placeholders {
        path: FieldPath::default(),
        order: VecDeque::new(),
    };
    let model = model.map(&mut placeholders);
    (model, placeholders.order)
}

/// A parameter whose values are not in memory yet.
pub(crate) struct Placeholder {
    /// Record field path, `layers.0.self_attn.q_proj.weight`.
    path: String,
    shape: Vec<usize>,
}

impl Placeholder {
    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * size_of::<f32>()
    }
}

/// Gives every parameter zeroed values and a deterministic `ParamId`, and lists them in
/// the order the record serializes them (the module's field order, as it visits them).
struct Placeholders {
    path: FieldPath,
    order: VecDeque<Placeholder>,
}

impl ModuleMapper<B> for Placeholders {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let path = self.path.path();
        let shape = param.lazy_shape().to_vec();
        // `vec![0.0; n]` is a zeroed allocation: pages the OS maps on first write only.
        let zeros = vec![0.0f32; shape.iter().product()];
        let tensor = Tensor::from_data(TensorData::new(zeros, shape.clone()), &Default::default());
        self.order.push_back(Placeholder {
            path: path.clone(),
            shape,
        });
        Param::initialized(param_id(&path), tensor)
    }
}

/// The record file's writer: passes the serializer's output through, except each
/// placeholder's bytes, which it replaces with the parameter's values.
///
/// The serializer writes a tensor's bytes with one `write_all` after their length header,
/// in the order `Placeholders` listed them; a write is taken for the next placeholder only
/// if it has that placeholder's length and is all zeros (what the placeholder holds), so a
/// change in Burn's layout fails the conversion (a placeholder left over) instead of
/// writing a wrong file.
struct Substitute<'a, W: Write> {
    file: W,
    pending: VecDeque<Placeholder>,
    checkpoint: &'a Checkpoint,
    sources: BTreeMap<String, Source>,
    progress: ProgressBar,
    /// The first error decoding a tensor (`Write` can only return `io::Error`s).
    error: Option<anyhow::Error>,
}

impl<W: Write> Substitute<'_, W> {
    /// Writes the parameter's values from the checkpoint, as little-endian f32 bytes.
    fn write_values(&mut self, placeholder: &Placeholder) -> Result<()> {
        let source = self
            .sources
            .get(&placeholder.path)
            .ok_or_else(|| anyhow!("no source planned for {}", placeholder.path))?;
        let Source {
            hf_name,
            rows,
            transform,
        } = source;
        (self.checkpoint).write_f32(hf_name, rows.clone(), *transform, &mut self.file)
    }
}

impl<W: Write> Write for Substitute<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let is_placeholder = self.pending.front().is_some_and(|next| {
            next.bytes() == buf.len() && !buf.is_empty() && buf.iter().all(|&b| b == 0)
        });
        if !is_placeholder {
            return self.file.write(buf);
        }
        let placeholder = self.pending.pop_front().expect("checked above");
        match self.write_values(&placeholder) {
            Ok(()) => {
                self.progress.inc(1);
                Ok(buf.len())
            }
            Err(error) => {
                let message = error.to_string();
                self.error = Some(error);
                Err(std::io::Error::other(message))
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Burn draws `ParamId`s at random, which would make every save differ; derive them from
/// the field path instead so the same checkpoint always gives the same bytes.
pub(crate) fn param_id(path: &str) -> ParamId {
    let digest = Sha256::digest(path.as_bytes());
    ParamId::from(u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")))
}
