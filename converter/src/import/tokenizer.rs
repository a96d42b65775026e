//! tokenizer.json and tokenizer_config.json synthesised from a GGUF's `tokenizer.ggml.*`
//! metadata.
//!
//! Two kinds of vocabulary:
//! - byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the merges the file lists, with the
//!   pre-tokenizer `tokenizer.ggml.pre` names;
//! - SentencePiece (`"llama"`: Llama 2, TinyLlama, Mistral 7B v0.1, Phi-3, Gemma 3 as
//!   llama.cpp's converter writes them): tokens, scores, no merges. llama.cpp tokenizes
//!   these (`llm_tokenizer_spm`) from the UTF-8 characters of the text (a space prepended if
//!   `add_space_prefix`, every space written `▁`), repeatedly merging the adjacent pair whose
//!   concatenation is the highest-scored token (the leftmost among equal scores); characters
//!   no token covers become their `<0xXX>` byte tokens. The tokenizer.json is a BPE model
//!   over the whole normalized text (no pre-tokenizer) with byte fallback and one merge for
//!   every way of writing a token as two tokens, ranked by the token's score (as transformers
//!   builds one from a GGUF): BPE then merges the best-ranked adjacent pair, the leftmost
//!   among equal ranks, which is llama.cpp's order wherever scores differ. Where they tie
//!   the ranking puts the lower token id, then the shorter left part, first, where llama.cpp
//!   takes the leftmost pair. Between splits of one token that never told them apart; between
//!   distinct tokens scored alike it can: a vocabulary scoring "a▁" and "▁b" alike makes
//!   "a▁b" "a▁" + "b" for llama.cpp, "a" + "▁b" here. Found, when this was written, in 2 of
//!   450 random small vocabularies whose scores took 9 values (30 of 135,000 strings), never
//!   in 650 with distinct scores (195,000 strings, every split of a token at one score), nor
//!   in 1.1 million random strings over SentencePiece-trained vocabularies of 640 and 8,000
//!   tokens (BPE, whose normal tokens' scores are distinct, as SentencePiece's BPE trainer
//!   writes them; and unigram, 1,168 tokens sharing scores); tests/tiny_logits.rs
//!   (`gguf_family_imports_match_transformers`) holds 761 strings to llama.cpp's ids.
//!   Control tokens' text in the input (`<s>`) is the control token, as llama.cpp reads it
//!   with special tokens parsed (llama-server's rendered chats, the runtime's); llama.cpp's
//!   `special = false` reads it as text (the only other difference found). A normal token
//!   joining a character that has no token of its own is refused: llama.cpp merges it, BPE's
//!   byte fallback leaves it bytes, and a merge of byte tokens would name a token
//!   (`<0x20><0x20>`) the vocabulary lacks, which `tokenizers` refuses to load. User-defined
//!   tokens (Gemma 3's runs of raw spaces) are split out of the text whole, as llama.cpp
//!   does, so they need no merges.

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value as Json, json};

use crate::gguf::{Gguf, Value};

/// ggml token types (llama.h `llama_token_type`).
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// SentencePiece's word boundary: a space, as the tokens spell it.
const SPACE: &str = "\u{2581}";

/// Llama 3's pre-tokenizer split (llama.cpp's `llama-bpe`): digits in runs of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's (llama.cpp's `qwen2`): single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How the vocabulary splits text.
enum Model {
    /// Byte-level BPE: `tokenizer.ggml.merges`, and the pre-tokenizer `tokenizer.ggml.pre`.
    ByteLevel { merges: Vec<String>, pre: String },
    /// SentencePiece: `tokenizer.ggml.scores`, and whether a space starts the text.
    SentencePiece {
        scores: Vec<f32>,
        add_space_prefix: bool,
    },
}

