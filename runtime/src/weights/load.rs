//! Loading a model's parameters into the layout the kernels read (`crate::weights::layout`): from
//! the weights file (`crate::weights::file`), laid out once by the converter, as tensors
//! over its map; or from the record (`crate::weights::record`) or its burnpack copy
//! (`crate::weights::burnpack`), each parameter laid out here from the mapped file (a
//! burnpack's f32 vectors and embedding kept f32 are tensors over its map).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{
    AllocationProperty, Bytes, DType, Tensor, TensorCreationOptions, TensorData, TensorPrimitive,
    bf16,
};
use kernels::quant::BlockType;
use rayon::prelude::*;

use crate::model::backend::KernelBackend;
use crate::model::llama::Llama;
use crate::model::params::{FieldPath, ParamInfo, params};
use crate::util::arena::Arena;
use crate::util::file_names::{BURNPACK_FILE, MODEL_FILE, WEIGHTS_FILE};
use crate::weights::burnpack::Burnpack;
use crate::weights::file::{Dtype, TIED_LM_HEAD, WeightsFile};
use crate::weights::layout::{Form, Kept, Layout, Weights, narrowed, widened};
use crate::weights::record::Record;

/// Where the parameters come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// model.mpk: f32, as the checkpoint gave them; each laid out while loading.
    Record(&'a Record),
    /// model.bpk: the record's values in Burn's burnpack format; laid out while loading.
    Burnpack(&'a Burnpack),
    /// weights.bin: laid out by the converter as [`Weights::Auto`] keeps them.
    LaidOut(&'a WeightsFile),
}

impl Source<'_> {
    /// The bytes `path`'s parameter takes in the file (0 for one it does not hold: a tied
    /// lm_head in the weights file).
    fn stored_bytes(self, path: &str) -> u64 {
        match self {
            Source::Record(record) => record.param(path).map_or(0, |p| p.bytes.len() as u64),
            Source::Burnpack(pack) => pack.entry(path).map_or(0, |entry| entry.size()),
            Source::LaidOut(file) => file.entry(path).map_or(0, |entry| entry.bytes),
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            Source::Record(_) => MODEL_FILE,
            Source::Burnpack(_) => BURNPACK_FILE,
            Source::LaidOut(_) => WEIGHTS_FILE,
        }
    }
}

/// Fills `model` (built by `LlamaConfig::init`, nothing allocated) from `source`, each
/// parameter in the layout the model keeps it in: every projection column-major (what
/// `Llama::with_matvec_layout` makes), matrices as `weights` says where the backend
/// computes on bf16 (f32 where it does not), and with `tied` embeddings lm_head a view of
/// the embedding, a stored copy not read. Every parameter is checked against the model
/// (the set, each shape) before any tensor is made.
///
/// From the weights file, a tensor kept as stored is the file's bytes over its map, no
/// copy, on a backend that reads buffers in place (burn-flex); a matrix widened to f32 or
/// rounded to bf16 is a new buffer.
pub fn load_into<B: KernelBackend>(
    source: Source<'_>,
    model: Llama<B>,
    tied: bool,
    weights: Weights,
    device: &B::Device,
) -> Result<(Llama<B>, Kept), String> {
    load_watched(source, model, tied, weights, device, &Progress::default())
}

/// How far a load has got, in bytes of the file read, for a progress bar: the loader counts
/// as it makes each tensor, another thread reads (the library draws nothing itself).
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    /// Bytes of the parameters made so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Bytes of all the parameters: 0 until the source has been checked against them.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Starts counting afresh towards `total` bytes.
    pub(crate) fn start(&self, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    /// Counts `bytes` more done.
    pub(crate) fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// [`load_into`], counting the bytes of each parameter made in `progress`.
pub fn load_watched<B: KernelBackend>(
    source: Source<'_>,
    model: Llama<B>,
    tied: bool,
    weights: Weights,
    device: &B::Device,
    progress: &Progress,
) -> Result<(Llama<B>, Kept), String> {
    let declared = params(&model);
    match source {
        Source::Record(record) => {
            let names: Vec<String> = declared.iter().map(|p| p.path.clone()).collect();
            check_same_params(&record.param_paths(), &names, source.file_name())?;
        }
        Source::Burnpack(pack) => check_burnpack(pack, &declared)?,
        Source::LaidOut(file) => check_laid_out(file, &declared, tied)?,
    }
    // Tensors used where they lie in the map get all their pages first, so that the first
    // prompt takes no page faults: then the progress is that reading, else each tensor made.
    // (A backend without bf16 weights widens them: each is read once into a new buffer.)
    let populated = match source {
        Source::LaidOut(file) if weights == Weights::Auto && B::BF16_WEIGHTS => {
            progress.start(file.size());
            file.populate(|bytes| progress.add(bytes));
            true
        }
        _ => {
            progress.start(declared.iter().map(|p| source.stored_bytes(&p.path)).sum());
            false
        }
    };
    let weights = match weights {
        // Quantized as asked on any backend: blocks kept (BLOCK_WEIGHTS) or their values.
        Weights::Blocks(_) => weights,
        _ if B::BF16_WEIGHTS => weights,
        _ => Weights::F32,
    };
    let mut loader = Loader {
        source,
        tied,
        weights,
        kept: Kept::default(),
        device: device.clone(),
        path: FieldPath::default(),
        embedding: None,
        error: None,
        progress: (!populated).then_some(progress),
        arena: Arena::default(),
    };
    let model = model.map(&mut loader);
    if let Source::LaidOut(file) = source {
        loader.kept.mapped = populated && file.is_mapped();
    }
    match loader.error {
        Some(error) => Err(error),
        None => Ok((model, loader.kept)),
    }
}

/// The weights file's tensors against the model's parameters (`params::params`): the same
/// set (with `tied` embeddings, lm_head absent: the loader makes it a view), each of the
/// shape its layout implies (opening the file has checked that a vector is f32), blocks
/// only for projections. What the loader relies on, and what `converter verify` checks.
pub fn check_laid_out(file: &WeightsFile, params: &[ParamInfo], tied: bool) -> Result<(), String> {
    let declared: Vec<&ParamInfo> = (params.iter())
        .filter(|p| !(tied && p.path == TIED_LM_HEAD))
        .collect();
    let stored: Vec<String> = (file.index().tensors.iter())
        .map(|t| t.path.clone())
        .collect();
    let names: Vec<String> = declared.iter().map(|p| p.path.clone()).collect();
    check_same_params(&stored, &names, WEIGHTS_FILE)?;
    for param in declared {
        let entry = file.entry(&param.path).ok_or("checked: the same set")?;
        let layout = Layout::of(&param.owner, &param.shape);
        if let (Dtype::Blocks(ty), None) = (entry.dtype, layout.block_rows()) {
            return Err(format!(
                "{} is stored as {ty} blocks; only matrices can be",
                param.path
            ));
        }
        if entry.shape != layout.shape {
            // Named in the model's terms, as config.json sizes it.
            let (shape, how) = match (layout.linear, entry.shape.as_slice()) {
                (Some(_), &[rows, cols]) => (
                    vec![cols, rows],
                    format!(" (stored transposed as {:?})", entry.shape),
                ),
                _ => (entry.shape.clone(), String::new()),
            };
            return Err(format!(
                "{} has shape {shape:?}{how}, config.json implies {:?}",
                param.path, param.shape
            ));
        }
    }
    Ok(())
}

/// model.bpk's tensors against the model's parameters: the same set, each of the shape
/// config.json implies (stored as declared, f32: opening the file checked the dtypes). What
/// the loader relies on, and what `converter verify` checks.
pub fn check_burnpack(pack: &Burnpack, params: &[ParamInfo]) -> Result<(), String> {
    let names: Vec<String> = params.iter().map(|p| p.path.clone()).collect();
    check_same_params(&pack.paths(), &names, BURNPACK_FILE)?;
    for param in params {
        let shape = &pack
            .entry(&param.path)
            .ok_or("checked: the same set")?
            .shape;
        if *shape != param.shape {
            return Err(format!(
                "{} has shape {shape:?}, config.json implies {:?}",
                param.path, param.shape
            ));
        }
    }
    Ok(())
}

/// The stored parameters against the ones the model declares, both ways, before any is
/// copied: the loader reads only what the model asks for, so a file with a layer
/// config.json does not declare would otherwise load with that layer silently unread.
fn check_same_params(stored: &[String], declared: &[String], file: &str) -> Result<(), String> {
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
            "{file} holds {} config.json does not declare ({})",
            parameters(extra.len()),
            some_of(&extra)
        ));
    }
    let missing = absent_from(declared, stored);
    if !missing.is_empty() {
        problems.push(format!(
            "config.json declares {} {file} lacks ({})",
            parameters(missing.len()),
            some_of(&missing)
        ));
    }
    match problems.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{}: config.json and {file} disagree",
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
    source: Source<'a>,
    /// Where each tensor made is counted (none when the file's reading was).
    progress: Option<&'a Progress>,
    tied: bool,
    weights: Weights,
    kept: Kept,
    device: B::Device,
    path: FieldPath,
    /// The embedding, `[vocab, hidden]` (values, or blocks seen so), for a tied lm_head.
    embedding: Option<TensorPrimitive<B>>,
    /// `ModuleMapper` can't return errors: the first one is kept here.
    error: Option<String>,
    /// Huge-page memory for the tensors this load makes itself.
    arena: Arena,
}

