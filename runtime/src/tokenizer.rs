//! The artifact's tokenizer (tokenizer.json) and chat template (tokenizer_config.json).

use std::path::Path;

use serde::Deserialize;

use crate::artifact::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};

/// Errors loading or using the tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: invalid tokenizer: {message}")]
    Load { path: String, message: String },
    #[error("cannot tokenize: {0}")]
    Encode(String),
    #[error("cannot decode: {0}")]
    Decode(String),
    #[error("{path}: {message}")]
    Config { path: String, message: String },
    #[error("--chat needs a chat_template in {TOKENIZER_CONFIG_FILE}, and this model has none")]
    NoChatTemplate,
    #[error("cannot render the chat template: {0}")]
    Template(String),
}

/// The keys of tokenizer_config.json we use. Special tokens are strings in most files and
/// `{"content": ...}` objects in older ones.
#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    chat_template: Option<String>,
    bos_token: Option<SpecialToken>,
    eos_token: Option<SpecialToken>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Object { content: String },
}

impl SpecialToken {
    fn text(&self) -> &str {
        match self {
            SpecialToken::Text(t) | SpecialToken::Object { content: t } => t,
        }
    }
}

/// A tokenizer with the model's chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: String,
    eos_token: String,
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, if present, `tokenizer_config.json` from `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join(TOKENIZER_FILE);
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizerError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config: TokenizerConfig = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| TokenizerError::Config {
                path: config_path.display().to_string(),
                message: e.to_string(),
            })?,
            // Optional: without it there is no chat template.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokenizerConfig::default(),
            Err(e) => {
                return Err(TokenizerError::Config {
                    path: config_path.display().to_string(),
                    message: e.to_string(),
                });
            }
        };
        let text =
            |t: &Option<SpecialToken>| t.as_ref().map(|t| t.text().to_string()).unwrap_or_default();
        Ok(Self {
            bos_token: text(&config.bos_token),
            eos_token: text(&config.eos_token),
            chat_template: config.chat_template,
            inner,
        })
    }

    /// Token ids of `text`, with whatever special tokens the tokenizer's post-processor adds
    /// (as transformers' `tokenizer(text)` does; none for SmolLM2).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, true)
    }

    fn encode_with(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of a one-turn chat (optional system message, one user message) rendered
    /// with the model's chat template and `add_generation_prompt`, as transformers'
    /// `apply_chat_template` does.
    pub fn encode_chat(
        &self,
        system: Option<&str>,
        user: &str,
    ) -> Result<Vec<u32>, TokenizerError> {
        let rendered = self.render_chat(system, user)?;
        // The template already wrote the special tokens.
        self.encode_with(&rendered, false)
    }

    /// The chat template's text for one turn.
    pub fn render_chat(&self, system: Option<&str>, user: &str) -> Result<String, TokenizerError> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(minijinja::context! { role => "system", content => system });
        }
        messages.push(minijinja::context! { role => "user", content => user });
        let mut env = minijinja::Environment::new();
        // Hugging Face templates are written for Jinja2 as transformers runs it
        // (`trim_blocks=True, lstrip_blocks=True`).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template("chat", template)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        env.get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => self.bos_token,
                    eos_token => self.eos_token,
                })
            })
            .map_err(|e| TokenizerError::Template(e.to_string()))
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// An incremental decoder: yields text only once it forms whole UTF-8 characters.
    pub fn decode_stream(&self) -> TextStream<'_> {
        TextStream {
            inner: self.inner.decode_stream(true),
        }
    }
}

type InnerStream<'a> = tokenizers::tokenizer::DecodeStream<
    'a,
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

/// Streaming detokenizer (tokenizers' `DecodeStream`).
pub struct TextStream<'a> {
    inner: InnerStream<'a>,
}

impl TextStream<'_> {
    /// Adds `id`; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        self.inner
            .step(id)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }
}