/// The tokenizer stored in the GGUF metadata (`tokenizer.ggml.*`).
pub struct TokenizerSpec {
    tokens: Vec<String>,
    types: Vec<i64>,
    model: Model,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    unk: Option<u64>,
    pub pad: Option<u64>,
    /// `tokenizer.ggml.add_bos_token`: encoding starts with BOS (Llama 3's does; llama.cpp
    /// assumes it of a SentencePiece vocabulary that does not say).
    add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: encoding ends with EOS.
    add_eos: bool,
    chat_template: Option<String>,
}

impl TokenizerSpec {
    pub fn read(gguf: &Gguf) -> Result<Self> {
        let kind = gguf.str("tokenizer.ggml.model")?;
        let sentencepiece = match kind {
            "gpt2" => false,
            "llama" => true,
            other => bail!(
                "unsupported GGUF tokenizer model {other:?}: only byte-level BPE (\"gpt2\") and \
                 SentencePiece (\"llama\") are supported"
            ),
        };
        let tokens: Vec<String> = gguf
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let types = match gguf.get("tokenizer.ggml.token_type") {
            Some(Value::Array(items)) => items
                .values()
                .map(|v| match v {
                    Value::I32(t) => Ok(i64::from(t)),
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
        let flag = |key: &str| match gguf.get(key) {
            Some(Value::Bool(b)) => Ok(Some(*b)),
            None => Ok(None),
            Some(_) => bail!("GGUF metadata {key} is not a boolean"),
        };
        let id = |key: &str| gguf.get(key).and_then(Value::as_u64);
        let model = if sentencepiece {
            let scores = match gguf.get("tokenizer.ggml.scores") {
                Some(Value::Array(items)) => items
                    .values()
                    .map(|v| match v.as_f64() {
                        Some(s) if s.is_finite() => Ok(s as f32),
                        _ => {
                            bail!("tokenizer.ggml.scores holds a value that is not a finite number")
                        }
                    })
                    .collect::<Result<Vec<_>>>()?,
                // llama.cpp scores every token 0 then, and merges leftmost first, which no
                // ranking of merges says.
                _ => bail!(
                    "unsupported GGUF tokenizer model \"llama\" (a SentencePiece vocabulary) \
                     without tokenizer.ggml.scores: the order of its merges is not known"
                ),
            };
            ensure!(
                scores.len() == tokens.len(),
                "tokenizer.ggml.scores has {} entries for {} tokens",
                scores.len(),
                tokens.len()
            );
            Model::SentencePiece {
                scores,
                add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
            }
        } else {
            Model::ByteLevel {
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
            }
        };
        // llama.cpp's defaults for a SentencePiece vocabulary: BOS 1 added, EOS 2, UNK 0.
        let default = |id: u64| sentencepiece.then_some(id);
        let spec = Self {
            model,
            bos: id("tokenizer.ggml.bos_token_id").or(default(1)),
            eos: id("tokenizer.ggml.eos_token_id").or(default(2)),
            unk: id("tokenizer.ggml.unknown_token_id").or(default(0)),
            pad: id("tokenizer.ggml.padding_token_id"),
            add_bos: flag("tokenizer.ggml.add_bos_token")?.unwrap_or(sentencepiece),
            add_eos: flag("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            chat_template: gguf
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(String::from),
            tokens,
            types,
        };
        for (what, id, needed) in [
            ("BOS", spec.bos, spec.add_bos),
            ("EOS", spec.eos, spec.add_eos),
        ] {
            match id {
                Some(id) if needed && id as usize >= spec.tokens.len() => bail!(
                    "the GGUF adds {what} token id {id}, past its {} tokens",
                    spec.tokens.len()
                ),
                None if needed && sentencepiece => {
                    bail!("the GGUF adds a {what} token but names none")
                }
                _ => {}
            }
        }
        Ok(spec)
    }

    fn token(&self, id: Option<u64>) -> Json {
        id.and_then(|i| self.tokens.get(i as usize))
            .map_or(Json::Null, |t| json!(t))
    }

    /// tokenizer.json as the `tokenizers` library writes it: GPT-2-style BPE for a byte-level
    /// vocabulary, a SentencePiece-style BPE (as transformers builds one) for a SentencePiece
    /// one.
    pub fn tokenizer_json(&self) -> Result<Json> {
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
        let (normalizer, pre_tokenizer, decoder, model) = match &self.model {
            Model::ByteLevel { merges, pre } => byte_level(pre, vocab, merges)?,
            Model::SentencePiece {
                scores,
                add_space_prefix,
            } => {
                let merges = self.sentencepiece_merges(scores)?;
                let unk = self.token(self.unk);
                sentencepiece(*add_space_prefix, vocab, merges, unk)
            }
        };
        let sentencepiece = matches!(self.model, Model::SentencePiece { .. });
        // Split out of the text before the model: as llama.cpp does with user-defined tokens
        // always and with control (and SentencePiece's unknown) tokens when it reads special
        // tokens, as the runtime does.
        let added_tokens: Vec<Json> = self
            .types
            .iter()
            .enumerate()
            .filter(|&(_, &t)| {
                t == TOKEN_TYPE_CONTROL
                    || t == TOKEN_TYPE_USER_DEFINED
                    || (sentencepiece && t == TOKEN_TYPE_UNKNOWN)
            })
            .map(|(id, &t)| {
                json!({
                    "id": id, "content": self.tokens[id], "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": t != TOKEN_TYPE_USER_DEFINED,
                })
            })
            .collect();
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added_tokens,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": self.post_processor(),
            "decoder": decoder,
            "model": model,
        }))
    }

    /// BOS and EOS as the file says to add them; else, for byte-level BPE, `ByteLevel`'s.
    fn post_processor(&self) -> Json {
        let bos = self.add_bos.then_some(self.bos).flatten();
        let eos = self.add_eos.then_some(self.eos).flatten();
        if bos.is_none() && eos.is_none() {
            return match self.model {
                Model::ByteLevel { .. } => {
                    json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
                }
                Model::SentencePiece { .. } => Json::Null,
            };
        }
        let special = |id: Option<u64>, type_id: u32| {
            id.map(|id| json!({"SpecialToken": {"id": self.token(Some(id)), "type_id": type_id}}))
        };
        let sequence =
            |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
        let single: Vec<Json> = [special(bos, 0), Some(sequence("A", 0)), special(eos, 0)]
            .into_iter()
            .flatten()
            .collect();
        let pair: Vec<Json> = [
            special(bos, 0),
            Some(sequence("A", 0)),
            special(eos, 0),
            special(bos, 1),
            Some(sequence("B", 1)),
            special(eos, 1),
        ]
        .into_iter()
        .flatten()
        .collect();
        let special_tokens: serde_json::Map<String, Json> = [bos, eos]
            .into_iter()
            .flatten()
            .map(|id| {
                let token = self.token(Some(id));
                let name = token.as_str().unwrap_or_default().to_string();
                (name, json!({"id": token, "ids": [id], "tokens": [token]}))
            })
            .collect();
        json!({
            "type": "TemplateProcessing",
            "single": single,
            "pair": pair,
            "special_tokens": special_tokens,
        })
    }

    /// One merge for every way of writing a token as two tokens, best score first (ties: by
    /// token id, then the shorter left part). A character with no token of its own falls
    /// back to bytes, which no merge can join into a token (`tokenizers` names a merge's
    /// result by its parts' names), so a normal token joining one is refused; other tokens
    /// are split out whole (`added_tokens`) and need no merges.
    fn sentencepiece_merges(&self, scores: &[f32]) -> Result<Vec<[&str; 2]>> {
        let ids: std::collections::HashMap<&str, usize> = (self.tokens.iter())
            .enumerate()
            .map(|(id, t)| (t.as_str(), id))
            .collect();
        let part = |part: &'_ str| -> Option<&str> { ids.get_key_value(part).map(|(k, _)| *k) };
        let mut merges: Vec<(f32, usize, usize, [&str; 2])> = Vec::new();
        for (id, token) in self.tokens.iter().enumerate() {
            for (at, _) in token.char_indices().skip(1) {
                let (left, right) = token.split_at(at);
                match (part(left), part(right)) {
                    (Some(l), Some(r)) => merges.push((scores[id], id, at, [l, r])),
                    (l, r) => {
                        // llama.cpp joins two symbols, each a token or one character.
                        let symbol = |p: Option<&str>, text: &str| {
                            p.is_some() || text.chars().nth(1).is_none()
                        };
                        if self.types[id] == TOKEN_TYPE_NORMAL
                            && symbol(l, left)
                            && symbol(r, right)
                        {
                            let missing = if l.is_none() { left } else { right };
                            bail!(
                                "unsupported SentencePiece vocabulary: its token {token:?} joins \
                                 {missing:?}, a character it has no token for, which llama.cpp \
                                 merges and a tokenizer.json cannot"
                            );
                        }
                    }
                }
            }
        }
        merges.sort_by(|a, b| {
            (b.0.total_cmp(&a.0))
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
        });
        Ok(merges.into_iter().map(|(.., pair)| pair).collect())
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
            "add_prefix_space": matches!(
                self.model,
                Model::SentencePiece { add_space_prefix: true, .. }
            ),
            "additional_special_tokens": specials,
            "bos_token": self.token(self.bos),
            "eos_token": self.token(self.eos),
            "unk_token": self.token(self.unk),
            "pad_token": self.token(self.pad),
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": false,
            "model_max_length": context_length,
            "tokenizer_class": match self.model {
                Model::ByteLevel { .. } => "GPT2Tokenizer",
                Model::SentencePiece { .. } => "LlamaTokenizer",
            },
        })
    }
}

