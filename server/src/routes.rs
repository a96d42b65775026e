//! The HTTP routes: OpenAI's chat and completions endpoints (plain and streamed), the model
//! list, health and metrics; errors in OpenAI's envelope for every failure, routing ones
//! included.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runtime::generate::{GenerateOptions, StopReason};
use serde_json::{Value, json};
use tokio::sync::mpsc as async_mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{self, Prompt, Request};
use crate::engine::{Event, Job, Logprob, Metrics};
use crate::error::ApiError;
use crate::{Loaded, Options};

#[derive(Clone)]
pub(crate) struct State {
    pub jobs: mpsc::Sender<Job>,
    pub metrics: Arc<Metrics>,
    pub loaded: Arc<OnceLock<Loaded>>,
    pub options: Arc<Options>,
    pub next_id: Arc<AtomicU64>,
}

pub(crate) fn router(state: State) -> axum::Router {
    let api = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    axum::Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::with_status(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::with_status(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here")
        })
        .layer(DefaultBodyLimit::max(state.options.body_limit))
        .with_state(state)
}

/// 401 unless the request carries the configured key.
async fn authorize(
    axum::extract::State(state): axum::extract::State<State>,
    request: HttpRequest,
    next: Next,
) -> Response {
    if let Some(key) = &state.options.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::with_status(StatusCode::UNAUTHORIZED, "invalid or missing API key")
                .into_response();
        }
    }
    next.run(request).await
}

async fn health(axum::extract::State(state): axum::extract::State<State>) -> Response {
    match ready(&state) {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn models(axum::extract::State(state): axum::extract::State<State>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{"id": state.options.model, "object": "model", "created": 0, "owned_by": "runtime"}],
    }))
    .into_response()
}

