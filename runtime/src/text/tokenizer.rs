//! The artifact's tokenizer (tokenizer.json) and chat template (tokenizer_config.json).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use serde::Deserialize;
use tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;

use crate::text::chat::{ChatError, ChatRequest, Message, Render};
use crate::util::file_names::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use crate::util::files::{FileError, read_bounded, read_text_bounded};
use crate::util::panics::catch_quietly;

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
    #[error(
        "invalid config: the tokenizer's largest token id {id} is outside the model's vocabulary (vocab_size {vocab_size})"
    )]
    DoesNotFit { id: u32, vocab_size: usize },
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
    #[error(
        "a message holds the special token {token:?}, and this model's chat template changes message contents too much to keep it as text; remove it from the message, or allow special tokens in messages"
    )]
    SpecialTokenInContent { token: String },
    #[error(
        "a tool or tool call holds the special token {token:?}, which the chat template would write as a control token; remove it, or allow special tokens in messages"
    )]
    SpecialTokenInTools { token: String },
}

/// What the text of a special token (`<|im_start|>`) inside a message's content becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ContentSpecials {
    /// Plain text, like any other characters: whoever writes a message cannot forge the
    /// template's control tokens (a `<|im_start|>system` turn inside a user message).
    #[default]
    Text,
    /// The special token itself, as transformers' `apply_chat_template`, llama-server and
    /// vLLM tokenize a rendered chat.
    Live,
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
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    /// Variables every chat is rendered with (`--chat-template-kwargs`).
    template_kwargs: serde_json::Map<String, serde_json::Value>,
    bos_token: String,
    eos_token: String,
    /// The special added tokens, id to text: what a message's content must not produce.
    special_tokens: BTreeMap<u32, String>,
    /// `inner` reading special tokens as text, made the first time a content holds one.
    as_text: OnceLock<TextTokenizers>,
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
        let special_tokens = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special && !token.content.is_empty())
            .map(|(id, token)| (id, token.content))
            .collect();
        Ok(Self {
            bos_token: text(&config.bos_token),
            eos_token: text(&config.eos_token),
            chat_template: config.chat_template,
            template_kwargs: Default::default(),
            inner,
            special_tokens,
            as_text: OnceLock::new(),
        })
    }

    /// The id of the token whose text is `text` exactly, if there is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The vocabulary's entry for `id` as it is stored (`Ġhello` for byte-level BPE), as
    /// transformers' `convert_ids_to_tokens` gives it.
    pub fn vocabulary_entry(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
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

    /// Checks that every id this tokenizer can produce is a row of an embedding of
    /// `vocab_size` rows (the model's `vocab_size`).
    pub fn check_fits(&self, vocab_size: usize) -> Result<(), TokenizerError> {
        let id = self.max_id();
        if id as usize >= vocab_size {
            return Err(TokenizerError::DoesNotFit { id, vocab_size });
        }
        Ok(())
    }

    /// Token ids of `text`, with whatever special tokens the tokenizer's post-processor adds
    /// (as transformers' `tokenizer(text)` does; none for SmolLM2).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, true)
    }

    /// Token ids of `text`, with the special tokens the post-processor adds only if
    /// `add_special_tokens` (transformers' `tokenizer(text, add_special_tokens=...)`).
    /// Special-token text in `text` is read as the token.
    pub fn encode_with(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        Ok(encoding(&self.inner, text, add_special_tokens)?
            .get_ids()
            .to_vec())
    }

    /// Token ids of a one-turn chat (optional system message, one user message) rendered
    /// in this process with the model's chat template and `add_generation_prompt`, as
    /// transformers' `apply_chat_template` does, special-token text in the messages kept
    /// as text ([`ContentSpecials::Text`]).
    pub fn encode_chat(
        &self,
        system: Option<&str>,
        user: &str,
    ) -> Result<Vec<u32>, TokenizerError> {
        let request = self.chat_request(system, user)?;
        self.encode_request(&request, &ChatRequest::render, ContentSpecials::Text)
    }

    /// Token ids of a conversation rendered by `render` with the model's chat template (see
    /// [`Tokenizer::encode_request`]).
    pub fn encode_messages(
        &self,
        messages: Vec<Message>,
        render: Render,
        specials: ContentSpecials,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_request(&self.chat_messages(messages)?, render, specials)
    }

    /// Token ids of `request` rendered by `render`. The template's own special tokens are
    /// control tokens; what special-token text inside a message's content becomes is
    /// `specials`' choice. A conversation whose contents hold no special-token text gets
    /// the same ids either way, those of [`Tokenizer::encode_rendered`].
    pub fn encode_request(
        &self,
        request: &ChatRequest,
        render: Render,
        specials: ContentSpecials,
    ) -> Result<Vec<u32>, TokenizerError> {
        Ok(self.encode_request_rendered(request, render, specials)?.0)
    }

    /// [`Tokenizer::encode_request`]'s ids, and the text they are of: what follows the
    /// prompt depends on how it ends (a `<think>` the template opened, say).
    pub fn encode_request_rendered(
        &self,
        request: &ChatRequest,
        render: Render,
        specials: ContentSpecials,
    ) -> Result<(Vec<u32>, String), TokenizerError> {
        if specials == ContentSpecials::Live {
            let text = render(request)?;
            return Ok((self.encode_rendered(&text)?, text));
        }
        if let Some(token) = self.special_text_in_tools(request) {
            return Err(TokenizerError::SpecialTokenInTools {
                token: token.to_string(),
            });
        }
        let chat = request.render_located(render)?;
        let ids = if let Some(contents) = &chat.contents {
            self.encode_contents_as_text(&chat.text, contents)?
        } else {
            // Contents that cannot be located can be tokenized as before only if that
            // cannot turn any of their text into a control token.
            match self.special_text_in(&request.messages) {
                None => self.encode_rendered(&chat.text)?,
                Some(token) => {
                    return Err(TokenizerError::SpecialTokenInContent {
                        token: token.to_string(),
                    });
                }
            }
        };
        Ok((ids, chat.text))
    }

    /// The first special token whose text a message's content holds.
    fn special_text_in(&self, messages: &[Message]) -> Option<&str> {
        self.special_text(messages.iter().map(Message::text))
    }

    /// The first special token whose text a tool or a tool call holds: a template writes
    /// those through `tojson`, where no content marker can locate them.
    fn special_text_in_tools(&self, request: &ChatRequest) -> Option<&str> {
        let json = |value: serde_json::Result<String>| value.expect("JSON values serialize");
        let calls = (request.messages.iter()).filter_map(|m| {
            m.tool_calls
                .as_ref()
                .map(|c| json(serde_json::to_string(c)))
        });
        let tools = (request.tools.as_ref()).map(|t| json(serde_json::to_string(t)));
        let texts: Vec<String> = calls.chain(tools).collect();
        self.special_text(texts.iter().map(String::as_str))
    }

    fn special_text<'a>(&self, texts: impl Iterator<Item = &'a str> + Clone) -> Option<&str> {
        self.special_tokens
            .values()
            .find(|token| texts.clone().any(|text| text.contains(token.as_str())))
            .map(String::as_str)
    }

    /// Token ids of a rendered chat whose `contents` ranges hold text only. The tokenizers
    /// crate splits its input at added tokens and encodes the pieces between them apart,
    /// so the ids are the rendered text's own (split at every special token), except that
    /// each piece between two of the template's special tokens that holds a special token
    /// from a content is encoded again as one piece, its special tokens read as text.
    fn encode_contents_as_text(
        &self,
        text: &str,
        contents: &[Range<usize>],
    ) -> Result<Vec<u32>, TokenizerError> {
        let whole = encoding(&self.inner, text, false)?;
        let (ids, offsets) = (whole.get_ids(), whole.get_offsets());
        let kind = |i: usize| match self.literal(text, ids[i], offsets[i]) {
            None => TokenKind::Text,
            Some(token)
                if contents
                    .iter()
                    .any(|c| c.start < token.end && token.start < c.end) =>
            {
                TokenKind::FromContent
            }
            Some(_) => TokenKind::Template,
        };
        let kinds: Vec<TokenKind> = (0..ids.len()).map(kind).collect();
        if !kinds.contains(&TokenKind::FromContent) {
            return Ok(ids.to_vec());
        }
        let mut out = Vec::with_capacity(ids.len());
        let mut piece = Piece::default();
        for (i, kind) in kinds.into_iter().enumerate() {
            match kind {
                TokenKind::Text => {}
                TokenKind::FromContent => piece.holds_special = true,
                TokenKind::Template => {
                    self.push_piece(&mut out, text, &piece, offsets[i].0, &ids[piece.token..i])?;
                    out.push(ids[i]);
                    piece = Piece {
                        byte: offsets[i].1,
                        token: i + 1,
                        holds_special: false,
                    };
                }
            }
        }
        self.push_piece(&mut out, text, &piece, text.len(), &ids[piece.token..])?;
        Ok(out)
    }

    /// Where the text of special token `id` lies, if it is one, within its `offsets` (which
    /// take in the spaces an `lstrip` or `rstrip` token swallows).
    fn literal(&self, text: &str, id: u32, (start, end): (usize, usize)) -> Option<Range<usize>> {
        let token = self.special_tokens.get(&id)?;
        let at = text
            .get(start..end)
            .and_then(|span| span.find(token.as_str()));
        Some(at.map_or(start..end, |at| start + at..start + at + token.len()))
    }

    /// Appends the ids of the piece of `text` from `piece` to byte `end`: `ids` as they
    /// were, or, if a content put a special token in it, its text encoded again with
    /// special tokens read as text.
    fn push_piece(
        &self,
        out: &mut Vec<u32>,
        text: &str,
        piece: &Piece,
        end: usize,
        ids: &[u32],
    ) -> Result<(), TokenizerError> {
        if !piece.holds_special {
            out.extend_from_slice(ids);
            return Ok(());
        }
        let span = text.get(piece.byte..end).ok_or_else(|| {
            TokenizerError::Encode(format!(
                "token offsets {}..{end} split a character",
                piece.byte
            ))
        })?;
        let as_text = self
            .as_text
            .get_or_init(|| TextTokenizers::new(&self.inner));
        let tokenizer = match (&as_text.after_start, piece.byte) {
            (Some(after_start), 1..) => after_start,
            _ => &as_text.at_start,
        };
        out.extend_from_slice(encoding(tokenizer, span, false)?.get_ids());
        Ok(())
    }

    /// The chat template's text for one turn, rendered in this process (see [`crate::text::chat`]
    /// for what that bounds).
    pub fn render_chat(&self, system: Option<&str>, user: &str) -> Result<String, TokenizerError> {
        Ok(self.chat_request(system, user)?.render()?)
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders chats with `template` from now on instead of the model's.
    pub fn set_chat_template(&mut self, template: String) {
        self.chat_template = Some(template);
    }

    /// Renders every chat with these variables too (Qwen3's `enable_thinking`); a
    /// request's own go over them.
    pub fn set_template_kwargs(&mut self, kwargs: serde_json::Map<String, serde_json::Value>) {
        self.template_kwargs = kwargs;
    }

    /// A one-turn chat (optional system message, one user message) for the model's chat
    /// template.
    pub fn chat_request(
        &self,
        system: Option<&str>,
        user: &str,
    ) -> Result<ChatRequest, TokenizerError> {
        let message = |role: &str, content: &str| Message::new(role, content);
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
            tools: None,
            kwargs: self.template_kwargs.clone(),
        })
    }

    /// Token ids of a rendered chat, every special token's text in it a control token
    /// (transformers', llama-server's and vLLM's way; [`ContentSpecials::Live`]).
    pub fn encode_rendered(&self, rendered: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(rendered, false)
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Text of `ids`, special tokens' text kept (transformers' `decode(ids)`; what
    /// llama-server's and vLLM's `/detokenize` give).
    pub fn decode_with_specials(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// What token `id` writes: [`Self::token_bytes`] for a text token, its text for a
    /// special one (llama.cpp's `token_to_piece` with specials shown).
    pub fn piece_bytes(&self, id: u32) -> Vec<u8> {
        match self.inner.id_to_token(id) {
            Some(token) if self.inner.get_added_vocabulary().is_special_token(&token) => {
                token.into_bytes()
            }
            _ => self.token_bytes(id),
        }
    }

    /// The bytes of text token `id` stands for, exact also when it holds part of a
    /// character (which [`Self::decode`] shows as U+FFFD): the bytes of a generation's
    /// tokens, one after another, are its text's. A special token, which `decode` leaves
    /// out, has none.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let text = self.decode(&[id]).unwrap_or_default();
        let token = self.inner.id_to_token(id).unwrap_or_default();
        // A SentencePiece piece's `▁` is a space, which a decoder's `Strip` (Llama 2's,
        // Mistral's) drops from the start of what it decodes, a lone token too: the piece's
        // own text keeps it, as llama.cpp's `token_to_piece` does.
        let special = || self.inner.get_added_vocabulary().is_special_token(&token);
        if token.starts_with('\u{2581}') && !text.starts_with(' ') && !special() {
            return token.replace('\u{2581}', " ").into_bytes();
        }
        if !text.contains(char::REPLACEMENT_CHARACTER) {
            return text.into_bytes();
        }
        // Part of a character: the vocabulary entry's own bytes.
        (byte_fallback(&token).or_else(|| byte_level(&token))).unwrap_or_else(|| text.into_bytes())
    }

    /// Every token's bytes, by id up to [`Self::max_id`], as a grammar engine needs them
    /// (llguidance's token trie): a vocabulary entry's exact bytes (GPT-2's alphabet mapped
    /// back for byte-level BPE, `▁` as a space for SentencePiece pieces, `<0xNN>` as its
    /// byte), an added token's text as it is, and a special token (or an id no token has) as
    /// `0xFF` then its text, which no text can produce. The bytes of `encode(text)`'s
    /// tokens, one after another, are the text's.
    pub fn vocabulary_bytes(&self) -> Vec<Vec<u8>> {
        let byte_level_bpe = self.decodes_byte_level();
        let added = self.inner.get_added_tokens_decoder();
        let special = |text: &str| [&[0xFF], text.as_bytes()].concat();
        (0..=self.max_id())
            .map(|id| match added.get(&id) {
                Some(token) if token.special => special(&token.content),
                Some(token) => token.content.clone().into_bytes(),
                None => match self.inner.id_to_token(id) {
                    None => special(&format!("<[{id}]>")),
                    Some(piece) => byte_fallback(&piece)
                        .or_else(|| byte_level_bpe.then(|| byte_level(&piece)).flatten())
                        .unwrap_or_else(|| piece.replace('\u{2581}', " ").into_bytes()),
                },
            })
            .collect()
    }

    /// Whether the decoder maps tokens through GPT-2's byte alphabet (byte-level BPE).
    fn decodes_byte_level(&self) -> bool {
        use tokenizers::DecoderWrapper;
        fn has(decoder: &DecoderWrapper) -> bool {
            match decoder {
                DecoderWrapper::ByteLevel(_) => true,
                DecoderWrapper::Sequence(sequence) => sequence.get_decoders().iter().any(has),
                _ => false,
            }
        }
        self.inner.get_decoder().is_some_and(has)
    }

    /// An incremental decoder: yields text only once it forms whole UTF-8 characters.
    pub fn decode_stream(&self) -> TextStream<'_> {
        TextStream {
            inner: self.inner.decode_stream(true),
        }
    }
}

