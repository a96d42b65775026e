//! `converter verify`: an artifact (and its source checkpoint) against its manifest.

use std::path::Path;

use anyhow::Result;
use runtime::model::config::LlamaConfig;
use runtime::util::file_names::{CONFIG_FILE, TOKENIZER_FILE};
use runtime::weights::artifact::{check_burnpack_file, check_weights_file};
use runtime::weights::manifest::{FileDigest, Manifest};

use crate::convert::{Render, check_side_files, source_digests};
use crate::digest::{digest_file, probe};
use crate::import::Imported;

/// Differences between the artifact in `out` (and, if given, the checkpoint in `src`, a
/// directory or the GGUF it was imported from) and the manifest, one line each; empty when
/// everything matches.
pub fn verify(out: &Path, src: Option<&Path>, render: &Render) -> Result<Vec<String>> {
    let manifest = Manifest::read(out)?;
    let mut problems = Vec::new();
    if let Err(e) = manifest.check_files(out) {
        problems.push(e.to_string());
    }
    let mut check = |dir: &Path, expected: &[FileDigest], what: &str| {
        for file in expected {
            let path = dir.join(&file.name);
            match digest_file(&path) {
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
    match src {
        // A GGUF converted in one step: the files its import would write, recomputed.
        Some(gguf) if gguf.is_file() => {
            let digests = source_digests(&Imported::open(gguf)?)?;
            // Each file one side has and the other has not, or has with other bytes.
            let mut differ: Vec<&str> = (digests.iter().filter(|f| !manifest.source.contains(f)))
                .chain(manifest.source.iter().filter(|f| !digests.contains(f)))
                .map(|file| file.name.as_str())
                .collect();
            differ.sort_unstable();
            differ.dedup();
            if !differ.is_empty() {
                problems.push(format!(
                    "source {}: the checkpoint it imports as differs from the manifest's source in {}",
                    gguf.display(),
                    differ.join(", ")
                ));
            }
        }
        Some(src) => check(src, &manifest.source, "source"),
        None => {}
    }
    let config = LlamaConfig::from_file(&out.join(CONFIG_FILE));
    if let Ok(config) = &config {
        let checks = [check_weights_file, check_burnpack_file];
        let errors = checks
            .iter()
            .filter_map(|check| check(out, &manifest, config).err());
        problems.extend(errors.map(|e| e.to_string()));
    }
    let tokenizer = config
        .map_err(anyhow::Error::from)
        .and_then(|config| check_side_files(out, &config, render));
    let tokenizer = match tokenizer {
        Ok(tokenizer) => tokenizer,
        Err(e) => {
            problems.push(format!("{e:#}"));
            return Ok(problems);
        }
    };
    let tokenizer_path = out.join(TOKENIZER_FILE);
    match probe(&tokenizer, &manifest.probe.text) {
        Ok(probe) if probe.token_ids != manifest.probe.token_ids => problems.push(format!(
            "{}: probe text tokenizes to {:?}, manifest says {:?}",
            tokenizer_path.display(),
            probe.token_ids,
            manifest.probe.token_ids
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("tokenizer probe: {e}")),
    }
    Ok(problems)
}