/// Prometheus' text format.
async fn metrics(axum::extract::State(state): axum::extract::State<State>) -> Response {
    let m = &state.metrics;
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let busy_s = load(&m.busy_ns) as f64 / 1e9;
    let completion = load(&m.completion_tokens);
    let tokens_per_s = if busy_s > 0.0 {
        completion as f64 / busy_s
    } else {
        0.0
    };
    let body = format!(
        "# TYPE runtime_prompt_tokens_total counter\nruntime_prompt_tokens_total {}\n\
         # TYPE runtime_completion_tokens_total counter\nruntime_completion_tokens_total {completion}\n\
         # TYPE runtime_requests_total counter\nruntime_requests_total {}\n\
         # TYPE runtime_requests_running gauge\nruntime_requests_running {}\n\
         # TYPE runtime_requests_queued gauge\nruntime_requests_queued {}\n\
         # TYPE runtime_completion_tokens_per_second gauge\nruntime_completion_tokens_per_second {tokens_per_s:.3}\n",
        load(&m.prompt_tokens),
        load(&m.requests),
        m.running.load(Ordering::Relaxed),
        m.queued.load(Ordering::Relaxed),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn chat(
    axum::extract::State(state): axum::extract::State<State>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(state, body, Kind::Chat).await
}

async fn completions(
    axum::extract::State(state): axum::extract::State<State>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(state, body, Kind::Completion).await
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

async fn respond(state: State, body: Result<Bytes, BytesRejection>, kind: Kind) -> Response {
    match start(&state, body, kind).await {
        Ok((request, events)) => {
            let reply = Reply::new(&state, kind, request.model.clone());
            let reply = Reply {
                logprobs: request.logprobs.is_some(),
                ..reply
            };
            if request.stream {
                reply.stream(events, request.include_usage).into_response()
            } else {
                reply.whole(events).await
            }
        }
        Err(e) => e.into_response(),
    }
}

fn ready(state: &State) -> Result<&Loaded, ApiError> {
    state.loaded.get().ok_or_else(|| {
        ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
    })
}

/// Checks and tokenizes the request and queues it for the engine.
async fn start(
    state: &State,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<(Request, async_mpsc::UnboundedReceiver<Event>), ApiError> {
    let loaded = ready(state)?;
    let body = body.map_err(|e| ApiError::with_status(e.status(), e.body_text()))?;
    let request = match kind {
        Kind::Chat => api::chat(&body)?,
        Kind::Completion => api::completion(&body)?,
    };
    let tokenizer = loaded.tokenizer.clone();
    let prompt = request.prompt.clone();
    // Rendering a template and tokenizing are CPU work: off the async threads.
    let ids = tokio::task::spawn_blocking(move || match prompt {
        Prompt::Chat(messages) => {
            let rendered = tokenizer
                .chat_messages(messages)
                .map_err(|e| e.to_string())?
                .render()
                .map_err(|e| e.to_string())?;
            tokenizer
                .encode_rendered(&rendered)
                .map_err(|e| e.to_string())
        }
        Prompt::Text(text) => tokenizer.encode(&text).map_err(|e| e.to_string()),
    })
    .await
    .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(ApiError::invalid)?;
    if ids.is_empty() {
        return Err(ApiError::invalid_field("prompt", "the prompt is empty"));
    }
    if ids.len() >= loaded.context {
        return Err(ApiError::invalid(format!(
            "the prompt has {} tokens; the model's context holds {} and needs room for at least one new token",
            ids.len(),
            loaded.context
        )));
    }
    let room = loaded.context - ids.len();
    let options = GenerateOptions {
        max_new_tokens: request.max_tokens.unwrap_or(room).min(room),
        sampling: request.sampling.clone(),
        stop: request.stop.clone(),
    };
    let (events, receiver) = async_mpsc::unbounded_channel();
    state.metrics.queued.fetch_add(1, Ordering::Relaxed);
    let job = Job {
        prompt: ids,
        options,
        logprobs: request.logprobs,
        events,
    };
    if state.jobs.send(job).is_err() {
        state.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        ));
    }
    Ok((request, receiver))
}

/// Builds a response's JSON objects in OpenAI's shapes.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    /// Whether the request asked for log-probabilities (else `logprobs` is null).
    logprobs: bool,
}

impl Reply {
    fn new(state: &State, kind: Kind, model: Option<String>) -> Self {
        let n = state.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        Self {
            kind,
            id: format!("{prefix}-{n}"),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.unwrap_or_else(|| state.options.model.clone()),
            logprobs: false,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// One choice: the whole text, or a streamed delta, with the log-probabilities of its
    /// tokens if the request asked for them.
    fn choice(
        &self,
        text: Option<&str>,
        first: bool,
        finish: Option<StopReason>,
        chunk: bool,
        logprobs: &[Logprob],
    ) -> Value {
        let finish_reason = finish.map(|reason| match reason {
            StopReason::Eos | StopReason::Stop => "stop",
            StopReason::Length => "length",
        });
        let logprobs = self.logprobs_value(logprobs);
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": 0, "logprobs": logprobs, "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": text.unwrap_or_default()},
            }),
            (Kind::Chat, true) => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(text) = text {
                    delta.insert("content".into(), text.into());
                }
                json!({"index": 0, "logprobs": logprobs, "finish_reason": finish_reason, "delta": delta})
            }
            (Kind::Completion, _) => json!({
                "index": 0, "logprobs": logprobs, "finish_reason": finish_reason,
                "text": text.unwrap_or_default(),
            }),
        }
    }

    /// OpenAI's `logprobs` object: chat's `content` list (token, logprob, bytes,
    /// top_logprobs), or the completions API's parallel lists. Null if not asked for.
    fn logprobs_value(&self, logprobs: &[Logprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = logprobs
                    .iter()
                    .map(|l| {
                        let mut value = entry(&l.token, l.logprob);
                        let top: Vec<Value> = l.top.iter().map(|(t, lp)| entry(t, *lp)).collect();
                        value["top_logprobs"] = top.into();
                        value
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Completion => {
                let mut offset = 0;
                let mut offsets = Vec::new();
                for l in logprobs {
                    offsets.push(offset);
                    offset += l.token.len();
                }
                json!({
                    "tokens": logprobs.iter().map(|l| l.token.as_str()).collect::<Vec<_>>(),
                    "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                    "top_logprobs": logprobs.iter().map(|l| {
                        l.top.iter().map(|(t, lp)| (t.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    fn envelope(&self, choices: Vec<Value>, usage: Option<Value>, chunk: bool) -> Value {
        let mut body = json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(usage) = usage {
            body["usage"] = usage;
        }
        body
    }

    /// The whole answer as one JSON response.
    async fn whole(self, mut events: async_mpsc::UnboundedReceiver<Event>) -> Response {
        let mut text = String::new();
        let mut logprobs = Vec::new();
        while let Some(event) = events.recv().await {
            match event {
                Event::Text(piece) => text.push_str(&piece),
                Event::Logprobs(more) => logprobs.extend(more),
                Event::Done {
                    reason,
                    prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                } => {
                    let choice = self.choice(Some(&text), false, Some(reason), false, &logprobs);
                    let usage = usage(prompt_tokens, cached_tokens, completion_tokens);
                    return Json(self.envelope(vec![choice], Some(usage), false)).into_response();
                }
                Event::Failed(message) => return failed(message).into_response(),
            }
        }
        failed("the engine stopped".into()).into_response()
    }

    /// Server-sent events: a chunk per piece of text, one with the finish reason, usage if
    /// asked for, then `[DONE]`. A failure after the stream began is an `error` chunk.
    fn stream(
        self,
        mut events: async_mpsc::UnboundedReceiver<Event>,
        include_usage: bool,
    ) -> Sse<UnboundedReceiverStream<Result<SseEvent, Infallible>>> {
        let (out, stream) = async_mpsc::unbounded_channel();
        tokio::spawn(async move {
            let send = |value: Value| out.send(Ok(SseEvent::default().data(value.to_string())));
            let mut first = true;
            while let Some(event) = events.recv().await {
                let sent = match event {
                    Event::Text(piece) => {
                        let choice = self.choice(Some(&piece), first, None, true, &[]);
                        first = false;
                        send(self.envelope(vec![choice], None, true))
                    }
                    Event::Logprobs(logprobs) => {
                        // A chunk of its own: its tokens' text may come later (a stop
                        // string's possible start is held back) or never.
                        let choice = self.choice(None, first, None, true, &logprobs);
                        first = false;
                        send(self.envelope(vec![choice], None, true))
                    }
                    Event::Done {
                        reason,
                        prompt_tokens,
                        cached_tokens,
                        completion_tokens,
                    } => {
                        let choice = self.choice(None, first, Some(reason), true, &[]);
                        let _ = send(self.envelope(vec![choice], None, true));
                        if include_usage {
                            let usage = usage(prompt_tokens, cached_tokens, completion_tokens);
                            let _ = send(self.envelope(vec![], Some(usage), true));
                        }
                        let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
                        break;
                    }
                    Event::Failed(message) => {
                        let _ = send(failed(message).body());
                        break;
                    }
                };
                if sent.is_err() {
                    // The client is gone: dropping `events` cancels the request.
                    break;
                }
            }
        });
        Sse::new(UnboundedReceiverStream::new(stream))
    }
}

/// OpenAI's usage object; `cached_tokens` are the prompt tokens taken from a kept cache.
fn usage(prompt_tokens: usize, cached_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    })
}

fn failed(message: String) -> ApiError {
    ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message)
}
