//! The HTTP routes: OpenAI's chat and completions endpoints (plain and streamed), the model
//! list, health and metrics; errors in OpenAI's envelope for every failure, routing ones
//! included.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runtime::chat::ChatRequest;
use runtime::generate::{GenerateOptions, StopReason};
use runtime::tokenizer::{ContentSpecials, Tokenizer, TokenizerError};
use serde_json::{Value, json};
use tokio::sync::mpsc as async_mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

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
        // The key is checked first (the outer layer), then the body's type.
        .route_layer(middleware::from_fn(crate::guard::json_only))
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
        if !crate::guard::same_key(given, key) {
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
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(state, &headers, body, Kind::Chat).await
}

async fn completions(
    axum::extract::State(state): axum::extract::State<State>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    respond(state, &headers, body, Kind::Completion).await
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

async fn respond(
    state: State,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    match start(&state, headers, body, kind).await {
        Ok((request, events)) => {
            let reply = Reply::new(&state, kind, request.logprobs.is_some());
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

/// Checks and tokenizes the request and queues it for the engine: a job per prompt (a
/// completion may list several, one choice each), each with its own events. Every prompt is
/// checked before any is queued.
async fn start(
    state: &State,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<(Request, Vec<async_mpsc::UnboundedReceiver<Event>>), ApiError> {
    let loaded = ready(state)?;
    let body = body.map_err(|e| ApiError::with_status(e.status(), e.body_text()))?;
    let request = match kind {
        Kind::Chat => api::chat(&body)?,
        Kind::Completion => api::completion(&body)?,
    };
    check_model(state, &request)?;
    let tokenizer = loaded.tokenizer.clone();
    let prompts = request.prompts.clone();
    let specials = state.options.content_specials;
    // Rendering a template and tokenizing are CPU work: off the async threads.
    let prompts = tokio::task::spawn_blocking(move || {
        (prompts.into_iter())
            .map(|prompt| tokenize(&tokenizer, prompt, specials))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let scope = scope(headers, request.cache_salt.as_deref());
    let mut jobs = Vec::with_capacity(prompts.len());
    for (ids, prompt) in prompts.into_iter().zip(&request.prompts) {
        let options = generate_options(&request, prompt.param(), ids.len(), loaded.context)?;
        jobs.push((ids, options));
    }
    let mut receivers = Vec::with_capacity(jobs.len());
    for (ids, options) in jobs {
        let (events, receiver) = async_mpsc::unbounded_channel();
        state.metrics.queued.fetch_add(1, Ordering::Relaxed);
        let job = Job {
            prompt: ids,
            options,
            logprobs: request.logprobs,
            scope: scope.clone(),
            events,
        };
        if state.jobs.send(job).is_err() {
            state.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::with_status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            ));
        }
        receivers.push(receiver);
    }
    Ok((request, receivers))
}

/// A request naming a model must name the one served: an answer must not pass for another
/// model's. 404 `model_not_found`, as OpenAI and vLLM answer (llama-server ignores the
/// field). A request without `model` gets the served one.
fn check_model(state: &State, request: &Request) -> Result<(), ApiError> {
    match &request.model {
        Some(model) if *model != state.options.model => {
            Err(ApiError::model_not_found(model, &state.options.model))
        }
        _ => Ok(()),
    }
}

/// A prompt's token ids: a conversation through the chat template, text through the
/// tokenizer, token ids checked against the vocabulary.
fn tokenize(
    tokenizer: &Tokenizer,
    prompt: Prompt,
    specials: ContentSpecials,
) -> Result<Vec<u32>, ApiError> {
    let param = prompt.param();
    let invalid = |e: TokenizerError| ApiError::invalid_field(param, e.to_string());
    let ids = match prompt {
        Prompt::Chat(messages) => tokenizer
            .encode_messages(messages, &ChatRequest::render, specials)
            .map_err(invalid)?,
        Prompt::Text(text) => tokenizer.encode(&text).map_err(invalid)?,
        Prompt::Ids(ids) => {
            let max = tokenizer.max_id();
            if let Some(id) = ids.iter().find(|&&id| id > max) {
                return Err(ApiError::invalid_field(
                    param,
                    format!("token id {id} is not in the vocabulary (0 to {max})"),
                ));
            }
            ids
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid_field(param, "the prompt is empty"));
    }
    Ok(ids)
}

/// How to continue a prompt of `prompt_tokens` tokens: what is asked for must fit the
/// context with the prompt, or it is 400 `context_length_exceeded` naming the field to
/// shorten (OpenAI and vLLM refuse it too, rather than cut the answer short); without
/// `max_tokens`, the rest of the context.
fn generate_options(
    request: &Request,
    prompt_param: &'static str,
    prompt_tokens: usize,
    context: usize,
) -> Result<GenerateOptions, ApiError> {
    if prompt_tokens >= context {
        return Err(ApiError::context_length(
            prompt_param,
            format!(
                "the prompt has {prompt_tokens} tokens; the model's context holds {context} and needs room for at least one new token"
            ),
        ));
    }
    let room = context - prompt_tokens;
    let max_new_tokens = match request.max_tokens {
        None => room,
        Some(n) if n <= room => n,
        Some(n) => {
            return Err(ApiError::context_length(
                request.max_tokens_param,
                format!(
                    "{} is {n}, but the prompt has {prompt_tokens} tokens and the model's context holds {context}: at most {room} more fit",
                    request.max_tokens_param
                ),
            ));
        }
    };
    Ok(GenerateOptions {
        max_new_tokens,
        sampling: request.sampling.clone(),
        stop: request.stop.clone(),
    })
}

/// Who may share kept caches with this request (the engine reuses a cache only within a
/// scope): the credential it presented (its whole `Authorization` header, if any) and its
/// `cache_salt`, each length-prefixed (or `-` when absent) so that no two different pairs
/// give the same scope.
fn scope(headers: &HeaderMap, salt: Option<&str>) -> String {
    let part = |value: Option<String>| match value {
        None => "-".to_string(),
        Some(value) => format!("{}:{value}", value.len()),
    };
    // Escaped: a header need not be UTF-8, and lossy decoding would merge different ones.
    let key = (headers.get(header::AUTHORIZATION)).map(|v| v.as_bytes().escape_ascii().to_string());
    format!("{}{}", part(key), part(salt.map(str::to_string)))
}

/// Builds a response's JSON objects in OpenAI's shapes.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    /// The served model's name (a request naming another is refused).
    model: String,
    /// Whether the request asked for log-probabilities (else `logprobs` is null).
    logprobs: bool,
}

/// What one choice has sent so far, while streaming.
#[derive(Default)]
struct Streamed {
    started: bool,
    text: String,
    pending: Pending,
    offsets: Offsets,
}

impl Reply {
    fn new(state: &State, kind: Kind, logprobs: bool) -> Self {
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
            model: state.options.model.clone(),
            logprobs,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// Choice `index`: the whole text, or a streamed delta, with `logprobs` (the value of
    /// its `logprobs` field).
    fn choice(
        &self,
        index: usize,
        text: Option<&str>,
        first: bool,
        finish: Option<StopReason>,
        chunk: bool,
        logprobs: Value,
    ) -> Value {
        let finish_reason = finish.map(|reason| match reason {
            StopReason::Eos | StopReason::Stop => "stop",
            StopReason::Length => "length",
        });
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": index, "logprobs": logprobs, "finish_reason": finish_reason,
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
                json!({"index": index, "logprobs": logprobs, "finish_reason": finish_reason, "delta": delta})
            }
            (Kind::Completion, _) => json!({
                "index": index, "logprobs": logprobs, "finish_reason": finish_reason,
                "text": text.unwrap_or_default(),
            }),
        }
    }

    /// OpenAI's `logprobs` object: chat's `content` list (token, logprob, bytes,
    /// top_logprobs), or the completions API's parallel lists, whose `text_offset`s are
    /// `offsets`. Null if not asked for.
    fn logprobs_value(&self, logprobs: &[Logprob], offsets: &[usize]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entry = |l: &Logprob| json!({"token": l.token, "logprob": l.logprob, "bytes": l.bytes});
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = logprobs
                    .iter()
                    .map(|l| {
                        let mut value = entry(l);
                        value["top_logprobs"] = l.top.iter().map(entry).collect();
                        value
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Completion => json!({
                "tokens": logprobs.iter().map(|l| l.token.as_str()).collect::<Vec<_>>(),
                "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": logprobs.iter().map(|l| {
                    l.top.iter().map(|t| (t.token.clone(), json!(t.logprob))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            }),
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

    /// The whole answer as one JSON response: every choice, in order.
    async fn whole(self, events: Vec<async_mpsc::UnboundedReceiver<Event>>) -> Response {
        let mut choices = Vec::with_capacity(events.len());
        let mut usage = Usage::default();
        for (index, mut events) in events.into_iter().enumerate() {
            let mut text = String::new();
            let mut logprobs = Vec::new();
            let reason = loop {
                match events.recv().await {
                    Some(Event::Text(piece)) => text.push_str(&piece),
                    Some(Event::Logprobs(more)) => logprobs.extend(more),
                    Some(Event::Done {
                        reason,
                        prompt_tokens,
                        cached_tokens,
                        completion_tokens,
                    }) => {
                        usage.add(prompt_tokens, cached_tokens, completion_tokens);
                        break reason;
                    }
                    Some(Event::Failed(message)) => return failed(message).into_response(),
                    None => return failed("the engine stopped".into()).into_response(),
                }
            };
            let offsets = Offsets::default().next(&text, &logprobs);
            let logprobs = self.logprobs_value(&logprobs, &offsets);
            choices.push(self.choice(index, Some(&text), false, Some(reason), false, logprobs));
        }
        Json(self.envelope(choices, Some(usage.value()), false)).into_response()
    }

    /// Server-sent events: a chunk per piece of a choice's text, with the log-probabilities
    /// of the tokens it completes; one per choice with its finish reason (and the
    /// log-probabilities of tokens whose text never came: a stop string's); usage if asked
    /// for, then `[DONE]`. A failure after the stream began is an `error` chunk.
    fn stream(
        self,
        events: Vec<async_mpsc::UnboundedReceiver<Event>>,
        include_usage: bool,
    ) -> Sse<UnboundedReceiverStream<Result<SseEvent, Infallible>>> {
        let (out, stream) = async_mpsc::unbounded_channel();
        tokio::spawn(async move {
            let send = |value: Value| out.send(Ok(SseEvent::default().data(value.to_string())));
            let mut choices: Vec<Streamed> = events.iter().map(|_| Streamed::default()).collect();
            let mut events: StreamMap<usize, UnboundedReceiverStream<Event>> =
                (events.into_iter().map(UnboundedReceiverStream::new))
                    .enumerate()
                    .collect();
            let mut usage = Usage::default();
            let mut running = choices.len();
            while let Some((index, event)) = events.next().await {
                let choice = &mut choices[index];
                let value = match event {
                    Event::Logprobs(logprobs) => {
                        choice.pending.push(logprobs);
                        continue;
                    }
                    Event::Text(piece) => {
                        choice.text.push_str(&piece);
                        let logprobs = choice.pending.release(&piece);
                        self.chunk(index, choice, Some(&piece), None, &logprobs)
                    }
                    Event::Done {
                        reason,
                        prompt_tokens,
                        cached_tokens,
                        completion_tokens,
                    } => {
                        usage.add(prompt_tokens, cached_tokens, completion_tokens);
                        running -= 1;
                        let logprobs = choice.pending.rest();
                        self.chunk(index, choice, None, Some(reason), &logprobs)
                    }
                    Event::Failed(message) => {
                        let _ = send(failed(message).body());
                        return;
                    }
                };
                if send(self.envelope(vec![value], None, true)).is_err() {
                    // The client is gone: dropping `events` cancels the request.
                    return;
                }
                if running == 0 {
                    break;
                }
            }
            if running > 0 {
                let _ = send(failed("the engine stopped".into()).body());
                return;
            }
            if include_usage {
                let _ = send(self.envelope(vec![], Some(usage.value()), true));
            }
            let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
        });
        Sse::new(UnboundedReceiverStream::new(stream))
    }

    /// A streamed chunk's choice: `text` and the `logprobs` of the tokens it completes.
    fn chunk(
        &self,
        index: usize,
        choice: &mut Streamed,
        text: Option<&str>,
        finish: Option<StopReason>,
        logprobs: &[Logprob],
    ) -> Value {
        let offsets = choice.offsets.next(&choice.text, logprobs);
        let first = !std::mem::replace(&mut choice.started, true);
        // A chunk carrying no token says so with null, as OpenAI's last chunk does.
        let logprobs = match logprobs {
            [] => Value::Null,
            _ => self.logprobs_value(logprobs, &offsets),
        };
        self.choice(index, text, first, finish, true, logprobs)
    }
}

/// Pairs each token's log-probability with the text that carries it. The engine reports a
/// token when it is generated, but its text may come later (a character split over tokens
/// is released once whole, a possible start of a stop string once it is known not to be
/// one) or never (a stop string's own tokens). A token goes with the piece of text that
/// completes its bytes; the rest go with the choice's last chunk.
#[derive(Default)]
struct Pending {
    logprobs: VecDeque<Logprob>,
    /// Bytes of text released and not yet matched to a token.
    released: usize,
}

impl Pending {
    fn push(&mut self, logprobs: Vec<Logprob>) {
        self.logprobs.extend(logprobs);
    }

    /// The tokens whose bytes `text`, the next piece of text, completes.
    fn release(&mut self, text: &str) -> Vec<Logprob> {
        self.released += text.len();
        let mut done = Vec::new();
        while let Some(next) = self.logprobs.front()
            && next.bytes.len() <= self.released
        {
            self.released -= next.bytes.len();
            done.extend(self.logprobs.pop_front());
        }
        done
    }

    /// Every token not yet released.
    fn rest(&mut self) -> Vec<Logprob> {
        self.released = 0;
        self.logprobs.drain(..).collect()
    }
}

/// The completions API's `text_offset`: where each token begins in its choice's text, in
/// characters (as Python, OpenAI's main client, indexes a string), counted from the bytes of
/// the tokens before it. A token that begins inside a character points at that character;
/// one whose text was cut (a stop string) at the text's end.
#[derive(Default)]
struct Offsets {
    /// Bytes of the tokens so far.
    tokens: usize,
    /// The first `counted` bytes of the text hold `chars` whole characters.
    counted: usize,
    chars: usize,
}

impl Offsets {
    /// The offsets of the next `logprobs` in `text` (the choice's text so far).
    fn next(&mut self, text: &str, logprobs: &[Logprob]) -> Vec<usize> {
        logprobs
            .iter()
            .map(|l| {
                for c in text.get(self.counted..).unwrap_or_default().chars() {
                    if self.counted + c.len_utf8() > self.tokens {
                        break;
                    }
                    self.counted += c.len_utf8();
                    self.chars += 1;
                }
                self.tokens += l.bytes.len();
                self.chars
            })
            .collect()
    }
}

/// OpenAI's usage object, summed over a request's choices; `cached_tokens` are the prompt
/// tokens taken from a kept cache.
#[derive(Default)]
struct Usage {
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
}

impl Usage {
    fn add(&mut self, prompt_tokens: usize, cached_tokens: usize, completion_tokens: usize) {
        self.prompt_tokens += prompt_tokens;
        self.cached_tokens += cached_tokens;
        self.completion_tokens += completion_tokens;
    }

    fn value(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

fn failed(message: String) -> ApiError {
    ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message)
}

#[cfg(test)]
mod reply_tests {
    use super::*;

    fn token(text: &str, bytes: &[u8]) -> Logprob {
        Logprob {
            token: text.into(),
            bytes: bytes.to_vec(),
            logprob: -1.0,
            top: Vec::new(),
        }
    }

    /// "日" is E6 97 A5: split over two tokens, it is released whole with the second.
    fn split_character() -> [Logprob; 3] {
        [
            token("a", b"a"),
            token("\u{FFFD}", &[0xE6, 0x97]),
            token("\u{FFFD}b", &[0xA5, b'b']),
        ]
    }

    #[test]
    fn a_token_travels_with_the_text_that_completes_it() {
        let mut pending = Pending::default();
        let [a, head, tail] = split_character();
        pending.push(vec![a.clone()]);
        assert_eq!(pending.release("a"), [a]);
        pending.push(vec![head.clone()]);
        pending.push(vec![tail.clone()]);
        assert_eq!(pending.release("日b"), [head, tail]);
        // A held-back " (" whose space alone is released stays until its text comes, or
        // goes with the last chunk if it never does (a stop string cut it).
        pending.push(vec![token(" (", b" (")]);
        assert!(pending.release(" ").is_empty());
        assert_eq!(pending.rest(), [token(" (", b" (")]);
        assert!(pending.rest().is_empty());
    }

    #[test]
    fn text_offsets_count_characters_from_the_tokens_bytes() {
        let tokens = split_character();
        assert_eq!(Offsets::default().next("a日b", &tokens), [0, 1, 1]);
        // Streamed in two pieces: the same offsets.
        let mut offsets = Offsets::default();
        assert_eq!(offsets.next("a", &tokens[..1]), [0]);
        assert_eq!(offsets.next("a日b", &tokens[1..]), [1, 1]);
        // Tokens past the text (cut by a stop string) point at its end.
        let cut = [token("x", b"x"), token("yz", b"yz"), token("w", b"w")];
        assert_eq!(Offsets::default().next("x", &cut), [0, 1, 1]);
    }

    #[test]
    fn scopes_tell_every_key_and_salt_apart() {
        let headers = |key: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(key) = key {
                headers.insert(header::AUTHORIZATION, key.parse().unwrap());
            }
            headers
        };
        let cases = [
            (None, None),
            (None, Some("")),
            (Some(""), None),
            (Some("Bearer a"), None),
            (Some("Bearer a"), Some("b")),
            (Some("Bearer a1:"), Some("b")),
            (Some("Bearer a"), Some("1:b")),
            (None, Some("Bearer a")),
        ];
        let scopes: Vec<String> = (cases.iter())
            .map(|&(key, salt)| scope(&headers(key), salt))
            .collect();
        for (i, a) in scopes.iter().enumerate() {
            for b in &scopes[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(scope(&headers(Some("Bearer a")), Some("b")), scopes[4]);
    }
}
