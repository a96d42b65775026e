//! OpenAI's Responses API: `POST /v1/responses`, stateless, over the path
//! `/v1/chat/completions` takes: the body is read into that route's request ([`request`]:
//! the input items as chat messages, the tools and formats as a chat's), checked, tokenized
//! and queued by [`routes::start`], and the engine's events read by a chat's [`Reading`]
//! (reasoning, tool calls) into output items ([`answer`]). Nothing is stored: a request
//! carries its whole conversation. Errors come in OpenAI's envelope.

mod answer;
mod request;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::error::ApiError;
use crate::reply::Reading;
use crate::routes::{Started, State, Thinks, grammar_param, ready, start, thinking};
use answer::Answer;

pub(crate) fn routes() -> Router<State> {
    Router::new().route("/v1/responses", post(create))
}

async fn create(
    Extract(state): Extract<State>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match answer(&state, &headers, body).await {
        Ok(response) => response,
        Err(e) => named_for_responses(e).into_response(),
    }
}

async fn answer(
    state: &State,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let loaded = ready(state)?;
    let body = body.map_err(|e| ApiError::with_status(e.status(), e.body_text()))?;
    let thinks = Thinks::of(loaded.tokenizer.chat_template());
    let request::Parsed {
        request,
        echo,
        namespaces,
    } = request::parse(&body, thinks)?;
    // Echoed as OpenAI echoes it: the served model's name or the alias the request gave.
    let model = (request.model.clone()).unwrap_or_else(|| state.options.model.clone());
    let param = grammar_param(&request);
    let Started {
        request,
        mut events,
        tools,
        opens_thinking,
        ..
    } = start(state, headers, request).await?;
    let reading = Reading::new(thinking(state, opens_thinking), tools.as_ref());
    let answer = Answer::new(model, echo, reading, namespaces, param);
    // One prompt, one choice: one job.
    let events = events.pop().expect("a job");
    Ok(match request.stream {
        true => answer.stream(events).into_response(),
        false => answer.whole(events).await,
    })
}

/// An error of the chat path naming the conversation (`messages`) names `input`, the field
/// that holds it here.
fn named_for_responses(mut error: ApiError) -> ApiError {
    if error.param == Some("messages") {
        error.param = Some("input");
    }
    error
}