/// The tokenizers crate's encoding of `text`. It panics where Oniguruma gives up on a regex
/// (its backtracking limit), which a tokenizer.json can provoke: that is an error here.
fn encoding(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<tokenizers::Encoding, TokenizerError> {
    catch_quietly(|| tokenizer.encode(text, add_special_tokens))
        .map_err(TokenizerError::Encode)?
        .map_err(|e| TokenizerError::Encode(e.to_string()))
}

/// What a token of a rendered chat is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenKind {
    /// Not a special token.
    Text,
    /// A special token the template wrote.
    Template,
    /// A special token whose text (some of it) a message's content wrote.
    FromContent,
}

/// Where the piece of a rendered chat between two of the template's special tokens begins.
#[derive(Default)]
struct Piece {
    byte: usize,
    /// Its first token in the rendered chat's encoding.
    token: usize,
    /// Whether a content put a special token's text in it.
    holds_special: bool,
}

/// A tokenizer reading special tokens as text, in two variants: Metaspace's
/// `prepend_scheme: first` adds its `▁` only to a piece at the start of the input, so a
/// piece taken from further in is encoded with `never`, as it is within the whole input.
#[derive(Clone)]
struct TextTokenizers {
    at_start: tokenizers::Tokenizer,
    /// `None` when no pre-tokenizer depends on where a piece is.
    after_start: Option<tokenizers::Tokenizer>,
}

