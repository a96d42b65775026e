//! The artifact's tokenizer (tokenizer.json) and chat template (tokenizer_config.json).

use std::path::Path;

use serde::Deserialize;

use crate::artifact::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use crate::chat::{ChatError, ChatRequest, Message};
use crate::config::{ConfigError, LlamaConfig};
use crate::files::{FileError, read_bounded, read_text_bounded};
use crate::panics::catch_quietly;

/// Largest tokenizer.json we read (Llama 3's is 9 MB).
pub const TOKENIZER_LIMIT: u64 = 64 << 20;
/// Largest tokenizer_config.json we read (chat templates and added-token tables included).
pub const TOKENIZER_CONFIG_LIMIT: u64 = 16 << 20;

/// Errors loading or using the tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: invalid tokenizer: {message}")]
    Load { path: String, message: String },
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Model(#[from] ConfigError),
    #[error("cannot tokenize: {0}")]
    Encode(String),
    #[error("cannot decode: {0}")]
    Decode(String),
    #[error("{path}: {message}")]
    Config { path: String, message: String },
    #[error("--chat needs a chat_template in {TOKENIZER_CONFIG_FILE}, and this model has none")]
    NoChatTemplate,
    #[error(transparent)]
    Chat(#[from] ChatError),
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
        let tokenizer = read_bounded(&path, TOKENIZER_LIMIT)?;
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = match read_text_bounded(&config_path, TOKENIZER_CONFIG_LIMIT) {
            Ok(text) => Some(text),
            // Optional: without it there is no chat template.
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        Self::from_json(&tokenizer, config.as_deref()).map_err(|e| match e {
            TokenizerError::Load { message, .. } => TokenizerError::Load {
                path: path.display().to_string(),
                message,
            },
            TokenizerError::Config { message, .. } => TokenizerError::Config {
                path: config_path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// A tokenizer from the contents of tokenizer.json and, if there is one,
    /// tokenizer_config.json.
    pub fn from_json(tokenizer: &[u8], config: Option<&str>) -> Result<Self, TokenizerError> {
        let load_error = |message: String| TokenizerError::Load {
            path: TOKENIZER_FILE.into(),
            message,
        };
        let inner = catch_quietly(|| tokenizers::Tokenizer::from_bytes(tokenizer))
            .map_err(&load_error)?
            .map_err(|e| load_error(e.to_string()))?;
        let config: TokenizerConfig = match config {
            Some(text) => serde_json::from_str(text).map_err(|e| TokenizerError::Config {
                path: TOKENIZER_CONFIG_FILE.into(),
                message: e.to_string(),
            })?,
            None => TokenizerConfig::default(),
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

    /// The largest token id this tokenizer can produce (vocabulary and added tokens).
    pub fn max_id(&self) -> u32 {
        let vocab = self.inner.get_vocab(true);
        vocab.values().copied().max().unwrap_or(0)
    }

    /// The most bytes of text one token can stand for (its longest vocabulary entry), so
    /// `n` tokens cover at most `n * max_token_bytes()` bytes: what bounds how much text is
    /// worth tokenizing. (Pre-tokenizers that drop text, such as whitespace splitting, can
    /// make a token stand for more; byte-level BPE covers every byte.)
    pub fn max_token_bytes(&self) -> usize {
        let vocab = self.inner.get_vocab(true);
        vocab.keys().map(String::len).max().unwrap_or(1).max(1)
    }

    /// Checks that every id this tokenizer can produce is a row of the embedding of the
    /// model of `config`.
    pub fn check_fits(&self, config: &LlamaConfig) -> Result<(), TokenizerError> {
        config.check_token_id(self.max_id(), "the tokenizer's largest token id")?;
        Ok(())
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
        // The tokenizers crate panics where Oniguruma gives up on a regex (its backtracking
        // limit), which a tokenizer.json can provoke.
        let encoding = catch_quietly(|| self.inner.encode(text, add_special_tokens))
            .map_err(TokenizerError::Encode)?
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
        self.encode_rendered(&self.render_chat(system, user)?)
    }

    /// The chat template's text for one turn, rendered in this process (see [`crate::chat`]
    /// for what that bounds).
    pub fn render_chat(&self, system: Option<&str>, user: &str) -> Result<String, TokenizerError> {
        Ok(self.chat_request(system, user)?.render()?)
    }

    /// A one-turn chat (optional system message, one user message) for the model's chat
    /// template.
    pub fn chat_request(
        &self,
        system: Option<&str>,
        user: &str,
    ) -> Result<ChatRequest, TokenizerError> {
        let message = |role: &str, content: &str| Message {
            role: role.into(),
            content: content.into(),
        };
        let mut messages = Vec::new();
        messages.extend(system.map(|system| message("system", system)));
        messages.push(message("user", user));
        self.chat_messages(messages)
    }

    /// A conversation (system, user and assistant messages, in order) for the model's chat
    /// template.
    pub fn chat_messages(&self, messages: Vec<Message>) -> Result<ChatRequest, TokenizerError> {
        let template = self
            .chat_template
            .clone()
            .ok_or(TokenizerError::NoChatTemplate)?;
        Ok(ChatRequest {
            template,
            bos_token: self.bos_token.clone(),
            eos_token: self.eos_token.clone(),
            messages,
        })
    }

    /// Token ids of a rendered chat, which already holds its special tokens.
    pub fn encode_rendered(&self, rendered: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(rendered, false)
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
