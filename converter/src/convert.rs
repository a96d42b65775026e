//! Hugging Face checkpoint → Burn record artifact.
//!
//! Everything that can be checked without reading weights is checked first (architecture,
//! every tensor's name, shape and dtype), so a bad checkpoint fails in milliseconds. Weights
//! are then decoded one tensor at a time straight into the runtime's own module, which is
//! saved with the runtime's recorder: record field paths can't drift from the model.
//! A checkpoint imported from a quantized GGUF has its projections' blocks beside it
//! (`crate::blocks`): weights.bin stores those verbatim, once each is checked to decode to
//! exactly the record's values, and nothing else of the artifact refers to them.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail, ensure};
use indicatif::ProgressBar;
use kernels::quant::BlockType;
use runtime::model::config::{
    CONFIG_LIMIT, GenerationConfig, HfConfig, LlamaConfig, Pooling, TokenIds,
};
use runtime::model::llama::Llama;
use runtime::model::params::{ParamInfo, params};
use runtime::text::chat::{ChatError, ChatRequest};
use runtime::text::tokenizer::{
    TOKENIZER_CONFIG_LIMIT, TOKENIZER_LIMIT, Tokenizer, TokenizerError,
};
use runtime::util::file_names::{
    BURNPACK_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, MANIFEST_FILE, MODEL_FILE, POOLING_FILE,
    TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE,
};
use runtime::util::files::read_bounded;
use runtime::weights;
use runtime::weights::file::{RecordId, StoredBlocks};
use runtime::weights::manifest::{FORMAT_VERSION, FileDigest, Manifest, OPTIONAL_FILES};
use safetensors::Dtype;

use crate::blocks::{self, BlocksFile};
use crate::burnpack::write_burnpack;
use crate::checkpoint::Checkpoint;
use crate::digest::{PROBE_TEXT, digest_file, digest_written, digests, probe};
use crate::import::Imported;
use crate::names::{self, Transform};
use crate::pooling;
use crate::record::{B, Source, write_record};
use crate::staging::{Staging, finish_keeping};

/// Files copied from the checkpoint into the artifact: (name, required, most bytes).
const SIDE_FILES: &[(&str, bool, u64)] = &[
    (CONFIG_FILE, true, CONFIG_LIMIT),
    (GENERATION_CONFIG_FILE, false, CONFIG_LIMIT),
    (TOKENIZER_FILE, true, TOKENIZER_LIMIT),
    (TOKENIZER_CONFIG_FILE, false, TOKENIZER_CONFIG_LIMIT),
];

/// What `convert` writes besides the record, the weights file and the side files.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// model.bpk, the record's parameters in Burn's burnpack format (`crate::burnpack`).
    /// Asked for, not by default: the record is the artifact's contract, and this is the
    /// model's f32 bytes once more on disk.
    pub burnpack: bool,
}

/// Converts the checkpoint in `src` into an artifact in `out` and returns its manifest.
pub fn convert(src: &Path, out: &Path, render: &Render) -> Result<Manifest> {
    convert_with(src, out, render, Options::default())
}

/// [`convert`], writing what `options` asks for too. `src` is a checkpoint directory or a
/// GGUF file, read as the checkpoint `import-gguf` makes of it without writing one: the
/// artifact is the one `import-gguf` then `convert` give, file for file (its manifest names
/// that checkpoint's files as the source, and `verify --source` takes the GGUF).
pub fn convert_with(src: &Path, out: &Path, render: &Render, options: Options) -> Result<Manifest> {
    if src.is_file() {
        return convert_gguf(src, out, render, options);
    }
    ensure!(
        src.exists(),
        "{}: no such checkpoint directory or GGUF file",
        src.display()
    );
    let hf = HfConfig::from_file(&src.join(CONFIG_FILE))?;
    let config = LlamaConfig::from_hf(&hf)?;
    // Each side file read once, within its bound; what is copied is what was checked.
    let mut side_files = Vec::new();
    for &(name, required, limit) in SIDE_FILES {
        match read_bounded(&src.join(name), limit) {
            Ok(bytes) => side_files.push((name, bytes)),
            Err(e) if e.is_not_found() && !required => {}
            Err(e) if e.is_not_found() => bail!("{}: missing {name}", src.display()),
            Err(e) => return Err(e.into()),
        }
    }
    // The side files as the runtime will read them, checked before any weight is.
    let tokenizer = check_side_files(src, &config, render)?;
    let pooling = pooling::read(src, &hf, &config)?;
    let checkpoint = Checkpoint::open(src)?;
    // Creates `out` too (and removes it again if this run fails before finishing).
    let staging = Staging::create(out.join(".partial"), &[src])?;
    for (name, bytes) in &side_files {
        staging.write(name, bytes)?;
    }
    let checked = Checked {
        config,
        tokenizer,
        pooling,
        side_files: side_files.iter().map(|(name, _)| *name).collect(),
    };
    write_artifact(src, staging, out, checked, checkpoint, options)
}

