//! The artifact directory's manifest, defined once here for the converter that writes it and
//! the runtime that reads it (file names in [`crate::util::file_names`], loading in
//! [`crate::weights::artifact`]).
//!
//! `manifest.json` is written last and removed first by the converter, so it doubles as the
//! "complete" marker: a directory without one, or whose files differ in size from it, is an
//! interrupted conversion and is refused.
//!
//! One definition of a complete artifact, enforced by `converter verify` and by loading
//! alike ([`Manifest::read`], [`Manifest::check_files`]): the manifest lists the required
//! files and any optional ones, each once, by plain file name; no artifact file it does not
//! list is present (a stale one from an earlier conversion would otherwise be used); every
//! listed file has its listed size.

use std::path::{Path, PathBuf};

use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use serde::{Deserialize, Serialize};

use crate::model::config::ConfigError;
use crate::util::file_names::{
    BURNPACK_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, MANIFEST_FILE, MODEL_FILE, POOLING_FILE,
    TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE,
};
use crate::util::files::{FileError, read_text_bounded};

/// Bumped whenever the meaning of the artifact's files changes.
pub const FORMAT_VERSION: u32 = 1;

/// Files every artifact has, besides the manifest.
pub const REQUIRED_FILES: [&str; 3] = [MODEL_FILE, CONFIG_FILE, TOKENIZER_FILE];
/// Files an artifact has when its checkpoint had them (or, model.bpk, when asked for).
pub const OPTIONAL_FILES: [&str; 5] = [
    GENERATION_CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    WEIGHTS_FILE,
    POOLING_FILE,
    BURNPACK_FILE,
];

/// Largest manifest we read: a real one is a few KB.
pub const MANIFEST_LIMIT: u64 = 1 << 20;

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
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path}: {problem}")]
    Incomplete { path: PathBuf, problem: String },
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
    #[error("{path}: cannot load the weights: {message}")]
    Weights { path: PathBuf, message: String },
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
    /// Reads `dir/manifest.json` and checks that it describes a complete artifact: the
    /// required files and optional ones only, each once, and source files by plain name.
    pub fn read(dir: &Path) -> Result<Self, ArtifactError> {
        let path = dir.join(MANIFEST_FILE);
        let text = match read_text_bounded(&path, MANIFEST_LIMIT) {
            Ok(text) => text,
            Err(e) if e.is_not_found() => return Err(ArtifactError::NoManifest(dir.to_path_buf())),
            Err(e) => return Err(e.into()),
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
        let incomplete = |problem: String| ArtifactError::Incomplete {
            path: path.clone(),
            problem,
        };
        let mut listed = std::collections::BTreeSet::new();
        for file in &manifest.files {
            if !(REQUIRED_FILES.contains(&file.name.as_str())
                || OPTIONAL_FILES.contains(&file.name.as_str()))
            {
                return Err(incomplete(format!(
                    "lists {:?}, which is not an artifact file",
                    file.name
                )));
            }
            if !listed.insert(file.name.as_str()) {
                return Err(incomplete(format!("lists {} twice", file.name)));
            }
        }
        if let Some(missing) = REQUIRED_FILES.iter().find(|f| !listed.contains(*f)) {
            return Err(incomplete(format!("does not list {missing}")));
        }
        let mut sources = std::collections::BTreeSet::new();
        for file in &manifest.source {
            if !is_plain_file_name(&file.name) {
                return Err(incomplete(format!(
                    "source {:?} is not a plain file name",
                    file.name
                )));
            }
            if !sources.insert(file.name.as_str()) {
                return Err(incomplete(format!("lists source {} twice", file.name)));
            }
        }
        Ok(manifest)
    }

    /// The listed artifact file `name`.
    pub fn file(&self, name: &str) -> Option<&FileDigest> {
        self.files.iter().find(|f| f.name == name)
    }

    /// The manifest as written to disk: pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a manifest always serializes");
        text.push('\n');
        text
    }

    /// Cheap completeness check for loading: every listed file is a regular file of its
    /// listed size, and no artifact file the manifest does not list is there.
    /// (`converter verify` checks the digests.)
    pub fn check_files(&self, dir: &Path) -> Result<(), ArtifactError> {
        for file in &self.files {
            let path = dir.join(&file.name);
            let metadata = std::fs::metadata(&path).map_err(|error| ArtifactError::Io {
                path: path.clone(),
                error,
            })?;
            if !metadata.is_file() {
                return Err(FileError::NotRegular { path }.into());
            }
            if metadata.len() != file.bytes {
                return Err(ArtifactError::SizeMismatch {
                    path,
                    expected: file.bytes,
                    actual: metadata.len(),
                });
            }
        }
        for name in OPTIONAL_FILES {
            let listed = self.files.iter().any(|f| f.name == name);
            let path = dir.join(name);
            if !listed && std::fs::symlink_metadata(&path).is_ok() {
                return Err(ArtifactError::Incomplete {
                    path,
                    problem: format!(
                        "not listed in {MANIFEST_FILE}: left from another conversion; convert again"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A name that stays inside the directory it is joined to: no separator, not `.` or `..`.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}
