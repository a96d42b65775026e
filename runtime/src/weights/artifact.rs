//! Opening an artifact directory: its manifest checked (the directory complete), config.json
//! read, then the model loaded from the first file the manifest lists of: the weights file
//! (laid out already), model.bpk (the record's values, mapped), the record.

use std::path::Path;

use crate::model::backend::KernelBackend;
use crate::model::config::LlamaConfig;
use crate::model::llama::Llama;
use crate::model::params::params;
use crate::util::file_names::{BURNPACK_FILE, CONFIG_FILE, MODEL_FILE, WEIGHTS_FILE};
use crate::weights::burnpack::Burnpack;
use crate::weights::file::{WeightsFile, WeightsMemory};
use crate::weights::layout::{Kept, Weights};
use crate::weights::load::{Progress, Source, check_burnpack, check_laid_out, load_watched};
use crate::weights::manifest::{ArtifactError, Manifest};
use crate::weights::record::Record;

/// Loads a converted model: checks the manifest marks the directory complete, reads the
/// config and loads `model.mpk` into the Burn module, matrices kept as bf16 where that is
/// exact ([`Weights::Auto`]).
pub fn load_model<B: KernelBackend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, LlamaConfig), ArtifactError> {
    let (model, config, _) = load_model_with(dir, device, Weights::Auto)?;
    Ok((model, config))
}

/// config.json's parameter count against the record's size, checked before the model is
/// built, which config.json alone sizes: the record holds every parameter as an f32.
fn check_parameter_count(
    dir: &Path,
    manifest: &Manifest,
    config: &LlamaConfig,
) -> Result<(), ArtifactError> {
    let record_bytes = manifest.file(MODEL_FILE).map_or(0, |f| f.bytes);
    let parameters = config.parameter_count();
    if parameters * 4 > u128::from(record_bytes) {
        return Err(ArtifactError::Record {
            path: dir.join(MODEL_FILE),
            message: format!(
                "config.json implies {parameters} parameters, more than the record's {record_bytes} bytes hold: config.json and model.mpk disagree"
            ),
        });
    }
    Ok(())
}

/// The artifact's weights file in `memory` (a copy counted in `progress`), its index
/// checked, and laid out from the record the manifest lists.
fn open_weights(
    dir: &Path,
    manifest: &Manifest,
    memory: WeightsMemory,
    progress: &Progress,
) -> Result<WeightsFile, ArtifactError> {
    let corrupt = |message| {
        let message = format!("the file is corrupt ({message}); run `converter verify`");
        weights_error(dir, message)
    };
    // Decided once, from the size the manifest lists (check_files held the file to it).
    let bytes = manifest.file(WEIGHTS_FILE).map_or(0, |f| f.bytes);
    let copy = memory
        .copies(bytes)
        .map_err(|message| weights_error(dir, message))?;
    if copy {
        progress.start(bytes);
    }
    let path = dir.join(WEIGHTS_FILE);
    let file = WeightsFile::open_in(&path, copy, |bytes| progress.add(bytes)).map_err(corrupt)?;
    // A read manifest lists the record.
    let record = manifest.file(MODEL_FILE);
    let (bytes, sha256) = record.map_or((0, ""), |f| (f.bytes, f.sha256.as_str()));
    file.check_record(bytes, sha256)
        .map_err(|message| weights_error(dir, message))?;
    Ok(file)
}

fn weights_error(dir: &Path, message: String) -> ArtifactError {
    ArtifactError::Weights {
        path: dir.join(WEIGHTS_FILE),
        message,
    }
}

/// The artifact's weights file, if the manifest lists one, checked as loading checks it
/// (header, index, the record it was laid out from, every tensor against `config`) without
/// loading it: for `converter verify`.
pub fn check_weights_file(
    dir: &Path,
    manifest: &Manifest,
    config: &LlamaConfig,
) -> Result<(), ArtifactError> {
    if manifest.file(WEIGHTS_FILE).is_none() {
        return Ok(());
    }
    check_parameter_count(dir, manifest, config)?;
    let file = open_weights(dir, manifest, WeightsMemory::Mapped, &Progress::default())?;
    let model = config.init::<crate::FlexBackend>(&Default::default());
    check_laid_out(&file, &params(&model), config.tie_word_embeddings)
        .map_err(|message| weights_error(dir, message))
}