/// [`convert_with`] of a GGUF file: its side files are written first and checked where they
/// are written, as only the artifact holds them.
fn convert_gguf(src: &Path, out: &Path, render: &Render, options: Options) -> Result<Manifest> {
    let gguf = Imported::open(src)?;
    let staging = Staging::create(out.join(".partial"), &[src])?;
    for (name, bytes) in gguf.side_files() {
        staging.write(name, bytes)?;
    }
    let dir = staging.path("");
    let check = || -> Result<Checked> {
        let hf = HfConfig::from_file(&dir.join(CONFIG_FILE))?;
        let config = LlamaConfig::from_hf(&hf)?;
        let tokenizer = check_side_files(&dir, &config, render)?;
        // No sentence-transformers files: the default pooling if config.json says embedding.
        let pooling = pooling::read(&dir, &hf, &config)?;
        let side_files = gguf.side_files().iter().map(|(name, _)| *name).collect();
        Ok(Checked {
            config,
            tokenizer,
            pooling,
            side_files,
        })
    };
    let checked = check().with_context(|| format!("{} as imported", src.display()))?;
    let checkpoint = Checkpoint::of_gguf(gguf);
    write_artifact(src, staging, out, checked, checkpoint, options)
}

/// The digests of the checkpoint `import-gguf` writes of `gguf`, by name: what a manifest
/// records as the source of an artifact converted from it.
pub fn source_digests(gguf: &Imported) -> Result<Vec<FileDigest>> {
    let mut files = Vec::new();
    for (name, bytes) in gguf.side_files() {
        files.push(digest_written(name, |out| Ok(out.write_all(bytes)?))?);
    }
    let progress = ProgressBar::hidden();
    for name in gguf.weight_files() {
        files.push(digest_written(name, |out| {
            gguf.write_weight_file(name, out, &progress)
        })?);
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// What is read and checked of a checkpoint before its weights are.
struct Checked {
    config: LlamaConfig,
    tokenizer: Tokenizer,
    pooling: Option<Pooling>,
    /// The side files copied into the artifact (written in staging already).
    side_files: Vec<&'static str>,
}

/// Writes the artifact of `checkpoint`, read from `src` (a directory, or a GGUF) and
/// checked as `checked`, into `staging` and moves it into `out`.
fn write_artifact(
    src: &Path,
    staging: Staging,
    out: &Path,
    checked: Checked,
    mut checkpoint: Checkpoint,
    options: Options,
) -> Result<Manifest> {
    let Checked {
        config,
        tokenizer,
        pooling,
        side_files,
    } = checked;
    if config.embedding_model {
        checkpoint.add_missing_prefix(names::MODEL_PREFIX);
    }
    // Before the model is built: its size comes from config.json, which could claim any
    // number of layers.
    check_layer_count(&checkpoint, &config)?;
    let device = Default::default();
    let model = config.init::<B>(&device);
    let sources = plan(&checkpoint, &config, &model)?;
    let declared = params::<B, _>(&model);
    let blocks = match checkpoint.gguf() {
        Some(gguf) => BlocksFile::of_gguf(gguf),
        None => BlocksFile::open(src)?,
    };
    let kept = match &blocks {
        Some(file) => kept_blocks(file, &declared, config.tie_word_embeddings)?,
        None => Vec::new(),
    };
    let stored: HashMap<String, StoredBlocks<'_>> = (kept.iter())
        .map(|(path, ty, bytes)| (path.clone(), StoredBlocks { ty: *ty, bytes }))
        .collect();

    let mut artifact_files = vec![MODEL_FILE.to_string()];
    artifact_files.extend(side_files.iter().map(|name| name.to_string()));
    if let Some(pooling) = &pooling {
        let text = serde_json::to_string_pretty(pooling)? + "\n";
        staging.write(POOLING_FILE, text.as_bytes())?;
        artifact_files.push(POOLING_FILE.to_string());
    }
    write_record(model, &checkpoint, sources, &staging)?;
    // Digested once: the weights file names the record it was laid out from.
    let record_path = staging.path(MODEL_FILE);
    let (sha256, bytes) = digest_file(&record_path)
        .with_context(|| format!("cannot read {}", record_path.display()))?;
    let record = FileDigest {
        name: MODEL_FILE.to_string(),
        sha256,
        bytes,
    };
    write_weights(
        &staging,
        &declared,
        config.tie_word_embeddings,
        &stored,
        &record,
    )?;
    // The blocks (owned where q/k rows were moved) are done with.
    let has_blocks = blocks.is_some();
    drop(stored);
    drop(kept);
    drop(blocks);
    artifact_files.push(WEIGHTS_FILE.to_string());
    if options.burnpack {
        let model = config.init::<B>(&device);
        write_burnpack(model, &record_path, &staging.path(BURNPACK_FILE))?;
        artifact_files.push(BURNPACK_FILE.to_string());
    }

    let source = match checkpoint.gguf() {
        // The files `import-gguf` writes, hashed as it would write them.
        Some(gguf) => source_digests(gguf)?,
        // blocks.safetensors is a source: `verify --source` checks it as it checks the rest.
        None => {
            let files = (side_files.iter().map(|name| name.to_string()))
                .chain(checkpoint.files.iter().cloned())
                .chain(has_blocks.then(|| blocks::FILE_NAME.to_string()));
            digests(src, files)?
        }
    };
    let others = artifact_files.iter().filter(|f| *f != MODEL_FILE).cloned();
    let mut files = digests(&staging.path(""), others)?;
    files.push(record);
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        converter: format!("converter {}", env!("CARGO_PKG_VERSION")),
        source,
        files,
        probe: probe(&tokenizer, PROBE_TEXT)?,
    };
    // Optional files an earlier conversion wrote and this one does not.
    let stale: Vec<&str> = OPTIONAL_FILES
        .into_iter()
        .filter(|name| !artifact_files.iter().any(|f| f == name))
        .collect();
    staging.commit_into(
        out,
        &artifact_files,
        &stale,
        (MANIFEST_FILE, &manifest.to_json()),
    )?;
    Ok(manifest)
}

/// Writes weights.bin into `staging`: the parameters `declared` laid out from the record
/// just written there (`record`, its digest), as the runtime keeps them
/// (`runtime::weights::file`), the projections of `blocks` as those blocks.
fn write_weights(
    staging: &Staging,
    declared: &[ParamInfo],
    tied: bool,
    blocks: &HashMap<String, StoredBlocks<'_>>,
    record: &FileDigest,
) -> Result<()> {
    let written = runtime::weights::record::Record::open(&staging.path(MODEL_FILE))
        .map_err(|e| anyhow!("cannot read back the record: {e}"))?;
    let mut out = staging.create_file(WEIGHTS_FILE)?;
    let id = RecordId {
        bytes: record.bytes,
        sha256: record.sha256.clone(),
    };
    weights::file::write(&written, id, declared, tied, blocks, &mut out).map_err(
        |e| match blocks.is_empty() {
            true => anyhow!(e),
            false => anyhow!(
                "{e}: {} does not hold the checkpoint's values",
                blocks::FILE_NAME
            ),
        },
    )?;
    let file = finish_keeping(out).with_context(|| format!("cannot write {WEIGHTS_FILE}"))?;
    // Written, the file sits in the page cache in the small folios buffered writes make,
    // and a load right after would map it 4 KiB at a time. Dropped now (clean after the
    // fsync), it is read back by the digest sequentially, which the kernel caches in large
    // folios that a load maps in huge pages: decoding reads them faster
    // (docs/ARCHITECTURE.md, "Loading"). Only advice: a failure costs speed, not data.
    // SAFETY: posix_fadvise on a descriptor this function owns.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// The blocks of `file` (over its map, or made from the GGUF) by the record field path of
/// the matrix each is (`declared`, the model's parameters: a projection, or the embedding;
/// a tied lm_head is not stored, so it has none), each of the shape its matrix needs:
/// `[d_out, row bytes]` of `d_in` values a row (`[vocab, row bytes]` of `hidden` for the
/// embedding).
fn kept_blocks<'a>(
    file: &'a BlocksFile,
    declared: &[ParamInfo],
    tied: bool,
) -> Result<Vec<KeptBlocks<'a>>> {
    let mut kept = Vec::new();
    for param in declared {
        let Some((hf_name, transform)) = names::to_hf(param) else {
            continue;
        };
        let embedding = param.owner == "Embedding";
        if transform != Transform::Transpose && !embedding {
            continue;
        }
        let Some(tensor) = file.tensors.get(&hf_name) else {
            continue;
        };
        ensure!(
            !(tied && hf_name == names::LM_HEAD),
            "{}: {hf_name} is given as blocks, but config.json ties it to the embedding",
            blocks::FILE_NAME
        );
        // Rows of blocks: a projection's outputs, or the embedding's tokens.
        let (d_in, d_out) = match (param.shape.as_slice(), embedding) {
            (&[vocab, hidden], true) => (hidden, vocab),
            (&[d_in, d_out], false) => (d_in, d_out),
            _ => bail!("{} is not a matrix", param.path),
        };
        let ty = tensor.ty;
        let row_bytes = ty.row_bytes(d_in);
        ensure!(
            row_bytes.is_some_and(|row_bytes| tensor.shape == [d_out, row_bytes]),
            "{}: {hf_name} is {:?} bytes of {ty} blocks, config.json implies {d_out} rows of {d_in} values{}",
            blocks::FILE_NAME,
            tensor.shape,
            match row_bytes {
                Some(row_bytes) => format!(" ([{d_out}, {row_bytes}] bytes)"),
                None => format!(", not whole {ty} blocks of {}", ty.values()),
            }
        );
        kept.push((param.path.clone(), ty, file.bytes(tensor)?));
    }
    let matrix = |name: &&String| {
        (declared.iter()).any(|p| {
            names::to_hf(p).is_some_and(|(hf_name, transform)| {
                hf_name == **name && (transform == Transform::Transpose || p.owner == "Embedding")
            })
        })
    };
    if let Some(name) = file.tensors.keys().find(|name| !matrix(name)) {
        bail!("{}: {name} is not a matrix of the model", blocks::FILE_NAME);
    }
    Ok(kept)
}

