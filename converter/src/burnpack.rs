//! model.bpk: the record's parameters in Burn's burnpack format, for Burn 0.22 programs
//! (0.22 removed `burn::record`, so they cannot read model.mpk). Written by burn-store's own
//! `BurnpackWriter`, with what `BurnpackStore` would give it for the module (its tensor
//! snapshots in module order, paths, param ids, metadata), so the bytes are Burn's
//! (tests/burnpack.rs compares them with `BurnpackStore::save` of the loaded record).
//!
//! Memory: the writer asks each snapshot for its values only as it writes them, and drops
//! them after; every snapshot reads its tensor from the record just written when asked,
//! with a positioned read (not through the record's map, whose pages would count in memory
//! beside the copy): one tensor in memory at a time. (The record itself is written in
//! blocks of a tensor; the writer takes whole tensors, so the peak is the largest one.)

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::rc::Rc;

use anyhow::{Context, Result, anyhow};
use burn::tensor::{DType, TensorData};
use burn_store::{
    BurnpackStore, BurnpackWriter, ModuleSnapshot, TensorSnapshot, TensorSnapshotError,
};
use runtime::model::llama::Llama;
use runtime::util::file_names::BURNPACK_FILE;
use runtime::weights::record::Record;

use crate::record::{B, param_id, with_placeholders};

/// Writes `path`, the burnpack of `model` (built by `LlamaConfig::init`, nothing allocated)
/// with the values of the record at `record`.
pub fn write_burnpack(model: Llama<B>, record_path: &Path, path: &Path) -> Result<()> {
    let record =
        Record::open(record_path).map_err(|e| anyhow!("cannot read back the record: {e}"))?;
    let file = std::fs::File::open(record_path)
        .with_context(|| format!("cannot read back {}", record_path.display()))?;
    let record = Rc::new((record, file));
    // The record's ids, and zeroed values never read: each snapshot reads the record.
    let (model, _) = with_placeholders(model);
    let snapshots = (model.collect(None, None, false).into_iter())
        .map(|snapshot| from_record(snapshot, record.clone()))
        .collect();
    let mut writer = BurnpackWriter::new(snapshots);
    for (key, value) in BurnpackStore::default_metadata() {
        writer = writer.with_metadata(&key, &value);
    }
    let written = writer.write_to_file(path);
    written.map_err(|e| anyhow!("cannot write {BURNPACK_FILE}: {e}"))?;
    // The writer flushes but does not sync; a short file must not look written.
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {BURNPACK_FILE}"))?;
    file.sync_all()
        .with_context(|| format!("cannot write {BURNPACK_FILE}"))
}

/// `snapshot` (its path, shape, id) with its values read from `record` (parsed, and its
/// file) when asked.
fn from_record(snapshot: TensorSnapshot, record: Rc<(Record, File)>) -> TensorSnapshot {
    let path = snapshot.full_path();
    // Collected from a module, every snapshot has its parameter's id.
    let id = snapshot.tensor_id.unwrap_or_else(|| param_id(&path));
    let shape = snapshot.shape.clone();
    let values = move || {
        let (record, file) = &*record;
        let param = record
            .param(&path)
            .map_err(TensorSnapshotError::DataError)?;
        if param.shape != shape.as_slice() {
            return Err(TensorSnapshotError::DataError(format!(
                "{path} has shape {:?} in the record, the module {:?}",
                param.shape,
                shape.as_slice()
            )));
        }
        let range = param.file_range();
        let mut bytes = vec![0u8; range.len()];
        let read = file.read_exact_at(&mut bytes, range.start as u64);
        read.map_err(|e| TensorSnapshotError::IoError(format!("{path}: {e}")))?;
        Ok(TensorData::from_bytes_vec(bytes, shape.clone(), DType::F32))
    };
    TensorSnapshot::from_closure(
        Rc::new(values),
        DType::F32,
        snapshot.shape.clone(),
        snapshot.path_stack.unwrap_or_default(),
        snapshot.container_stack.unwrap_or_default(),
        id,
    )
}