/// The artifact's model.bpk mapped, its header and metadata checked.
fn open_burnpack(dir: &Path) -> Result<Burnpack, ArtifactError> {
    Burnpack::open(&dir.join(BURNPACK_FILE)).map_err(|message| {
        let message = format!("the file is corrupt ({message}); run `converter verify`");
        burnpack_error(dir, message)
    })
}

fn burnpack_error(dir: &Path, message: String) -> ArtifactError {
    ArtifactError::Weights {
        path: dir.join(BURNPACK_FILE),
        message,
    }
}

/// The artifact's model.bpk, if the manifest lists one, checked as loading checks it (header,
/// metadata, the same parameters as the model of `config`, each of its shape) without
/// loading it: for `converter verify`.
pub fn check_burnpack_file(
    dir: &Path,
    manifest: &Manifest,
    config: &LlamaConfig,
) -> Result<(), ArtifactError> {
    if manifest.file(BURNPACK_FILE).is_none() {
        return Ok(());
    }
    check_parameter_count(dir, manifest, config)?;
    let pack = open_burnpack(dir)?;
    let model = config.init::<crate::FlexBackend>(&Default::default());
    check_burnpack(&pack, &params(&model)).map_err(|message| burnpack_error(dir, message))
}

/// [`load_model`] with the matrices kept as `weights` says, and what each was kept as. From
/// the weights file when the manifest lists one, else from model.bpk if it lists that, else
/// from the record.
pub fn load_model_with<B: KernelBackend>(
    dir: &Path,
    device: &B::Device,
    weights: Weights,
) -> Result<(Llama<B>, LlamaConfig, Kept), ArtifactError> {
    load_model_watched(
        dir,
        device,
        weights,
        WeightsMemory::default(),
        &Progress::default(),
    )
}

/// [`load_model_with`], the weights file in `memory`, counting each parameter made in
/// `progress` (or the bytes copied, for [`WeightsMemory::Copied`]).
pub fn load_model_watched<B: KernelBackend>(
    dir: &Path,
    device: &B::Device,
    weights: Weights,
    memory: WeightsMemory,
    progress: &Progress,
) -> Result<(Llama<B>, LlamaConfig, Kept), ArtifactError> {
    let manifest = Manifest::read(dir)?;
    manifest.check_files(dir)?;
    let config = LlamaConfig::from_file(&dir.join(CONFIG_FILE))?;
    check_parameter_count(dir, &manifest, &config)?;
    let record_path = dir.join(MODEL_FILE);
    let load = |source| {
        load_watched(
            source,
            config.init::<B>(device),
            config.tie_word_embeddings,
            weights,
            device,
            progress,
        )
    };
    let (model, kept) = if manifest.file(WEIGHTS_FILE).is_some() {
        // Only tensors used where they lie are worth a copy (as only they are populated
        // in `load_watched`); others are read once to make their own buffers.
        let memory = match weights {
            Weights::Auto if B::BF16_WEIGHTS => memory,
            _ => WeightsMemory::Mapped,
        };
        let file = open_weights(dir, &manifest, memory, progress)?;
        // Every tensor is checked against config.json before any is used.
        load(Source::LaidOut(&file)).map_err(|message| weights_error(dir, message))?
    } else if manifest.file(BURNPACK_FILE).is_some() {
        let pack = open_burnpack(dir)?;
        load(Source::Burnpack(&pack)).map_err(|message| burnpack_error(dir, message))?
    } else {
        let corrupt = |message: String| ArtifactError::Record {
            path: record_path.clone(),
            message: format!("the file is corrupt ({message}); run `converter verify`"),
        };
        let record = Record::open(&record_path).map_err(corrupt)?;
        // The shapes config.json implies are compared with the record's, tensor by tensor:
        // a mismatch would otherwise surface as a panic deep in a matmul.
        load(Source::Record(&record)).map_err(|message| ArtifactError::Record {
            path: record_path.clone(),
            message,
        })?
    };
    Ok((model, config, kept))
}
