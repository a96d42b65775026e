//! tokenizer.json and tokenizer_config.json synthesised from a GGUF's `tokenizer.ggml.*`
//! metadata.

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value as Json, json};

use crate::gguf::{Gguf, Value};

/// ggml token types (llama.h `llama_token_type`).
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's pre-tokenizer split (llama.cpp's `llama-bpe`): digits in runs of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's (llama.cpp's `qwen2`): single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The byte-level BPE tokenizer stored in the GGUF metadata (`tokenizer.ggml.*`).
pub struct TokenizerSpec {
    tokens: Vec<String>,
    types: Vec<i64>,
    merges: Vec<String>,
    pre: String,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    unk: Option<u64>,
    pub pad: Option<u64>,
    /// `tokenizer.ggml.add_bos_token`: encoding starts with BOS (Llama 3's does).
    add_bos: bool,
    chat_template: Option<String>,
}

impl TokenizerSpec {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        let model = gguf.str("tokenizer.ggml.model")?;
        match model {
            "gpt2" => {}
            "llama" => bail!(
                "unsupported GGUF tokenizer model \"llama\" (a SentencePiece vocabulary): only \
                 byte-level BPE (\"gpt2\") is supported; convert the Hugging Face checkpoint, \
                 whose tokenizer.json the runtime reads as is"
            ),
            other => bail!(
                "unsupported GGUF tokenizer model {other:?}: only byte-level BPE (\"gpt2\") is \
                 supported"
            ),
        }
        let tokens: Vec<String> = gguf
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let types = match gguf.get("tokenizer.ggml.token_type") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::I32(t) => Ok(i64::from(*t)),
                    other => other
                        .as_u64()
                        .map(|t| t as i64)
                        .context("token_type holds a non-integer"),
                })
                .collect::<Result<Vec<_>>>()?,
            _ => vec![TOKEN_TYPE_NORMAL; tokens.len()],
        };
        ensure!(
            types.len() == tokens.len(),
            "token_type has {} entries for {} tokens",
            types.len(),
            tokens.len()
        );
        let id = |key: &str| gguf.get(key).and_then(Value::as_u64);
        Ok(Self {
            merges: gguf
                .strings("tokenizer.ggml.merges")?
                .into_iter()
                .map(String::from)
                .collect(),
            pre: gguf
                .get("tokenizer.ggml.pre")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            unk: id("tokenizer.ggml.unknown_token_id"),
            pad: id("tokenizer.ggml.padding_token_id"),
            add_bos: matches!(
                gguf.get("tokenizer.ggml.add_bos_token"),
                Some(Value::Bool(true))
            ),
            chat_template: gguf
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(String::from),
            tokens,
            types,
        })
    }

    fn token(&self, id: Option<u64>) -> Json {
        id.and_then(|i| self.tokens.get(i as usize))
            .map_or(Json::Null, |t| json!(t))
    }

    /// tokenizer.json as the `tokenizers` library writes it for GPT-2-style BPE.
    pub fn tokenizer_json(&self) -> Result<Json> {
        // The pre-tokenizer llama.cpp names in `tokenizer.ggml.pre` (llama-vocab.cpp), as
        // the models' own tokenizer.json files write it.
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        let split = |pattern: &str| {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                byte_level(false)]})
        };
        let (pre_tokenizer, normalizer) = match self.pre.as_str() {
            "smollm" => (
                json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
                Json::Null,
            ),
            "gpt2" | "default" => (byte_level(true), Json::Null),
            "llama-bpe" => (split(LLAMA3_SPLIT), Json::Null),
            "qwen2" => (split(QWEN2_SPLIT), json!({"type": "NFC"})),
            other => bail!(
                "unsupported GGUF pre-tokenizer {other:?} (supported: smollm, llama-bpe, qwen2, \
                 gpt2, default)"
            ),
        };
        let post_processor = match self.add_bos.then_some(self.bos).flatten() {
            Some(bos) => {
                let token = self.token(Some(bos));
                json!({
                    "type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": token, "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": token, "type_id": 0}},
                             {"Sequence": {"id": "A", "type_id": 0}},
                             {"SpecialToken": {"id": token, "type_id": 1}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {token.as_str().unwrap_or_default(): {"id": token, "ids": [bos], "tokens": [token]}},
                })
            }
            None => {
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
            }
        };
        let added_tokens: Vec<Json> = self
            .types
            .iter()
            .enumerate()
            .filter(|&(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(id, &t)| {
                json!({
                    "id": id, "content": self.tokens[id], "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": t == TOKEN_TYPE_CONTROL,
                })
            })
            .collect();
        let vocab: serde_json::Map<String, Json> = self
            .tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), json!(id)))
            .collect();
        ensure!(
            vocab.len() == self.tokens.len(),
            "the GGUF vocabulary has duplicate tokens"
        );
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added_tokens,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": self.merges,
            },
        }))
    }

    pub fn tokenizer_config_json(&self, context_length: u64) -> Json {
        let specials: Vec<&String> = self
            .types
            .iter()
            .zip(&self.tokens)
            .filter(|&(&t, _)| t == TOKEN_TYPE_CONTROL)
            .map(|(_, token)| token)
            .collect();
        json!({
            "add_prefix_space": false,
            "additional_special_tokens": specials,
            "bos_token": self.token(self.bos),
            "eos_token": self.token(self.eos),
            "unk_token": self.token(self.unk),
            "pad_token": self.token(self.pad),
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": false,
            "model_max_length": context_length,
            "tokenizer_class": "GPT2Tokenizer",
        })
    }
}
