//! Constrained decoding: a grammar per sequence ([`Grammar`]: a JSON Schema, a Lark grammar
//! or a regular expression) masks the logits before each token is sampled, so that the text
//! generated always stays a prefix of something the grammar accepts, and an end-of-sequence
//! token is allowed only where the grammar accepts the text as it is. Built on llguidance,
//! the engine llama.cpp, vLLM and mistral.rs use.
//!
//! llguidance sees the vocabulary as bytes ([`Grammars::new`]): each token's exact bytes
//! (a byte-level BPE token's through GPT-2's alphabet, a SentencePiece piece's `▁` as a
//! space, a byte-fallback token's byte), special tokens marked as such (no text can
//! produce them), the model's end ids as its end-of-sequence tokens, and ids past the
//! tokenizer's up to the model's `vocab_size` never allowed.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::text::tokenizer::Tokenizer;

mod schema;
pub(crate) use schema::for_each_schema;

/// The whitespace JSON may have between two of its tokens: newlines and indentation as a
/// model writes them, but bounded (llguidance's default is any amount), so that a small
/// model cannot spend its whole `max_tokens` on spaces, as llama-cpp-python, Ollama and
/// vLLM users have seen. A schema's own `x-guidance` options replace this.
const WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,24}";

/// `schema` with [`WHITESPACE`] as the whitespace its JSON may have, unless it says its own.
fn bounded_whitespace(schema: Value) -> Value {
    match schema {
        Value::Object(mut schema) if !schema.contains_key("x-guidance") => {
            let options = serde_json::json!({ "whitespace_pattern": WHITESPACE });
            schema.insert("x-guidance".into(), options);
            Value::Object(schema)
        }
        schema => schema,
    }
}

/// What a generation's text must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid against this JSON Schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A regular expression the whole text matches.
    Regex(String),
    /// JSON values valid against `schema`, each between the literal texts `open` and
    /// `close`; one, or with `separator` one or more, that text between two (tool calls in a
    /// model's own format, `crate::text::tools::Format::grammar`).
    Delimited {
        schema: Value,
        open: String,
        close: String,
        separator: Option<String>,
    },
}

impl Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    pub fn json_object() -> Self {
        Grammar::JsonSchema(serde_json::json!({"type": "object"}))
    }

    /// The grammar as llguidance takes it, its JSON Schemas rewritten where llguidance
    /// would refuse or misread them as written (`schema`'s docs), or why they cannot be.
    fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(prepared(schema.clone())?)
            }
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Grammar::Delimited {
                schema,
                open,
                close,
                separator,
            } => {
                let schema = prepared(schema.clone())?;
                let repeat = match separator {
                    Some(separator) => format!(" ({} item)*", lark_string(separator)),
                    None => String::new(),
                };
                TopLevelGrammar::from_lark(format!(
                    "start: item{repeat}\nitem: {} %json {schema} {}\n",
                    lark_string(open),
                    lark_string(close)
                ))
            }
        })
    }
}

/// `text` as a Lark string literal (a JSON string's escapes, which Lark's strings take).
fn lark_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// `schema` as llguidance is to compile it: rewritten (`schema`'s docs), with bounded
/// whitespace.
fn prepared(mut schema: Value) -> Result<Value, GrammarError> {
    schema::prepare(&mut schema)?;
    Ok(bounded_whitespace(schema))
}

/// A grammar that cannot be used, or a generation that left it (which a mask should make
/// impossible): llguidance's message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

impl GrammarError {
    /// llguidance's message on one line: its first line, then the detail of each `error:`
    /// line after it (a regex's "unclosed group"), and the regex a parse error is about;
    /// the excerpts with carets under them are left out.
    fn from(e: impl std::fmt::Display) -> Self {
        let message = e.to_string();
        let mut lines = message.lines();
        let mut text = lines.next().unwrap_or_default().trim().to_string();
        let regex_error = text.ends_with("regex parse error:");
        let mut regex = None;
        for line in lines {
            let line = line.trim();
            if let Some(detail) = line.strip_prefix("error: ") {
                text = format!("{}: {detail}", text.trim_end_matches(':'));
            } else if regex_error && regex.is_none() && !line.is_empty() {
                regex = Some(line.to_string());
            }
        }
        match regex {
            Some(regex) if !text.contains(&regex) => GrammarError(format!("{text} in /{regex}/")),
            _ => GrammarError(text),
        }
    }
}

