//! The artifact directory the converter writes and the runtime reads: its file names, its
//! manifest (defined once here, for both sides) and record loading.
//!
//! `manifest.json` is written last and removed first by the converter, so it doubles as the
//! "complete" marker: a directory without one, or whose files differ in size from it, is an
//! interrupted conversion and is refused.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, LlamaConfig};
use crate::model::Llama;
use crate::params::params;

/// The Burn record of the model's parameters.
pub const MODEL_FILE: &str = "model.mpk";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const CONFIG_FILE: &str = "config.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Bumped whenever the meaning of the artifact's files changes.
pub const FORMAT_VERSION: u32 = 1;

/// The recorder every artifact is saved and loaded with.
pub type ArtifactRecorder = NamedMpkFileRecorder<FullPrecisionSettings>;

/// Errors reading an artifact directory.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{0}: no {MANIFEST_FILE}; the artifact is missing or its conversion did not finish (run `just convert`)"
    )]
    NoManifest(PathBuf),
    #[error("{path} is not a valid manifest: {error}")]
    BadManifest {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path} has {actual} bytes, the manifest says {expected}: truncated or replaced")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{path}: unsupported artifact format {found} (this runtime reads {FORMAT_VERSION}); convert again"
    )]
    Format { path: PathBuf, found: u32 },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: cannot load the record: {message}")]
    Record { path: PathBuf, message: String },
}

/// One file with its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDigest {
    pub name: String,
    pub sha256: String,
    pub bytes: u64,
}

/// Token ids of a fixed text, so a changed tokenizer shows up as a manifest difference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub text: String,
    pub token_ids: Vec<u32>,
}

/// `manifest.json`: what was converted, by which converter, into which files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    /// `converter <version>`.
    pub converter: String,
    /// The checkpoint files read, by name within the checkpoint directory.
    pub source: Vec<FileDigest>,
    /// The artifact files, by name within the artifact directory (the manifest excluded).
    pub files: Vec<FileDigest>,
    pub probe: Probe,
}

impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Self, ArtifactError> {
        let path = dir.join(MANIFEST_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ArtifactError::NoManifest(dir.to_path_buf()));
            }
            Err(error) => return Err(ArtifactError::Io { path, error }),
        };
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|error| ArtifactError::BadManifest {
                path: path.clone(),
                error,
            })?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(ArtifactError::Format {
                path,
                found: manifest.format_version,
            });
        }
        Ok(manifest)
    }

    /// The manifest as written to disk: pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a manifest always serializes");
        text.push('\n');
        text
    }

    /// Cheap completeness check for loading: every listed file exists with its size.
    /// (`converter verify` checks the digests.)
    pub fn check_sizes(&self, dir: &Path) -> Result<(), ArtifactError> {
        for file in &self.files {
            let path = dir.join(&file.name);
            let actual = std::fs::metadata(&path)
                .map_err(|error| ArtifactError::Io {
                    path: path.clone(),
                    error,
                })?
                .len();
            if actual != file.bytes {
                return Err(ArtifactError::SizeMismatch {
                    path,
                    expected: file.bytes,
                    actual,
                });
            }
        }
        Ok(())
    }
}

/// Loads a converted model: checks the manifest marks the directory complete, reads the
/// config and loads `model.mpk` into the Burn module.
pub fn load_model<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(Llama<B>, LlamaConfig), ArtifactError> {
    let manifest = Manifest::read(dir)?;
    manifest.check_sizes(dir)?;
    let config = LlamaConfig::from_file(&dir.join(CONFIG_FILE))?;
    let path = dir.join(MODEL_FILE);
    let model = config.init::<B>(device);
    // Burn loads a record's tensors whatever their shapes; a mismatch would only surface
    // as a panic deep in a matmul, so compare with what config.json implies.
    let expected = params::<B, _>(&model);
    let loaded =
        without_panic_message(|| model.load_file(path.clone(), &ArtifactRecorder::new(), device));
    let model = match loaded {
        Ok(Ok(model)) => model,
        Ok(Err(e)) => {
            return Err(ArtifactError::Record {
                path,
                message: first_line(&format!("{e:?}")),
            });
        }
        Err(panic) => {
            return Err(ArtifactError::Record {
                path,
                message: format!("the file is corrupt ({panic}); run `converter verify`"),
            });
        }
    };
    for (want, got) in expected.iter().zip(params::<B, _>(&model)) {
        if want.shape != got.shape {
            return Err(ArtifactError::Record {
                path,
                message: format!(
                    "{} has shape {:?}, config.json implies {:?}",
                    want.path, got.shape, want.shape
                ),
            });
        }
    }
    Ok((model, config))
}

/// Runs `f`, turning a panic into `Err(message)` without printing it.
///
/// Burn's record loading trusts the file: a corrupt parameter id or a tensor whose bytes
/// disagree with its shape panics inside Burn (`ParamId::deserialize`, `TensorData`)
/// instead of returning an error. The size check before catches truncation; this catches
/// corruption, so a damaged model.mpk is one error line, not a backtrace.
fn without_panic_message<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic while decoding".into())
    })
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}
