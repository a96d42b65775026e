//! The tokenizer and chat template over HTTP, as llama-server and vLLM serve them:
//! `POST /tokenize`, `POST /detokenize` and `POST /apply-template` (llama-server's name: the
//! prompt a chat request would run, as text).
//!
//! The two servers' shapes differ and both are read: text under llama-server's `content`
//! (special tokens not added unless `add_special`) or vLLM's `prompt` (added unless
//! `add_special_tokens: false`), or a conversation under `messages` (rendered as
//! `/v1/chat/completions` renders it); pieces as llama-server's `with_pieces` (`{id, piece}`
//! objects) or vLLM's `return_token_strs` (the vocabulary's entries). The answer carries
//! both servers' fields (`tokens`, `count`, `max_model_len`; `content` and `prompt` from
//! `/detokenize`), so either's clients read it.

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use runtime::text::tokenizer::{Tokenizer, TokenizerError};
use serde_json::{Map, Value, json};

use crate::api::{self, Prompt};
use crate::error::ApiError;
use crate::routes::{State, Template, Tokenized, check_model, ready, tokenize};

pub(crate) fn routes() -> Router<State> {
    Router::new()
        .route(
            "/tokenize",
            post(|s: Extract<State>, b: Bytes| run(s, b, tokenize_body)),
        )
        .route(
            "/detokenize",
            post(|s: Extract<State>, b: Bytes| run(s, b, detokenize_body)),
        )
        .route(
            "/apply-template",
            post(|s: Extract<State>, b: Bytes| run(s, b, apply_template)),
        )
}