/// The vocabulary as llguidance sees it, and the limits every grammar is compiled within:
/// made once per model, then a [`Constraint`] per sequence.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The grammars of a model whose logits have `vocab_size` entries, tokenized by
    /// `tokenizer`, ending at any of `end_ids`.
    pub fn new(
        tokenizer: &Tokenizer,
        vocab_size: usize,
        end_ids: &[u32],
    ) -> Result<Self, GrammarError> {
        let mut words = tokenizer.vocabulary_bytes();
        if words.len() > vocab_size {
            return Err(GrammarError(format!(
                "the tokenizer has {} tokens, more than the model's vocab_size {vocab_size}",
                words.len()
            )));
        }
        // Ids the model has but the tokenizer does not: special, so never produced by text.
        while words.len() < vocab_size {
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let first_end = *end_ids
            .first()
            .ok_or_else(|| GrammarError("the model has no end-of-sequence id".into()))?;
        let info = TokRxInfo::new(vocab_size as u32, first_end);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(end_ids);
        let env: TokEnv = Arc::new(Vocabulary {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(GrammarError::from)?;
        // llguidance's default limits bound the work a hostile grammar can ask for
        // (compiling it, each token's mask) and answer with an error instead.
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A constraint following `grammar` from the start of a generation. Its first mask is
    /// computed here, so that a grammar past llguidance's limits from the start (thousands
    /// of optional properties, say) fails now, not at the first token.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let parser = self.factory.create_parser(grammar.top_level()?);
        let mut matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::from(e));
        }
        matcher.compute_mask_or_eos().map_err(GrammarError::from)?;
        Ok(Constraint { matcher })
    }
}

/// One sequence's grammar: what it allows next, and the tokens taken so far.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Sets the logit of every token the grammar does not allow next to -inf (an end id
    /// stays only where the grammar accepts the text so far).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        // Once the grammar is complete, only an end id.
        let allowed = (self.matcher.compute_mask_or_eos()).map_err(GrammarError::from)?;
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Takes `token` as the next one.
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(GrammarError::from)
    }

    /// A copy following the same grammar from the same point (another choice of a request).
    pub fn fork(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
        }
    }

    /// Whether the grammar has ended: nothing but an end id can follow.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// The vocabulary's trie and the tokenizer, as llguidance's [`TokenizerEnv`].
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokens of bytes the grammar forces: the model is steered to the first of them,
    /// so they are the tokenizer's own (what the model saw in training), as llguidance's
    /// Hugging Face binding makes them; bytes that are not UTF-8 (part of a character),
    /// and text the tokenizer fails on, the longest token at each point.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            (self.tokenizer.encode_rendered(text))
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::GrammarError;

    /// llguidance's messages (as it wrote them for these grammars) on one line, with the
    /// detail after their first line kept and the excerpts left out.
    #[test]
    fn grammar_errors_keep_their_detail_on_one_line() {
        for (raw, expected) in [
            (
                "at 1(8): invalid regex \"a(b\" (in regex): regex parse error:\n    a(b\n     ^\nerror: unclosed group\n   1 | start: /a(b/\n              ^\n",
                "at 1(8): invalid regex \"a(b\" (in regex): regex parse error: unclosed group",
            ),
            (
                "at 1(8): unknown name: \"foo\"\n   1 | start: foo\n              ^\n",
                "at 1(8): unknown name: \"foo\"",
            ),
            (
                "regex parse error:\n    a(b\n     ^\nerror: unclosed group",
                "regex parse error: unclosed group in /a(b/",
            ),
            ("one line", "one line"),
        ] {
            assert_eq!(GrammarError::from(raw).0, expected);
        }
    }
}