impl<B: KernelBackend> Loader<'_, B> {
    /// The parameter at `path` (of a module of type `owner`, of shape `expected`): its id
    /// (`id` where the file keeps none) and its values in the model's layout.
    fn tensor<const D: usize>(
        &mut self,
        path: &str,
        owner: &str,
        expected: &[usize],
        id: ParamId,
    ) -> Result<(ParamId, Tensor<B, D>), String> {
        let layout = Layout::of(owner, expected);
        let check_shape = |shape: &[usize]| match shape == expected {
            true => Ok(()),
            false => Err(format!(
                "{path} has shape {shape:?}, config.json implies {expected:?}"
            )),
        };
        let (id, data, form) = match self.source {
            Source::Record(record) => {
                let stored = record.param(path)?;
                check_shape(&stored.shape)?;
                let id = ParamId::try_deserialize(stored.id)
                    .ok_or_else(|| format!("{path} has a corrupt parameter id"))?;
                if self.tied && path == TIED_LM_HEAD {
                    return Ok((id, self.tied_lm_head()?));
                }
                let form = layout.form(stored.bytes, self.weights);
                let data = layout.lay_out(stored.bytes, form);
                record.release(&stored);
                let (data, form) = self.tied_embedding(path, &layout, data, form);
                (id, data, form)
            }
            Source::Burnpack(pack) => {
                let entry = pack.entry(path).ok_or("checked: the same set")?;
                check_shape(&entry.shape)?;
                // Written from the record, with its ids; a file without them gets the model's.
                let id = entry.param_id.map_or(id, ParamId::from);
                if self.tied && path == TIED_LM_HEAD {
                    return Ok((id, self.tied_lm_head()?));
                }
                let bytes = pack.bytes(entry);
                let form = layout.form(&bytes, self.weights);
                // Kept as stored (f32, not transposed): used where it lies in the map.
                let as_stored = form == Form::F32 && layout.linear.is_none();
                let data = match as_stored {
                    true => kept_as_stored::<B>(bytes.clone(), layout.shape.clone(), DType::F32),
                    false => layout.lay_out(&bytes, form),
                };
                let (data, kept) = self.tied_embedding(path, &layout, data, form);
                let over_map = as_stored && B::BF16_WEIGHTS && kept == form;
                if !over_map {
                    // SAFETY: the burnpack's tensors lie in its read-only private map.
                    unsafe { crate::util::files::release_mapped(&bytes) };
                }
                (id, data, kept)
            }
            Source::LaidOut(file) => {
                if self.tied && path == TIED_LM_HEAD {
                    return Ok((id, self.tied_lm_head()?));
                }
                // `check_laid_out` has compared the file's tensors with the model's.
                let entry = file.entry(path).ok_or("checked: the same set")?;
                let (data, form) = self.kept_from_file(file.bytes(entry), entry.dtype, &layout)?;
                let (data, quantized) = self.tied_embedding(path, &layout, data, form);
                if quantized != form {
                    // SAFETY: the weights file's tensors lie in its read-only private map.
                    unsafe { crate::util::files::release_mapped(&file.bytes(entry)) };
                }
                (id, data, quantized)
            }
        };
        self.kept.count(&layout, form);
        let data = self.in_arena(data)?;
        if let Form::Blocks(ty) = form {
            let bytes = data.bytes.len();
            let tensor = match (layout.linear, layout.shape.as_slice()) {
                (Some((d_in, d_out)), _) => {
                    self.kept.block_bytes += bytes;
                    B::blocks_matrix(ty, data.bytes, [d_in, d_out], &self.device)
                }
                // The embedding, `[vocab, hidden]`: kept in the orientation of the lm_head it
                // may also be (rows of hidden), seen transposed; its rows looked up by
                // `KernelBackend::embed`.
                (None, &[vocab, hidden]) => {
                    if self.tied {
                        self.kept.block_bytes += bytes;
                    }
                    let tensor = B::blocks_matrix(ty, data.bytes, [hidden, vocab], &self.device);
                    let tensor = tensor.transpose();
                    self.embedding = Some(tensor.clone().into_primitive());
                    tensor
                }
                _ => return Err(format!("{path} is kept as {ty} blocks but is not a matrix")),
            };
            return Ok((id, Tensor::from_primitive(tensor.into_primitive())));
        }
        let options = TensorCreationOptions::new(self.device.clone()).with_dtype(form.dtype());
        let tensor = Tensor::<B, D>::from_data(data, options);
        let tensor = match layout.linear {
            Some(_) => tensor.transpose(),
            None => tensor,
        };
        if path == "embed_tokens.weight" {
            self.embedding = Some(tensor.clone().into_primitive());
        }
        Ok((id, tensor))
    }

    /// `data` moved into huge-page memory if this load made it (quantized, widened, rounded,
    /// laid out: the allocator's memory) on a backend that uses tensors where they lie;
    /// tensors over weights.bin or a map stay where they are. Decoding reads every weight
    /// once a token, at about half the rate from 4 KiB pages (`util::arena`).
    fn in_arena(&mut self, data: TensorData) -> Result<TensorData, String> {
        if !B::BF16_WEIGHTS || data.bytes.property() != AllocationProperty::Native {
            return Ok(data);
        }
        let held = (self.arena.hold(&data.bytes))
            .map_err(|e| format!("cannot allocate memory for the weights: {e}"))?;
        let bytes = Bytes::from_shared(held, AllocationProperty::Other);
        Ok(TensorData::from_bytes(bytes, data.shape, data.dtype))
    }

    /// Quantizing at load (`Weights::Blocks`) a model with tied embeddings: the embedding,
    /// which is also the lm_head, as Q8_0 blocks, whatever the projections' type, as
    /// llama-quantize keeps that tensor at 6 or 8 bits (Q6_K, or Q8_0 where rows are not
    /// whole 256-value blocks; Q6_K's scale search would take seconds at load here). One
    /// copy read both ways, a quarter of bf16's bytes less than a bf16 embedding beside a
    /// quantized lm_head. Any other parameter passes through.
    fn tied_embedding(
        &self,
        path: &str,
        layout: &Layout,
        data: TensorData,
        form: Form,
    ) -> (TensorData, Form) {
        let ty = BlockType::Q8_0;
        let hidden = layout.shape.last().copied().unwrap_or(0);
        let quantizing = matches!(self.weights, Weights::Blocks(_));
        if !(self.tied && quantizing && path == "embed_tokens.weight")
            || matches!(form, Form::Blocks(_))
            || ty.row_bytes(hidden).is_none()
        {
            return (data, form);
        }
        let blocks = match data.as_slice::<bf16>() {
            Ok(rows) => crate::weights::layout::quantized_from(rows, hidden, ty, bf16::to_f32),
            Err(_) => {
                let rows = data.convert::<f32>();
                let rows = rows.as_slice::<f32>().expect("converted to f32");
                crate::weights::layout::quantized(rows, hidden, ty)
            }
        };
        let len = blocks.len();
        (TensorData::new(blocks, [len]), Form::Blocks(ty))
    }

    /// A tied lm_head: the embedding seen transposed, `[hidden, vocab]` (its blocks, where the
    /// embedding is kept as blocks, as [`Self::tied_embedding`] keeps it when quantizing).
    fn tied_lm_head<const D: usize>(&mut self) -> Result<Tensor<B, D>, String> {
        let embedding = (self.embedding.clone()).ok_or("lm_head comes before the embedding")?;
        let embedding = Tensor::<B, 2>::from_primitive(embedding);
        Ok(Tensor::from_primitive(
            embedding.transpose().into_primitive(),
        ))
    }

    /// A tensor of the weights file as `self.weights` keeps it: as stored (over the map on
    /// a backend that reads buffers in place), a bf16 matrix widened to f32 (`Weights::F32`)
    /// or an f32 one rounded to bf16 (`Weights::Bf16`).
    ///
    /// A projection stored as blocks (imported from a quantized GGUF): kept as those blocks
    /// over the map under `Weights::Auto`, and under `Weights::Blocks` of its own type;
    /// decoded to f32 (its exact values) under `Weights::F32`, and rounded from those to
    /// bf16 under `Weights::Bf16`; under `Weights::Blocks` of another type, decoded and
    /// quantized again to that type (which loses precision twice: a GGUF of the wanted type
    /// made from the original weights is better).
    fn kept_from_file(
        &self,
        bytes: bytes::Bytes,
        stored: Dtype,
        layout: &Layout,
    ) -> Result<(TensorData, Form), String> {
        let shape = layout.shape.clone();
        let misaligned = |e| format!("a tensor of the weights file is misaligned ({e:?})");
        Ok(match (stored, self.weights) {
            (_, Weights::Blocks(ty))
                if layout.form(&[], self.weights) == Form::Blocks(ty)
                    && stored != Dtype::Blocks(ty) =>
            {
                // Laid out already: rows of d_in, each quantized.
                let (d_in, d_out) = layout.linear.expect("blocks are projections");
                let blocks = match stored {
                    Dtype::F32 => {
                        let rows =
                            bytemuck::try_cast_slice::<u8, f32>(&bytes).map_err(misaligned)?;
                        crate::weights::layout::quantized(rows, d_in, ty)
                    }
                    Dtype::Bf16 => {
                        let rows =
                            bytemuck::try_cast_slice::<u8, bf16>(&bytes).map_err(misaligned)?;
                        crate::weights::layout::quantized_from(rows, d_in, ty, bf16::to_f32)
                    }
                    Dtype::Blocks(stored) => {
                        crate::weights::layout::quantized(&decoded(&bytes, stored, d_in), d_in, ty)
                    }
                };
                // SAFETY: the weights file's tensors lie in its read-only private map.
                unsafe { crate::util::files::release_mapped(&bytes) };
                let row_bytes = blocks.len() / d_out.max(1);
                (
                    TensorData::new(blocks, [d_out, row_bytes]),
                    Form::Blocks(ty),
                )
            }
            (Dtype::Bf16, Weights::F32) => {
                let values = bytemuck::try_cast_slice::<u8, bf16>(&bytes).map_err(misaligned)?;
                (TensorData::new(widened(values), shape), Form::F32)
            }
            (Dtype::F32, Weights::Bf16) if layout.matrix => {
                let values = bytemuck::try_cast_slice::<u8, f32>(&bytes).map_err(misaligned)?;
                let (values, form) = narrowed(values);
                (TensorData::new(values, shape), form)
            }
            (Dtype::Blocks(ty), Weights::F32 | Weights::Bf16) => {
                let values = decoded(&bytes, ty, shape[1]);
                // SAFETY: the weights file's tensors lie in its read-only private map.
                unsafe { crate::util::files::release_mapped(&bytes) };
                match self.weights {
                    Weights::F32 => (TensorData::new(values, shape), Form::F32),
                    _ => {
                        let (values, form) = narrowed(&values);
                        (TensorData::new(values, shape), form)
                    }
                }
            }
            (stored, _) => {
                let form = stored.form();
                // Blocks are bytes: `[d_out, row bytes]`.
                let shape = match stored {
                    Dtype::Blocks(_) => vec![shape[0], bytes.len() / shape[0].max(1)],
                    _ => shape,
                };
                (kept_as_stored::<B>(bytes, shape, form.dtype()), form)
            }
        })
    }
}