/// Runs `handler` off the async threads (templates and tokenizers are CPU work).
async fn run(
    Extract(state): Extract<State>,
    body: Bytes,
    handler: fn(&State, &[u8]) -> Result<Value, ApiError>,
) -> Response {
    let answer = tokio::task::spawn_blocking(move || handler(&state, &body)).await;
    match answer {
        Ok(Ok(answer)) => Json(answer).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => {
            ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

fn tokenize_body(state: &State, body: &[u8]) -> Result<Value, ApiError> {
    let loaded = ready(state)?;
    let tokenizer = &loaded.tokenizer;
    let mut fields = api::object(body)?;
    let with_pieces = api::take(&mut fields, "with_pieces")?.unwrap_or(false);
    let token_strs = api::take(&mut fields, "return_token_strs")?.unwrap_or(false);
    let ids = if fields.contains_key("messages") {
        chat_ids(state, fields)?
    } else {
        text_ids(state, tokenizer, fields)?
    };
    let tokens: Vec<Value> = if with_pieces {
        ids.iter().map(|&id| piece(tokenizer, id)).collect()
    } else {
        ids.iter().map(|&id| id.into()).collect()
    };
    let mut answer = json!({"tokens": tokens, "count": ids.len(), "max_model_len": loaded.context});
    if token_strs {
        let entries = ids.iter().map(|&id| tokenizer.vocabulary_entry(id));
        answer["token_strs"] = entries.collect::<Vec<_>>().into();
    }
    Ok(answer)
}

/// A conversation's ids, as a chat request with the same fields would run it.
fn chat_ids(state: &State, mut fields: Map<String, Value>) -> Result<Vec<u32>, ApiError> {
    generation_prompt(&mut fields)?;
    // vLLM's: the template's own special tokens are always added here.
    api::take::<bool>(&mut fields, "add_special_tokens")?;
    let request = chat_request(state, fields)?;
    let loaded = ready(state)?;
    let (prompt, template) = template_of(request);
    let specials = state.options.content_specials;
    let Tokenized { ids, .. } = tokenize(&loaded.tokenizer, prompt, &template, specials)?;
    Ok(ids)
}

/// Text's ids: llama-server's `content` or vLLM's `prompt`, each with its server's default
/// for adding the tokenizer's special tokens.
fn text_ids(
    state: &State,
    tokenizer: &Tokenizer,
    mut fields: Map<String, Value>,
) -> Result<Vec<u32>, ApiError> {
    let model = api::take::<String>(&mut fields, "model")?;
    check_model(state, model.as_deref())?;
    let content = api::take::<String>(&mut fields, "content")?;
    let prompt = api::take::<String>(&mut fields, "prompt")?;
    let llama_add = api::take::<bool>(&mut fields, "add_special")?;
    let vllm_add = api::take::<bool>(&mut fields, "add_special_tokens")?;
    if api::take::<bool>(&mut fields, "parse_special")? == Some(false) {
        return Err(ApiError::invalid_field(
            "parse_special",
            "parse_special: false is not supported: special-token text is read as the token",
        ));
    }
    no_other_fields(&fields)?;
    let (text, add) = match (content, prompt) {
        (Some(text), None) => (text, llama_add.or(vllm_add).unwrap_or(false)),
        (None, Some(text)) => (text, vllm_add.or(llama_add).unwrap_or(true)),
        _ => {
            return Err(ApiError::invalid(
                "give the text as content (llama-server) or prompt (vLLM), or a conversation as messages",
            ));
        }
    };
    let param = if add { "add_special" } else { "content" };
    (tokenizer.encode_with(&text, add)).map_err(|e| ApiError::invalid_field(param, e.to_string()))
}

/// llama-server's piece: the token's text, or its bytes where they are not whole UTF-8.
fn piece(tokenizer: &Tokenizer, id: u32) -> Value {
    let bytes = tokenizer.piece_bytes(id);
    match String::from_utf8(bytes) {
        Ok(text) => json!({"id": id, "piece": text}),
        Err(e) => json!({"id": id, "piece": e.into_bytes()}),
    }
}

fn detokenize_body(state: &State, body: &[u8]) -> Result<Value, ApiError> {
    let tokenizer = &ready(state)?.tokenizer;
    let mut fields = api::object(body)?;
    let model = api::take::<String>(&mut fields, "model")?;
    check_model(state, model.as_deref())?;
    let ids: Vec<u32> = api::take(&mut fields, "tokens")?
        .ok_or_else(|| ApiError::invalid_field("tokens", "tokens is required"))?;
    no_other_fields(&fields)?;
    let max = tokenizer.max_id();
    if let Some(id) = ids.iter().find(|&&id| id > max) {
        return Err(ApiError::invalid_field(
            "tokens",
            format!("token id {id} is not in the vocabulary (0 to {max})"),
        ));
    }
    let text = (tokenizer.decode_with_specials(&ids))
        .map_err(|e: TokenizerError| ApiError::invalid_field("tokens", e.to_string()))?;
    Ok(json!({"content": text, "prompt": text}))
}

/// The prompt a chat request with the same fields would run, as text.
fn apply_template(state: &State, body: &[u8]) -> Result<Value, ApiError> {
    let mut fields = api::object(body)?;
    generation_prompt(&mut fields)?;
    let request = chat_request(state, fields)?;
    let tokenizer = &ready(state)?.tokenizer;
    let (prompt, template) = template_of(request);
    let Prompt::Chat(messages) = prompt else {
        unreachable!("a chat request's prompt is its messages")
    };
    let invalid = |e: TokenizerError| ApiError::invalid_field("messages", e.to_string());
    let chat = template.chat(tokenizer, messages).map_err(invalid)?;
    let text = chat
        .render()
        .map_err(|e| ApiError::invalid_field("messages", e.to_string()))?;
    Ok(json!({"prompt": text}))
}

/// vLLM's `add_generation_prompt`: only `true` (the default), as every chat here runs.
fn generation_prompt(fields: &mut Map<String, Value>) -> Result<(), ApiError> {
    match api::take::<bool>(fields, "add_generation_prompt")? {
        Some(false) => Err(ApiError::invalid_field(
            "add_generation_prompt",
            "add_generation_prompt: false is not supported: chats are rendered for an answer",
        )),
        _ => Ok(()),
    }
}

/// The fields read as a `/v1/chat/completions` body (its checks, its template variables).
fn chat_request(state: &State, fields: Map<String, Value>) -> Result<api::Request, ApiError> {
    let body = serde_json::to_vec(&fields).expect("a JSON object serializes");
    let request = api::chat(&body)?;
    check_model(state, request.model.as_deref())?;
    Ok(request)
}

fn template_of(mut request: api::Request) -> (Prompt, Template) {
    let template = Template {
        tools: request.tools.as_ref().map(|t| t.offered.clone()),
        kwargs: std::mem::take(&mut request.template_kwargs),
    };
    let prompt = request
        .prompts
        .pop()
        .expect("a chat request has one prompt");
    (prompt, template)
}

/// 400 naming the first field no shape of this route has.
fn no_other_fields(fields: &Map<String, Value>) -> Result<(), ApiError> {
    match fields.keys().next() {
        Some(field) => Err(ApiError::invalid(format!("unknown field {field:?}"))),
        None => Ok(()),
    }
}