impl TextTokenizers {
    fn new(inner: &tokenizers::Tokenizer) -> Self {
        let mut at_start = inner.clone();
        at_start.set_encode_special_tokens(true);
        let after_start = at_start.get_pre_tokenizer().cloned().and_then(|mut pre| {
            prepend_never(&mut pre).then(|| {
                let mut after_start = at_start.clone();
                after_start.with_pre_tokenizer(Some(pre));
                after_start
            })
        });
        Self {
            at_start,
            after_start,
        }
    }
}

/// Turns every Metaspace `prepend_scheme: first` in `pre` into `never`; whether there was one.
fn prepend_never(pre: &mut PreTokenizerWrapper) -> bool {
    match pre {
        PreTokenizerWrapper::Metaspace(metaspace)
            if metaspace.get_prepend_scheme() == PrependScheme::First =>
        {
            metaspace.set_prepend_scheme(PrependScheme::Never);
            true
        }
        PreTokenizerWrapper::Sequence(sequence) => {
            // Every one changed, not only the first: no short-circuit.
            let mut found = false;
            for pre in sequence.as_mut() {
                found |= prepend_never(pre);
            }
            found
        }
        _ => false,
    }
}

/// A byte-fallback token's byte (SentencePiece's `<0xE3>`).
fn byte_fallback(token: &str) -> Option<Vec<u8>> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    let byte = u8::from_str_radix(hex, 16)
        .ok()
        .filter(|_| hex.len() == 2)?;
    Some(vec![byte])
}