/// The normalizer, pre-tokenizer, decoder and model of a byte-level BPE tokenizer.json: the
/// pre-tokenizer llama.cpp names in `tokenizer.ggml.pre` (llama-vocab.cpp), as the models'
/// own tokenizer.json files write it.
fn byte_level(
    pre: &str,
    vocab: serde_json::Map<String, Json>,
    merges: &[String],
) -> Result<(Json, Json, Json, Json)> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false)]})
    };
    let (pre_tokenizer, normalizer) = match pre {
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
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    let model = json!({
        "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
        "ignore_merges": false, "vocab": vocab, "merges": merges,
    });
    Ok((normalizer, pre_tokenizer, decoder, model))
}

/// The normalizer, pre-tokenizer, decoder and model of a SentencePiece vocabulary's
/// tokenizer.json, as llama.cpp tokenizes: `▁` prepended (if `add_space_prefix`) and for
/// every space, no pre-tokenizer (the whole text is one word for BPE), merges by score, byte
/// fallback; decoding takes the prepended space off again, as llama.cpp does.
fn sentencepiece(
    add_space_prefix: bool,
    vocab: serde_json::Map<String, Json>,
    merges: Vec<[&str; 2]>,
    unk: Json,
) -> (Json, Json, Json, Json) {
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": SPACE}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let model = json!({
        "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
        "ignore_merges": false, "vocab": vocab, "merges": merges,
    });
    (
        json!({"type": "Sequence", "normalizers": normalizers}),
        Json::Null,
        json!({"type": "Sequence", "decoders": decoders}),
        model,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tokens: &[&str], scores: &[f32]) -> TokenizerSpec {
        TokenizerSpec {
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            types: vec![TOKEN_TYPE_NORMAL; tokens.len()],
            model: Model::SentencePiece {
                scores: scores.to_vec(),
                add_space_prefix: true,
            },
            bos: None,
            eos: None,
            unk: None,
            pad: None,
            add_bos: false,
            add_eos: false,
            chat_template: None,
        }
    }

    /// Every split of every token into two tokens, best score first.
    #[test]
    fn sentencepiece_merges_by_score() {
        let scores = [0.0, -1.0, -2.0, -3.0, -6.0, -5.0, -4.0];
        let tok = spec(&["<0x09>", "a", "b", "c", "ab", "bc", "abc"], &scores);
        let merges = tok.sentencepiece_merges(&scores);
        let expected = [["a", "bc"], ["ab", "c"], ["b", "c"], ["a", "b"]];
        assert_eq!(merges.unwrap(), expected);
    }

    /// A normal token joining a character that has no token, of one byte or several:
    /// llama.cpp merges it (its symbols are characters), BPE's byte fallback would leave
    /// bytes.
    #[test]
    fn sentencepiece_token_over_a_missing_character_is_refused() {
        for (tokens, joins) in [
            (&["a", "aé"][..], "\"aé\" joins \"é\""),
            (&["<0x09>", "a", "a\t"], "\"a\\t\" joins \"\\t\""),
        ] {
            let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
            let tok = spec(tokens, &scores);
            let error = tok.sentencepiece_merges(&scores).unwrap_err();
            assert!(error.to_string().contains(joins), "{error}");
        }
    }

    /// User-defined tokens over characters without tokens of their own (Gemma 3's runs of
    /// raw spaces, beside its byte tokens) get no merges: the tokenizer.json loads (a merge
    /// of `<0x20>` and `<0x20>` names a token the vocabulary lacks), and matches them whole,
    /// as llama.cpp does.
    #[test]
    fn user_defined_tokens_over_byte_characters_load_and_match_whole() {
        let tokens = ["<unk>", "<0x20>", "a", "\u{2581}", "  ", "   ", "a\u{2581}"];
        let mut tok = spec(&tokens, &[0.0, 0.0, -1.0, -2.0, 0.0, 0.0, -3.0]);
        tok.types[0] = TOKEN_TYPE_UNKNOWN;
        tok.types[1] = 6;
        tok.types[4] = TOKEN_TYPE_USER_DEFINED;
        tok.types[5] = TOKEN_TYPE_USER_DEFINED;
        tok.unk = Some(0);
        tok.model = Model::SentencePiece {
            scores: vec![0.0, 0.0, -1.0, -2.0, 0.0, 0.0, -3.0],
            add_space_prefix: false,
        };
        let json = tok.tokenizer_json().unwrap().to_string();
        let tokenizer = tokenizers::Tokenizer::from_bytes(json).unwrap();
        let ids = tokenizer
            .encode("a     a", false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, [2, 5, 4, 2]);
    }

    /// The fixture's vocabulary as Gemma's is written (`add_space_prefix` false, no BOS):
    /// llama.cpp's ids and decoded text for each string (tests/data/gguf-spm/cases.json).
    #[test]
    fn sentencepiece_without_space_prefix_tokenizes_as_llama_cpp() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf-spm");
        let gguf = Gguf::open(&dir.join("model-nospace.gguf")).unwrap();
        let spec = TokenizerSpec::read(&gguf).unwrap();
        let json = spec.tokenizer_json().unwrap().to_string();
        let tokenizer = tokenizers::Tokenizer::from_bytes(json).unwrap();
        let cases: Json =
            serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap())
                .unwrap();
        let cases = cases["model-nospace.gguf"].as_array().unwrap();
        assert!(cases.len() >= 700);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let encoded = tokenizer.encode(text, true).unwrap();
            assert_eq!(encoded.get_ids(), ids, "{text:?}");
            // Absent for a text holding control tokens (llama.cpp's ids with `special`).
            if let Some(expected) = case["decoded"].as_str() {
                let decoded = tokenizer.decode(&ids, true).unwrap();
                assert_eq!(decoded, expected, "{text:?}");
            }
        }
    }
}