/// Rows of `ty` blocks decoded to their values, rows of `d_in`, in parallel.
fn decoded(blocks: &[u8], ty: BlockType, d_in: usize) -> Vec<f32> {
    const ROWS: usize = 16;
    let row_bytes = ty
        .row_bytes(d_in)
        .expect("checked when the file was opened");
    let mut values = vec![0.0; blocks.len() / row_bytes.max(1) * d_in];
    (values.par_chunks_mut(ROWS * d_in.max(1)))
        .zip(blocks.par_chunks(ROWS * row_bytes.max(1)))
        .for_each(|(values, blocks)| ty.decode(blocks, values));
    values
}

/// A tensor's bytes as they are: over the map where the backend reads a buffer in place
/// (the bf16-weight backend, burn-flex, whose tensors share their buffer and copy it before
/// any write, so the read-only map is never written through); a copy of its own for
/// burn-ndarray, which would otherwise copy a buffer it does not own on every operation.
fn kept_as_stored<B: KernelBackend>(
    bytes: bytes::Bytes,
    shape: Vec<usize>,
    dtype: DType,
) -> TensorData {
    if B::BF16_WEIGHTS {
        TensorData::from_bytes(
            Bytes::from_shared(bytes, AllocationProperty::File),
            shape,
            dtype,
        )
    } else {
        TensorData::from_bytes_vec(bytes.to_vec(), shape, dtype)
    }
}

impl<B: KernelBackend> ModuleMapper<B> for Loader<'_, B> {
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
        match self.tensor::<D>(&path, &owner, &expected, param.id) {
            Ok((id, tensor)) => {
                if let Some(progress) = self.progress {
                    let bytes = self.source.stored_bytes(&path);
                    progress.done.fetch_add(bytes, Ordering::Relaxed);
                }
                Param::initialized(id, tensor)
            }
            Err(error) => {
                self.error = Some(error);
                param
            }
        }
    }
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
        let config =
            |layers| crate::model::config::LlamaConfig::plain([8, 16, layers], [2, 1, 4], 10, 16);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.mpk");
        let model = config(2).init::<B>(&device);
        crate::weights::manifest::ArtifactRecorder::new()
            .record(model.into_record(), path.clone())
            .unwrap();
        let record = Record::open(&path).unwrap();
        let load = |layers| {
            let model = config(layers).init::<B>(&device);
            load_into(
                Source::Record(&record),
                model,
                false,
                Weights::Auto,
                &device,
            )
            .map(|_| ())
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
}