/// A byte-level BPE token's bytes (GPT-2's alphabet: a byte that prints is its own
/// character, the others are U+0100 onwards in byte order).
fn byte_level(token: &str) -> Option<Vec<u8>> {
    let prints = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let shifted: Vec<u8> = (0..=255).filter(|&b| !prints(b)).collect();
    (token.chars())
        .map(|c| match u32::from(c) {
            n @ 0..=255 => u8::try_from(n).ok().filter(|&b| prints(b)),
            n => shifted.get(usize::try_from(n - 256).ok()?).copied(),
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A SentencePiece-style vocabulary (Llama 2's layout: `▁` for spaces, a space
    /// prepended, byte-fallback pieces): a grammar's token bytes spell what the tokenizer
    /// encodes (with the prepended space), bytes it has no piece for through their
    /// `<0xNN>` pieces, and the special tokens are marked.
    #[test]
    fn vocabulary_bytes_of_a_sentencepiece_vocabulary() {
        let special = |id: u32, content: &str| {
            serde_json::json!({"id": id, "content": content, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        };
        let mut vocab = serde_json::Map::new();
        for (id, piece) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
            vocab.insert(piece.to_string(), id.into());
        }
        for byte in 0..=255u32 {
            vocab.insert(format!("<0x{byte:02X}>"), (3 + byte).into());
        }
        for (i, piece) in [
            "\u{2581}",
            "h",
            "e",
            "l",
            "o",
            "w",
            "r",
            "d",
            "\u{2581}h",
            "ll",
        ]
        .iter()
        .enumerate()
        {
            vocab.insert(piece.to_string(), (259 + i).into());
        }
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u{2581}"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]},
            "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": vocab, "merges": ["\u{2581} h", "l l"]}
        });
        let tokenizer = Tokenizer::from_json(json.to_string().as_bytes(), None).unwrap();
        let words = tokenizer.vocabulary_bytes();
        assert_eq!(words.len(), 269);
        for text in ["hello world", "hold the door", "h\u{e9}llo \u{1f389}"] {
            let ids = tokenizer.encode(text).unwrap();
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&id| words[id as usize].clone())
                .collect();
            assert_eq!(bytes, format!(" {text}").into_bytes(), "{text}: {ids:?}");
            // A generation's text token by token: the decoder's `Strip` drops each lone
            // token's leading space, which the piece keeps (words stay apart).
            let streamed: Vec<u8> = ids
                .iter()
                .flat_map(|&id| tokenizer.token_bytes(id))
                .collect();
            assert_eq!(streamed, bytes, "{text}: {ids:?}");
        }
        assert_eq!(words[1], b"\xFF<s>");
        assert_eq!(words[3 + 0xC3], [0xC3]);
    }

    #[test]
    fn token_bytes_undo_the_byte_level_alphabet_and_byte_fallback() {
        // GPT-2's alphabet, built forward: each byte's character.
        let prints = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 256;
        for byte in 0..=255u8 {
            let c = if prints(byte) {
                char::from(byte)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            };
            assert_eq!(byte_level(&c.to_string()), Some(vec![byte]), "{byte}");
        }
        // An emoji's first two bytes, a space before a word, a newline.
        assert_eq!(byte_level("ðŁ"), Some(vec![0xF0, 0x9F]));
        assert_eq!(byte_level("Ġsun"), Some(b" sun".to_vec()));
        assert_eq!(byte_level("Ċ"), Some(b"\n".to_vec()));
        assert_eq!(byte_level("▁sun"), None);
        assert_eq!(byte_fallback("<0xE3>"), Some(vec![0xE3]));
        for token in ["<0xZZ>", "<0x123>", "<0x>", "0xE3"] {
            assert_eq!(byte_fallback(token), None, "{token}");
        }
    }

    /// A word-level tokenizer with Metaspace's `prepend_scheme: first` (Mistral v0.3's
    /// pre-tokenizer), `specials` its special added tokens, and a template writing
    /// `[INST]{content}[/INST]`.
    fn metaspace(specials: &[&str]) -> Tokenizer {
        let words = ["<unk>", "hi", "▁hi", "▁there", "▁</s>", "▁"];
        let added: Vec<_> = ["<s>", "[INST]", "[/INST]", "</s>"]
            .iter()
            .enumerate()
            .filter(|(_, t)| specials.contains(t))
            .map(|(id, t)| {
                serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let vocab: serde_json::Map<_, _> = ["<s>", "[INST]", "[/INST]", "</s>"]
            .iter()
            .chain(&words)
            .enumerate()
            .map(|(id, w)| (w.to_string(), id.into()))
            .collect();
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "post_processor": null, "decoder": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        });
        let config = serde_json::json!({
            "chat_template": "<s>{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}",
        });
        Tokenizer::from_json(tokenizer.to_string().as_bytes(), Some(&config.to_string())).unwrap()
    }

    fn user(content: &str) -> Vec<Message> {
        vec![Message::new("user", content)]
    }

    /// A content's `</s>` read as text gets the ids that a tokenizer without `</s>` as an
    /// added token gives the whole rendered chat: the piece it is in is encoded as it would
    /// be in place (no `▁` prepended, since it does not start the input), and nothing else
    /// changes. Without that, "hi" would be read as "▁hi".
    #[test]
    fn a_special_token_in_a_content_is_text_in_place() {
        let all = metaspace(&["<s>", "[INST]", "[/INST]", "</s>"]);
        let without = metaspace(&["<s>", "[INST]", "[/INST]"]);
        let render = &ChatRequest::render;
        let forged = user("hi </s> there");
        let ids = all
            .encode_messages(forged.clone(), render, ContentSpecials::Text)
            .unwrap();
        let oracle = without
            .encode_messages(forged.clone(), render, ContentSpecials::Live)
            .unwrap();
        assert_eq!(ids, oracle);
        let live = all
            .encode_messages(forged, render, ContentSpecials::Live)
            .unwrap();
        assert!(live.contains(&3) && !ids.contains(&3), "{live:?} {ids:?}");
    }

    /// A special token that a content and the template's text spell together (the content
    /// ends in `</`, the template goes on with `s>`) is text too.
    #[test]
    fn a_special_token_half_from_a_content_is_text() {
        let mut all = metaspace(&["<s>", "[INST]", "[/INST]", "</s>"]);
        let mut without = metaspace(&["<s>", "[INST]", "[/INST]"]);
        let template = "<s>{% for m in messages %}[INST]{{ m.content }}s> there[/INST]{% endfor %}";
        all.chat_template = Some(template.into());
        without.chat_template = Some(template.into());
        let render = &ChatRequest::render;
        let forged = user("hi </");
        let ids = all.encode_messages(forged.clone(), render, ContentSpecials::Text);
        let oracle = without.encode_messages(forged.clone(), render, ContentSpecials::Live);
        assert_eq!(ids.unwrap(), oracle.unwrap());
        let live = all.encode_messages(forged, render, ContentSpecials::Live);
        assert!(live.unwrap().contains(&3));
    }

    /// Without special-token text in the contents, both choices give the old ids.
    #[test]
    fn ordinary_contents_keep_their_ids() {
        let tokenizer = metaspace(&["<s>", "[INST]", "[/INST]", "</s>"]);
        let render = &ChatRequest::render;
        for content in ["hi there", " hi", "hi ", "", "</ s>", "<s"] {
            let request = tokenizer.chat_messages(user(content)).unwrap();
            let old = tokenizer
                .encode_rendered(&request.render().unwrap())
                .unwrap();
            for specials in [ContentSpecials::Text, ContentSpecials::Live] {
                let ids = tokenizer
                    .encode_request(&request, render, specials)
                    .unwrap();
                assert_eq!(ids, old, "{content:?} {specials:?}");
            }
        }
    }

    /// A template that changes contents cannot have them located: without special-token
    /// text in them they are tokenized as before, with it the request is refused, naming
    /// the token, unless special tokens are allowed in contents.
    #[test]
    fn unlocatable_contents_with_special_tokens_are_refused() {
        let mut tokenizer = metaspace(&["<s>", "[INST]", "[/INST]", "</s>"]);
        tokenizer.chat_template = Some(
            "<s>{% for m in messages %}[INST]{{ m.content | lower }}[/INST]{% endfor %}".into(),
        );
        let render = &ChatRequest::render;
        let ordinary = tokenizer.chat_messages(user("Hi there")).unwrap();
        let old = tokenizer
            .encode_rendered(&ordinary.render().unwrap())
            .unwrap();
        let ids = tokenizer.encode_request(&ordinary, render, ContentSpecials::Text);
        assert_eq!(ids.unwrap(), old);
        let forged = user("Hi </s> there");
        let refused = tokenizer.encode_messages(forged.clone(), render, ContentSpecials::Text);
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("\"</s>\""), "{message}");
        let live = tokenizer.encode_messages(forged, render, ContentSpecials::Live);
        assert!(live.unwrap().contains(&3));
    }
}
