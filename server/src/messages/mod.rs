//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, over
//! the path `/v1/chat/completions` takes: the body is read into that route's request
//! ([`request`]: the conversation as OpenAI-shaped messages), checked, tokenized and queued
//! by [`routes::start`], and the engine's events read by a chat's [`Reading`] (reasoning,
//! tool calls) into Anthropic's content blocks ([`answer`]). Errors come in Anthropic's
//! envelope ([`Protocol::Anthropic`]). The `anthropic-version` and `anthropic-beta` headers
//! are accepted whatever they say: nothing here depends on them.

mod answer;
mod request;

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

use crate::error::{ApiError, Protocol};
use crate::reply::Reading;
use crate::routes::{
    Started, State, Template, Tokenized, check_model, ready, start, thinking, thinks, tokenize,
    tool_format,
};
use answer::Answer;
use request::Purpose;

pub(crate) fn routes() -> Router<State> {
    Router::new()
        .route("/v1/messages", post(create))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

async fn create(
    Extract(state): Extract<State>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match answer(&state, &headers, body).await {
        Ok(response) => response,
        Err(e) => e.respond(Protocol::Anthropic),
    }
}

async fn answer(
    state: &State,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    ready(state)?;
    let body = body.map_err(|e| ApiError::with_status(e.status(), e.body_text()))?;
    let request = request::parse(&body, Purpose::Create, thinks(state))?;
    // Echoed as Anthropic echoes it: the served model's name or one of its aliases.
    let model = request.model.clone().unwrap_or_default();
    let max_tokens = request.max_tokens.unwrap_or_default();
    let Started {
        request,
        mut events,
        tools,
        opens_thinking,
        prompt_tokens,
    } = start(state, headers, request).await?;
    let reading = Reading::new(thinking(state, opens_thinking), tools.as_ref());
    let answer = Answer::new(model, reading, max_tokens, prompt_tokens);
    // One prompt, one choice: one job.
    let events = events.pop().expect("a job");
    Ok(match request.stream {
        true => answer.stream(events).into_response(),
        false => answer.whole(events).await,
    })
}

async fn count_tokens(
    Extract(state): Extract<State>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let counted = match body {
        Err(e) => Ok(Err(ApiError::with_status(e.status(), e.body_text()))),
        // Rendering a template and tokenizing are CPU work: off the async threads.
        Ok(body) => tokio::task::spawn_blocking(move || count(&state, &body)).await,
    };
    match counted {
        Ok(Ok(tokens)) => Json(json!({"input_tokens": tokens})).into_response(),
        Ok(Err(e)) => e.respond(Protocol::Anthropic),
        Err(e) => ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            .respond(Protocol::Anthropic),
    }
}

/// The tokens of the prompt `/v1/messages` would run for the same body (without its
/// `max_tokens`): refused where that request would be for its prompt, model or tools.
fn count(state: &State, body: &[u8]) -> Result<usize, ApiError> {
    let loaded = ready(state)?;
    let request = request::parse(body, Purpose::Count, thinks(state))?;
    check_model(state, request.model.as_deref())?;
    if request.tools.is_some() {
        tool_format(&loaded.tokenizer)?;
    }
    let template = Template {
        tools: request.tools.map(|tools| tools.offered),
        kwargs: request.template_kwargs,
    };
    let prompt = (request.prompts.into_iter().next()).expect("a chat prompt");
    let specials = state.options.content_specials;
    let Tokenized { ids, .. } = tokenize(&loaded.tokenizer, prompt, &template, specials)?;
    Ok(ids.len())
}
