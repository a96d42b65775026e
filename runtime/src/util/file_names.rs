//! The artifact directory's file names: a leaf, so that each side (the text side, the
//! weights, the converter) finds its files without depending on the others.

/// The Burn record of the model's parameters.
pub const MODEL_FILE: &str = "model.mpk";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const CONFIG_FILE: &str = "config.json";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The parameters laid out as the runtime keeps them (`weights::file`), from the record;
/// loaded instead of it when listed. Optional: an artifact from before it loads from the
/// record.
pub const WEIGHTS_FILE: &str = "weights.bin";
/// The parameters in Burn's burnpack format (`weights::burnpack`), the record's paths and
/// values, for Burn 0.22 programs, which cannot read the record: written on request
/// (`converter convert --burnpack`). Loaded when there is no weights file.
pub const BURNPACK_FILE: &str = "model.bpk";
/// How an embedding model pools its hidden states into one vector (`model::config::pooling`),
/// written by the converter from sentence-transformers' modules, or its default. Optional:
/// a generation model has none.
pub const POOLING_FILE: &str = "pooling.json";
