//! The artifact's tokenizer (tokenizer.json) and chat template (tokenizer_config.json).

use std::path::Path;

use serde::Deserialize;

use crate::artifact::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use crate::config::{ConfigError, LlamaConfig};
use crate::files::{FileError, read_bounded, read_text_bounded};
use crate::panics::catch_quietly;

/// Largest tokenizer.json we read (Llama 3's is 9 MB).
pub const TOKENIZER_LIMIT: u64 = 64 << 20;
/// Largest tokenizer_config.json we read (chat templates and added-token tables included).
pub const TOKENIZER_CONFIG_LIMIT: u64 = 16 << 20;

/// Bounds on rendering a chat template, which comes with the model: enough for any real
/// template over a long conversation, far too little to hang or exhaust memory.
const TEMPLATE_FUEL: u64 = 1_000_000;
const TEMPLATE_RECURSION: usize = 64;
/// Most bytes a rendered chat may have.
pub const TEMPLATE_OUTPUT_LIMIT: usize = 16 << 20;

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

    /// Checks that this tokenizer fits the model of `config`: every id it can produce is a
    /// row of the embedding, and its chat template, if any, renders within its bounds.
    pub fn check_fits(&self, config: &LlamaConfig) -> Result<(), TokenizerError> {
        config.check_token_id(self.max_id(), "the tokenizer's largest token id")?;
        match self.render_chat(Some("You are a test."), "Hello") {
            Ok(_) | Err(TokenizerError::NoChatTemplate) => Ok(()),
            Err(e) => Err(e),
        }
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
        // The template comes with the model: bound its work and its output.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION);
        env.add_template("chat", template)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let mut out = LimitedOutput(Vec::new());
        let template = env
            .get_template("chat")
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        template
            .render_captured_to(context, &mut out)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        String::from_utf8(out.0).map_err(|e| TokenizerError::Template(e.to_string()))
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

/// The rendered chat, refused past [`TEMPLATE_OUTPUT_LIMIT`] bytes.
struct LimitedOutput(Vec<u8>);

impl std::io::Write for LimitedOutput {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + bytes.len() > TEMPLATE_OUTPUT_LIMIT {
            return Err(std::io::Error::other(format!(
                "the chat template's output passes {TEMPLATE_OUTPUT_LIMIT} bytes"
            )));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
