//! An embedding checkpoint's pooling, read from sentence-transformers' layout into the
//! artifact's pooling.json (`runtime::model::config::Pooling`).
//!
//! sentence-transformers saves a model as a list of modules (modules.json): the transformer
//! (the checkpoint at the directory's root), a `Pooling` module whose `config.json` says
//! which positions are pooled (`pooling_mode_*` keys), and optionally `Normalize`. Those
//! three are what the runtime computes; any other module (`Dense`, `LayerNorm`, ...) or
//! pooling mode (max, weighted mean, ...) is refused by name rather than left out. Without
//! modules.json, an embedding model (`LlamaModel`, `Qwen3Model`) gets the default: the
//! last token, normalized, as Qwen3-Embedding is used.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use runtime::model::config::{CONFIG_LIMIT, HfConfig, LlamaConfig, Pooling, PoolingMode};
use runtime::util::files::read_text_bounded;
use runtime::weights::manifest::is_plain_file_name;
use serde::Deserialize;
use serde_json::{Map, Value};

/// sentence-transformers' list of modules.
pub const MODULES_FILE: &str = "modules.json";

/// One entry of modules.json.
#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    idx: usize,
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The pooling of the checkpoint in `src` (config.json read as `hf`, resolved as
/// `config`): from its modules.json if it has one, the default for an embedding model
/// without one, `None` for a model that generates and has none.
pub fn read(src: &Path, hf: &HfConfig, config: &LlamaConfig) -> Result<Option<Pooling>> {
    let matryoshka_dimensions = hf.matryoshka_dimensions.clone().unwrap_or_default();
    let modules_path = src.join(MODULES_FILE);
    let pooling = match read_text_bounded(&modules_path, CONFIG_LIMIT) {
        Ok(text) => {
            let mut modules: Vec<Module> = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid", modules_path.display()))?;
            modules.sort_by_key(|m| m.idx);
            from_modules(src, &modules, config.hidden_size)?
        }
        Err(e) if e.is_not_found() && config.embedding_model => Pooling {
            source: "default: no modules.json; the last token, normalized (as Qwen3-Embedding)"
                .into(),
            ..Pooling::default()
        },
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let pooling = Pooling {
        matryoshka_dimensions,
        ..pooling
    };
    pooling.check(config.hidden_size)?;
    Ok(Some(pooling))
}

/// The pooling sentence-transformers' `modules` (in order) compute.
fn from_modules(src: &Path, modules: &[Module], hidden: usize) -> Result<Pooling> {
    let mut mode = None;
    let mut normalize = false;
    let mut sources = vec![MODULES_FILE.to_string()];
    for (i, module) in modules.iter().enumerate() {
        let kind = module.kind.rsplit('.').next().unwrap_or_default();
        match kind {
            "Transformer" => ensure!(
                i == 0 && matches!(module.path.as_str(), "" | "."),
                "{MODULES_FILE}: the Transformer module must come first, at the checkpoint's root (it is module {i}, in {:?})",
                module.path
            ),
            "Pooling" => {
                ensure!(
                    mode.is_none() && !normalize,
                    "{MODULES_FILE}: a Pooling module after pooling or normalizing is not supported"
                );
                ensure!(
                    is_plain_file_name(&module.path),
                    "{MODULES_FILE}: Pooling's path {:?} is not a directory of the checkpoint",
                    module.path
                );
                let file = format!("{}/config.json", module.path);
                mode = Some(pooling_mode(&src.join(&file), &file, hidden)?);
                sources.push(file);
            }
            "Normalize" => {
                ensure!(
                    mode.is_some(),
                    "{MODULES_FILE}: Normalize before Pooling is not supported"
                );
                normalize = true;
                sources.push("Normalize".into());
            }
            other => bail!(
                "{MODULES_FILE} lists a {other} module ({}), which is not supported: only Transformer, Pooling and Normalize",
                module.kind
            ),
        }
    }
    let Some(pooling) = mode else {
        bail!(
            "{MODULES_FILE} lists no Pooling module: how the hidden states are pooled is unknown"
        );
    };
    Ok(Pooling {
        pooling,
        normalize,
        matryoshka_dimensions: Vec::new(),
        source: sources.join(", "),
    })
}

/// The mode a Pooling module's config.json (at `path`, named `file`) names: as
/// sentence-transformers 6 writes it, `pooling_mode` (`"mean"`, `"cls"`, `"lasttoken"`);
/// as earlier versions did, exactly one of `pooling_mode_mean_tokens`,
/// `pooling_mode_cls_token` and `pooling_mode_lasttoken` true.
fn pooling_mode(path: &Path, file: &str, hidden: usize) -> Result<PoolingMode> {
    let text = read_text_bounded(path, CONFIG_LIMIT)?;
    let keys: Map<String, Value> =
        serde_json::from_str(&text).with_context(|| format!("{file} is not a JSON object"))?;
    for key in ["embedding_dimension", "word_embedding_dimension"] {
        if let Some(width) = keys.get(key).and_then(Value::as_u64) {
            ensure!(
                width == hidden as u64,
                "{file}: {key} {width} is not the model's hidden_size {hidden}"
            );
        }
    }
    if keys.get("include_prompt") == Some(&Value::Bool(false)) {
        bail!(
            "{file}: include_prompt: false (the prompt's tokens left out of the pooling) is not supported"
        );
    }
    let mode = match keys.get("pooling_mode") {
        Some(Value::String(mode)) => mode.clone(),
        Some(other) => bail!(
            "{file}: pooling_mode {other} is not supported: one mode (sentence-transformers concatenates several)"
        ),
        None => {
            let mut on = (keys.iter())
                .filter(|(key, value)| {
                    key.starts_with("pooling_mode_") && **value == Value::Bool(true)
                })
                .map(|(key, _)| key.as_str());
            let (Some(key), None) = (on.next(), on.next()) else {
                bail!(
                    "{file}: exactly one pooling_mode_* key must be true (sentence-transformers concatenates several; not supported)"
                );
            };
            key.to_string()
        }
    };
    Ok(match mode.as_str() {
        "mean" | "pooling_mode_mean_tokens" => PoolingMode::Mean,
        "cls" | "pooling_mode_cls_token" => PoolingMode::Cls,
        "lasttoken" | "pooling_mode_lasttoken" => PoolingMode::Last,
        other => bail!(
            "{file}: pooling mode {other:?} is not supported (supported: mean, cls, lasttoken)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    fn modules(list: &[(&str, &str)]) -> String {
        let entries: Vec<Value> = (list.iter().enumerate())
            .map(|(idx, (path, kind))| {
                serde_json::json!({"idx": idx, "name": idx.to_string(), "path": path,
                    "type": format!("sentence_transformers.models.{kind}")})
            })
            .collect();
        Value::Array(entries).to_string()
    }

    fn read_from(files: &[(&str, &str)]) -> Result<Pooling> {
        let dir = dir_with(files);
        let mut modules: Vec<Module> =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(MODULES_FILE))?)?;
        modules.sort_by_key(|m| m.idx);
        from_modules(dir.path(), &modules, 64)
    }

    const MEAN: &str = r#"{"word_embedding_dimension": 64, "pooling_mode_cls_token": false,
        "pooling_mode_mean_tokens": true, "pooling_mode_lasttoken": false, "include_prompt": true}"#;

    #[test]
    fn reads_pooling_and_normalize() {
        let layout = modules(&[
            ("", "Transformer"),
            ("1_Pooling", "Pooling"),
            ("2_Normalize", "Normalize"),
        ]);
        let pooling = read_from(&[(MODULES_FILE, &layout), ("1_Pooling/config.json", MEAN)]);
        let pooling = pooling.unwrap();
        assert_eq!(
            (pooling.pooling, pooling.normalize),
            (PoolingMode::Mean, true)
        );
        let layout = modules(&[("", "Transformer"), ("1_Pooling", "Pooling")]);
        // sentence-transformers 6's keys.
        let cls = r#"{"embedding_dimension": 64, "pooling_mode": "cls", "include_prompt": true}"#;
        let pooling = read_from(&[(MODULES_FILE, &layout), ("1_Pooling/config.json", cls)]);
        assert_eq!(pooling.unwrap().pooling, PoolingMode::Cls);
        let last = r#"{"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false}"#;
        let pooling = read_from(&[(MODULES_FILE, &layout), ("1_Pooling/config.json", last)]);
        let pooling = pooling.unwrap();
        assert_eq!(
            (pooling.pooling, pooling.normalize),
            (PoolingMode::Last, false)
        );
    }

    /// What the runtime would not compute is refused by name, never left out.
    #[test]
    fn refuses_what_it_cannot_compute_by_name() {
        let pooled = modules(&[("", "Transformer"), ("1_Pooling", "Pooling")]);
        let dense = modules(&[
            ("", "Transformer"),
            ("1_Pooling", "Pooling"),
            ("2_Dense", "Dense"),
        ]);
        let max = r#"{"pooling_mode_max_tokens": true}"#;
        let two = r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#;
        let wide = r#"{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}"#;
        let no_prompt = r#"{"pooling_mode_mean_tokens": true, "include_prompt": false}"#;
        let outside = modules(&[("", "Transformer"), ("../x", "Pooling")]);
        for (layout, config, named) in [
            (&dense, MEAN, "Dense"),
            (&pooled, max, "pooling_mode_max_tokens"),
            (&pooled, r#"{"pooling_mode": "max"}"#, "\"max\""),
            (&pooled, r#"{"pooling_mode": ["mean", "cls"]}"#, "one mode"),
            (&pooled, two, "exactly one"),
            (&pooled, wide, "word_embedding_dimension 32"),
            (&pooled, no_prompt, "include_prompt"),
            (&outside, MEAN, "not a directory"),
            (&modules(&[("", "Transformer")]), MEAN, "no Pooling"),
        ] {
            let error = read_from(&[(MODULES_FILE, layout), ("1_Pooling/config.json", config)])
                .unwrap_err()
                .to_string();
            assert!(error.contains(named), "{named}: {error}");
        }
    }
}
