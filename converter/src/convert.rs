//! Hugging Face checkpoint → Burn record artifact.
//!
//! Everything that can be checked without reading weights is checked first (architecture,
//! every tensor's name, shape and dtype), so a bad checkpoint fails in milliseconds. Weights
//! are then decoded one tensor at a time straight into the runtime's own module, which is
//! saved with the runtime's recorder: record field paths can't drift from the model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail, ensure};
use runtime::artifact::{
    CONFIG_FILE, FORMAT_VERSION, GENERATION_CONFIG_FILE, MANIFEST_FILE, MODEL_FILE, Manifest,
    TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};
use runtime::config::{HfConfig, LlamaConfig};
use runtime::model::Llama;
use runtime::params::params;
use safetensors::Dtype;

use crate::checkpoint::Checkpoint;
use crate::digest::{PROBE_TEXT, digests, probe};
use crate::names::{self, Transform};
use crate::record::{B, Source, load_weights, save_record};
use crate::staging::Staging;

/// Files copied from the checkpoint into the artifact: (name, required).
const SIDE_FILES: &[(&str, bool)] = &[
    (CONFIG_FILE, true),
    (GENERATION_CONFIG_FILE, false),
    (TOKENIZER_FILE, true),
    (TOKENIZER_CONFIG_FILE, false),
];

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
        probe: probe(&staging.path(""), PROBE_TEXT)?,
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
    let mut sources = BTreeMap::new();
    // Every name the model's parameters have in a checkpoint (lm_head's too when tied).
    let mut known = BTreeSet::new();
    for param in params::<B, _>(model) {
        let (mut hf_name, transform) = names::to_hf(&param)
            .ok_or_else(|| anyhow!("no name rule for Burn parameter {}", param.path))?;
        known.insert(hf_name.clone());
        if hf_name == names::LM_HEAD && config.tie_word_embeddings {
            // Tied: lm_head is the embedding, transposed to [hidden, vocab].
            hf_name = names::EMBEDDING.to_string();
        }
        let meta = checkpoint
            .tensors
            .get(&hf_name)
            .ok_or_else(|| anyhow!("missing tensor {hf_name}"))?;
        let shape = &param.shape;
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
        sources.insert(param.path, Source { hf_name, transform });
    }
    for name in checkpoint.tensors.keys() {
        if names::is_ignored(name) || known.contains(name) {
            continue;
        }
        // A layer's tensor that layer 0 has too: the checkpoint has more layers.
        let of_another_layer = names::split_layer(name)
            .is_some_and(|(_, rest)| known.contains(&format!("model.layers.0.{rest}")));
        if of_another_layer {
            bail!(
                "tensor {name} does not fit config.json ({} layers)",
                config.num_layers
            );
        }
        bail!("unmapped tensor {name}: not part of a Llama checkpoint");
    }
    Ok(sources)
}