/// A matrix's blocks: its record field path, type and bytes.
type KeptBlocks<'a> = (String, BlockType, Cow<'a, [u8]>);

/// How a chat template is rendered to check it: `runtime::text::chat::render_isolated` in the
/// binary (a child process with capped memory), `ChatRequest::render` where that is enough.
pub type Render = dyn Fn(&ChatRequest) -> Result<String, ChatError>;

/// Reads the artifact's side files in `dir` with the runtime's own readers and checks them
/// against the model: generation_config.json parses, every id the tokenizer and the configs
/// name is a row of the embedding, the chat template renders (through `render`). Returns
/// the tokenizer.
pub fn check_side_files(dir: &Path, config: &LlamaConfig, render: &Render) -> Result<Tokenizer> {
    let generation = GenerationConfig::from_file(&dir.join(GENERATION_CONFIG_FILE))?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    tokenizer.check_fits(config.vocab_size)?;
    match tokenizer.chat_request(Some("You are a test."), "Hello") {
        Ok(request) => {
            render(&request)?;
        }
        Err(TokenizerError::NoChatTemplate) => {}
        Err(e) => return Err(e.into()),
    }
    let mut special: Vec<(&str, u32)> = Vec::new();
    special.extend(config.bos_token_id.map(|id| ("bos_token_id", id)));
    special.extend(config.eos_token_ids.iter().map(|&id| ("eos_token_id", id)));
    if let Some(generation) = &generation {
        for (what, ids) in [
            (
                "generation_config.json's bos_token_id",
                &generation.bos_token_id,
            ),
            (
                "generation_config.json's eos_token_id",
                &generation.eos_token_id,
            ),
        ] {
            special.extend(ids.iter().flat_map(TokenIds::to_vec).map(|id| (what, id)));
        }
    }
    for (what, id) in special {
        config.check_token_id(id, what)?;
    }
    Ok(tokenizer)
}

/// config.json's layer count against the checkpoint's, so a config claiming a million
/// layers fails here and not in building a model that large.
fn check_layer_count(checkpoint: &Checkpoint, config: &LlamaConfig) -> Result<()> {
    let layers = checkpoint
        .tensors
        .keys()
        .filter_map(|name| names::split_layer(name))
        .map(|(layer, _)| layer + 1)
        .max()
        .unwrap_or(0);
    ensure!(
        layers == config.num_layers,
        "config.json has {} layers (num_hidden_layers), the checkpoint's tensors {layers}",
        config.num_layers
    );
    Ok(())
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
        let (mut hf_name, mut transform) = names::to_hf(&param)
            .ok_or_else(|| anyhow!("no name rule for Burn parameter {}", param.path))?;
        if hf_name == names::LM_HEAD && config.tie_word_embeddings {
            // Tied: lm_head is the embedding, transposed to [hidden, vocab].
            known.insert(hf_name);
            hf_name = names::EMBEDDING.to_string();
        }
        if config.unit_offset_norms && param.owner == "RmsNorm" {
            transform = Transform::AddOne;
        }
        // A part of a fused projection, when the checkpoint has the fused one instead; never
        // both, or one of them would be silently left out.
        let mut rows = None;
        if let Some((whole, range, total)) = names::fused(&hf_name, config)
            && let Some(meta) = checkpoint.tensors.get(&whole)
        {
            ensure!(
                !checkpoint.tensors.contains_key(&hf_name),
                "tensor {hf_name} is given beside {whole}, which holds its rows too"
            );
            ensure!(
                meta.shape.first() == Some(&total),
                "tensor {whole} has shape {:?}, expected {total} rows from config.json",
                meta.shape
            );
            (hf_name, rows) = (whole, Some(range));
        }
        known.insert(hf_name.clone());
        let meta = checkpoint
            .tensors
            .get(&hf_name)
            .ok_or_else(|| anyhow!("missing tensor {hf_name}"))?;
        let meta = match &rows {
            Some(rows) => &meta.rows(&hf_name, rows.clone())?,
            None => meta,
        };
        let shape = &param.shape;
        let source_shape = match (transform, shape.as_slice()) {
            (Transform::Transpose, &[d_in, d_out]) => vec![d_out, d_in],
            _ => shape.clone(),
        };
        let what = match &rows {
            Some(rows) => format!("tensor {hf_name} rows {rows:?}"),
            None => format!("tensor {hf_name}"),
        };
        ensure!(
            meta.shape == source_shape,
            "{what} has shape {:?}, expected {source_shape:?} from config.json",
            meta.shape
        );
        ensure!(
            matches!(meta.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16),
            "tensor {hf_name} has unsupported dtype {:?} (supported: F32, BF16, F16)",
            meta.dtype
        );
        sources.insert(
            param.path,
            Source {
                hf_name,
                rows,
                transform,
            },
        );
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
