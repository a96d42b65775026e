//! The HTTP routes: OpenAI's chat and completions endpoints (a request checked, tokenized
//! and queued for the engine by [`start`], which Anthropic's Messages API
//! ([`crate::messages`]) and OpenAI's Responses API ([`crate::responses`]) share; the answer
//! built by [`crate::reply`]), the model list, health and metrics; errors in OpenAI's
//! envelope for every failure, routing ones included, except on Anthropic's paths
//! ([`Protocol::of`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runtime::generate::GenerateOptions;
use runtime::text::chat::ChatRequest;
use runtime::text::grammar::{Constraint, Grammar, GrammarError, Grammars};
use runtime::text::reasoning;
use runtime::text::tokenizer::{ContentSpecials, Tokenizer, TokenizerError};
use runtime::text::tools::Format;
use serde_json::json;
use tokio::sync::mpsc as async_mpsc;

use crate::api::{self, Prompt, Request, ToolChoice};
use crate::engine::{Event, Fork, Job, Metrics, Work};
use crate::error::{ApiError, Protocol};
use crate::reply::{Kind, Reply, Thinking, ToolReading};
use crate::{Loaded, Options};

#[derive(Clone)]
pub(crate) struct State {
    pub jobs: mpsc::Sender<Work>,
    pub metrics: Arc<Metrics>,
    pub loaded: Arc<OnceLock<Loaded>>,
    pub options: Arc<Options>,
    pub next_id: Arc<AtomicU64>,
}

/// The server's routes: the chat and completion API here, `more_api` beside it under the
/// same API checks (the tokenizer's routes, Anthropic's Messages API, OpenAI's Responses
/// API), the chat page, health and metrics.
pub(crate) fn router(state: State, more_api: axum::Router<State>) -> axum::Router {
    let api = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .merge(more_api)
        // The API key was checked before the body was read (`guard`).
        .route_layer(middleware::from_fn(crate::guard::json_only));
    let mut router = axum::Router::new().merge(api);
    if state.options.webui {
        router = router.merge(crate::webui::routes());
    }
    router
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            count_response,
        ))
        .fallback(|uri: Uri| async move {
            let error = ApiError::with_status(StatusCode::NOT_FOUND, "no such route");
            error.respond(Protocol::of(uri.path()))
        })
        .method_not_allowed_fallback(|uri: Uri| async move {
            let error =
                ApiError::with_status(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here");
            error.respond(Protocol::of(uri.path()))
        })
        .layer(DefaultBodyLimit::max(state.options.body_limit))
        .with_state(state)
}

async fn health(axum::extract::State(state): axum::extract::State<State>) -> Response {
    match ready(&state) {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn models(axum::extract::State(state): axum::extract::State<State>) -> Response {
    let card = |name: &String| {
        let mut card = json!({"id": name, "object": "model", "created": 0, "owned_by": "runtime"});
        // How /v1/embeddings pools, once the model is known.
        if let Some(loaded) = state.loaded.get() {
            let pooling = &loaded.pooling;
            card["pooling"] = pooling.pooling.name().into();
            card["normalize"] = pooling.normalize.into();
            card["embedding_dimensions"] = loaded.hidden_size.into();
            if !pooling.matryoshka_dimensions.is_empty() {
                card["matryoshka_dimensions"] = pooling.matryoshka_dimensions.clone().into();
            }
            card["task"] = if loaded.embedding_model {
                "embed"
            } else {
                "generate"
            }
            .into();
        }
        card
    };
    Json(json!({
        "object": "list",
        "data": served_names(&state).map(card).collect::<Vec<_>>(),
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
         # TYPE runtime_requests_cancelled_total counter\nruntime_requests_cancelled_total {}\n\
         # TYPE runtime_requests_running gauge\nruntime_requests_running {}\n\
         # TYPE runtime_requests_queued gauge\nruntime_requests_queued {}\n\
         # TYPE runtime_completion_tokens_per_second gauge\nruntime_completion_tokens_per_second {tokens_per_s:.3}\n\
         # TYPE runtime_draft_tokens_total counter\nruntime_draft_tokens_total {}\n\
         # TYPE runtime_draft_tokens_accepted_total counter\nruntime_draft_tokens_accepted_total {}\n",
        load(&m.prompt_tokens),
        load(&m.requests),
        load(&m.cancelled),
        m.running.load(Ordering::Relaxed),
        m.queued.load(Ordering::Relaxed),
        load(&m.draft_tokens),
        load(&m.draft_tokens_accepted),
    );
    let mut body = body;
    body.push_str("# TYPE runtime_http_responses_total counter\n");
    let responses = m.responses.lock().unwrap_or_else(|e| e.into_inner());
    for ((route, status), count) in responses.iter() {
        body.push_str(&format!(
            "runtime_http_responses_total{{route=\"{route}\",status=\"{status}\"}} {count}\n"
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// Counts each routed response by its route and status (`runtime_http_responses_total`).
async fn count_response(
    axum::extract::State(state): axum::extract::State<State>,
    route: MatchedPath,
    request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let response = next.run(request).await;
    let key = (route.as_str().to_string(), response.status().as_u16());
    let mut responses = (state.metrics.responses.lock()).unwrap_or_else(|e| e.into_inner());
    *responses.entry(key).or_default() += 1;
    response
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

async fn respond(
    state: State,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Response {
    let started = match parse(&state, body, kind) {
        Ok(request) => start(&state, headers, request).await,
        Err(e) => Err(e),
    };
    match started {
        Ok(Started {
            request,
            events,
            tools,
            opens_thinking,
            ..
        }) => {
            let n = state.next_id.fetch_add(1, Ordering::Relaxed);
            let model = state.options.model.clone();
            let mut reply = Reply::new(kind, n, model, request.logprobs.is_some());
            reply.grammar_param = grammar_param(&request);
            reply.tools = tools;
            reply.thinking = thinking(&state, opens_thinking);
            if request.stream {
                reply.stream(events, request.include_usage).into_response()
            } else {
                reply.whole(events).await
            }
        }
        Err(e) => e.into_response(),
    }
}

/// The body of `kind`'s endpoint, read once the model is loaded.
fn parse(
    state: &State,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<Request, ApiError> {
    ready(state)?;
    let body = body.map_err(|e| ApiError::with_status(e.status(), e.body_text()))?;
    match kind {
        Kind::Chat => api::chat(&body),
        Kind::Completion => api::completion(&body),
    }
}

/// What becomes of an answer's `<think>` section: split off when the model thinks, unless
/// `--keep-thinking`; all of it reasoning when the prompt opened it.
pub(crate) fn thinking(state: &State, opens_thinking: bool) -> Thinking {
    match () {
        _ if state.options.keep_thinking || !thinks(state) => Thinking::Kept,
        _ if opens_thinking => Thinking::Opened,
        _ => Thinking::Split,
    }
}

/// What the chat template does with reasoning (`<think>` sections).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Thinks {
    /// It has none: the model does not reason.
    Never,
    /// It has them but no switch (DeepSeek-R1's opens one in every prompt).
    Always,
    /// `enable_thinking` turns them on or off (Qwen3's, SmolLM3's).
    Switch,
}

impl Thinks {
    /// What `template` does with reasoning.
    pub fn of(template: Option<&str>) -> Self {
        match template {
            Some(t) if t.contains("<think>") && t.contains("enable_thinking") => Thinks::Switch,
            Some(t) if t.contains("<think>") => Thinks::Always,
            _ => Thinks::Never,
        }
    }
}

/// Whether the loaded model's chat template knows `<think>` sections.
pub(crate) fn thinks(state: &State) -> bool {
    let template = (state.loaded.get()).and_then(|loaded| loaded.tokenizer.chat_template());
    Thinks::of(template) != Thinks::Never
}

pub(crate) fn ready(state: &State) -> Result<&Loaded, ApiError> {
    state.loaded.get().ok_or_else(|| {
        ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
    })
}

/// A request queued for the engine.
pub(crate) struct Started {
    pub request: Request,
    /// Each job's events, in the order of the choices.
    pub events: Vec<async_mpsc::UnboundedReceiver<Event>>,
    pub tools: Option<ToolReading>,
    /// Whether the rendered chat prompt ends inside a `<think>` section it opened.
    pub opens_thinking: bool,
    /// The prompts' tokens, all together.
    pub prompt_tokens: usize,
}

/// Checks and tokenizes a parsed request and queues it for the engine: a job per prompt (a
/// completion may list several, one choice each), each with its own events. Every prompt is
/// checked before any is queued.
pub(crate) async fn start(
    state: &State,
    headers: &HeaderMap,
    mut request: Request,
) -> Result<Started, ApiError> {
    let loaded = ready(state)?;
    check_model(state, request.model.as_deref())?;
    if loaded.embedding_model {
        return Err(ApiError::invalid_field(
            "model",
            format!(
                "{} is an embedding model (no lm_head): it generates no text; embed with POST /v1/embeddings",
                state.options.model
            ),
        ));
    }
    if request.n > state.options.parallel {
        return Err(ApiError::invalid_field(
            "n",
            format!(
                "n is {}, more choices than this server decodes at once (--parallel {})",
                request.n, state.options.parallel
            ),
        ));
    }
    // A full queue refuses at once, before the work of tokenizing.
    QueuePlaces::check(&state.metrics, state.options.max_queue)?;
    let biased = request.sampling.logit_bias.iter().map(|&(id, _)| id);
    in_vocabulary(&loaded.tokenizer, "logit_bias", biased)?;
    let format = match &request.tools {
        None => None,
        Some(_) => Some(tool_format(&loaded.tokenizer)?),
    };
    let calls_banned = (request.tools.as_ref()).is_some_and(|t| t.choice == ToolChoice::None);
    if let Some(format) = format.filter(|_| calls_banned) {
        ban_calls(&mut request.sampling.logit_bias, &loaded.tokenizer, format);
    }
    let reading = (request.tools.as_ref().zip(format))
        .filter(|(tools, _)| tools.choice != ToolChoice::None)
        .map(|(tools, format)| ToolReading {
            format,
            names: tools.functions.iter().map(|f| f.name.clone()).collect(),
            parallel: tools.parallel,
        });
    let grammar = match (&request.grammar, &request.tools, format) {
        (Some(grammar), _, _) => Some(grammar.clone()),
        (None, Some(tools), Some(format)) => tools.grammar(format),
        _ => None,
    };
    let tokenizer = loaded.tokenizer.clone();
    let prompts = request.prompts.clone();
    let specials = state.options.content_specials;
    let template = Template {
        tools: request.tools.as_ref().map(|t| t.offered.clone()),
        kwargs: request.template_kwargs.clone(),
    };
    let param = grammar_param(&request);
    // Rendering a template, tokenizing and compiling a grammar are CPU work: off the async
    // threads, and off the engine's.
    let blocking = state.clone();
    let (prompts, constraints) = tokio::task::spawn_blocking(move || {
        let prompts = (prompts.into_iter())
            .map(|prompt| tokenize(&tokenizer, prompt, &template, specials))
            .collect::<Result<Vec<_>, _>>()?;
        let constraints = match grammar {
            None => Vec::new(),
            Some(grammar) => constraints(&blocking, &grammar, param, prompts.len())?,
        };
        Ok::<_, ApiError>((prompts, constraints))
    })
    .await
    .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let mut constraints = constraints.into_iter();
    let scope = scope(headers, request.cache_salt.as_deref());
    let opens_thinking = prompts.iter().any(|prompt| prompt.opens_thinking);
    let prompt_tokens = prompts.iter().map(|prompt| prompt.ids.len()).sum();
    let mut jobs = Vec::with_capacity(prompts.len());
    for (Tokenized { ids, .. }, prompt) in prompts.into_iter().zip(&request.prompts) {
        let options = generate_options(&request, prompt.param(), ids.len(), loaded.context)?;
        jobs.push((ids, options));
    }
    let mut places = QueuePlaces::take(&state.metrics, jobs.len(), state.options.max_queue)?;
    let mut receivers = Vec::with_capacity(jobs.len());
    for (ids, options) in jobs {
        let (events, receiver) = async_mpsc::unbounded_channel();
        receivers.push(receiver);
        // Choice j of the prompt draws with the request's seed plus j (as vLLM seeds them).
        let seed = options.sampling.seed;
        let forks = (1..request.n as u64)
            .map(|j| {
                let (events, receiver) = async_mpsc::unbounded_channel();
                receivers.push(receiver);
                Fork {
                    seed: seed.wrapping_add(j),
                    events,
                }
            })
            .collect();
        let job = Job {
            prompt: ids,
            options,
            logprobs: request.logprobs,
            draft_limit: request.draft_limit,
            scope: scope.clone(),
            events,
            constraint: constraints.next(),
            forks,
        };
        if state.jobs.send(Work::Generate(Box::new(job))).is_err() {
            return Err(ApiError::with_status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
            ));
        }
        places.hand_over();
    }
    Ok(Started {
        request,
        events: receivers,
        tools: reading,
        opens_thinking,
        prompt_tokens,
    })
}

/// Places a request's jobs take in the queue (`Metrics::queued`) as they are sent to the
/// engine, which counts each out as it admits or drops it; those not handed over with a job
/// (the engine has stopped) are given back when dropped.
pub(crate) struct QueuePlaces<'m> {
    metrics: &'m Metrics,
    held: usize,
}

impl<'m> QueuePlaces<'m> {
    /// 429 with `Retry-After` ([`ApiError::queue_full`]) if `max_queue` or more jobs wait.
    /// A request is refused only when the queue is full, never for its own size (a list of
    /// prompts is a job each): one always fits an empty queue.
    pub fn check(metrics: &Metrics, max_queue: usize) -> Result<(), ApiError> {
        if metrics.queued.load(Ordering::Relaxed) >= max_queue {
            return Err(ApiError::queue_full(max_queue));
        }
        Ok(())
    }

    /// `jobs` places, as [`QueuePlaces::check`] allows: checked and counted at once, so
    /// that requests arriving together cannot all pass the check.
    pub fn take(metrics: &'m Metrics, jobs: usize, max_queue: usize) -> Result<Self, ApiError> {
        (metrics.queued)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| {
                (queued < max_queue).then_some(queued + jobs)
            })
            .map_err(|_| ApiError::queue_full(max_queue))?;
        Ok(Self {
            metrics,
            held: jobs,
        })
    }

    /// One place goes to the engine with its job.
    pub fn hand_over(&mut self) {
        self.held -= 1;
    }
}

impl Drop for QueuePlaces<'_> {
    fn drop(&mut self) {
        (self.metrics.queued).fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// The tool-call format of the model's chat template: 400 naming `tools` for a template
/// that teaches none this server can read (tools are never dropped silently).
pub(crate) fn tool_format(tokenizer: &Tokenizer) -> Result<Format, ApiError> {
    tokenizer.chat_template().and_then(Format::of_template).ok_or_else(|| {
        ApiError::invalid_field(
            "tools",
            "this model's chat template has no tool-call format this server knows (Hermes/Qwen2.5 <tool_call> blocks or Llama 3.x JSON); serve it with --chat-template FILE naming one that has",
        )
    })
}

/// For `tool_choice: "none"`: bans the token that starts a call in `format`, where the
/// vocabulary has one, with a bias of -100 (OpenAI's ban) in `biases` (in id order).
fn ban_calls(biases: &mut Vec<(u32, f32)>, tokenizer: &Tokenizer, format: Format) {
    if let Some(id) = tokenizer.token_id(format.start()) {
        biases.retain(|&(biased, _)| biased != id);
        let at = biases.partition_point(|&(biased, _)| biased < id);
        biases.insert(at, (id, -100.0));
    }
}

/// The request field whose grammar a request follows, for errors.
pub(crate) fn grammar_param(request: &Request) -> &'static str {
    match (&request.grammar, &request.tools) {
        (None, Some(tools)) if matches!(tools.choice, ToolChoice::Function(_)) => "tool_choice",
        (None, Some(_)) => "tools",
        _ => request.format_param,
    }
}

/// `grammar` compiled once, and a copy of it for each of `prompts` prompts: 400 naming
/// `param` if it cannot be.
fn constraints(
    state: &State,
    grammar: &Grammar,
    param: &'static str,
    prompts: usize,
) -> Result<Vec<Constraint>, ApiError> {
    let loaded = ready(state)?;
    let invalid = |e: GrammarError| ApiError::invalid_field(param, format!("{param}: {e}"));
    let grammars = loaded
        .grammars
        .get_or_init(|| Grammars::new(&loaded.tokenizer, loaded.vocab_size, &loaded.end_ids));
    let grammars = grammars.as_ref().map_err(|e| invalid(e.clone()))?;
    let first = grammars.constraint(grammar).map_err(invalid)?;
    let copies: Vec<Constraint> = (1..prompts).map(|_| first.fork()).collect();
    Ok(std::iter::once(first).chain(copies).collect())
}

/// A request naming a model must name the one served: an answer must not pass for another
/// model's. 404 `model_not_found`, as OpenAI and vLLM answer (llama-server ignores the
/// field). A request without `model` gets the served one.
pub(crate) fn check_model(state: &State, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(model) if !served_names(state).any(|name| name == model) => {
            Err(ApiError::model_not_found(model, &state.options.model))
        }
        _ => Ok(()),
    }
}

/// The names a request's `model` may give: the served model's, then its aliases.
fn served_names(state: &State) -> impl Iterator<Item = &String> {
    std::iter::once(&state.options.model).chain(&state.options.aliases)
}

/// What a chat's template is rendered with besides its messages.
pub(crate) struct Template {
    pub tools: Option<Vec<serde_json::Value>>,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

impl Template {
    /// The chat the template renders: `messages` with these tools and variables.
    pub fn chat(
        &self,
        tokenizer: &Tokenizer,
        messages: Vec<runtime::text::chat::Message>,
    ) -> Result<ChatRequest, TokenizerError> {
        let mut chat = tokenizer.chat_messages(messages)?;
        chat.tools = self.tools.clone();
        chat.kwargs.extend(self.kwargs.clone());
        Ok(chat)
    }
}

/// A prompt's token ids: a conversation through the chat template, text through the
/// tokenizer, token ids checked against the vocabulary.
pub(crate) fn tokenize(
    tokenizer: &Tokenizer,
    prompt: Prompt,
    template: &Template,
    specials: ContentSpecials,
) -> Result<Tokenized, ApiError> {
    let param = prompt.param();
    let invalid = |e: TokenizerError| ApiError::invalid_field(param, e.to_string());
    let mut opens_thinking = false;
    let ids = match prompt {
        Prompt::Chat(messages) => {
            let chat = template.chat(tokenizer, messages).map_err(invalid)?;
            let (ids, text) =
                (tokenizer.encode_request_rendered(&chat, &ChatRequest::render, specials))
                    .map_err(invalid)?;
            opens_thinking = reasoning::opens_thinking(&text);
            ids
        }
        Prompt::Text(text) => tokenizer.encode(&text).map_err(invalid)?,
        Prompt::Ids(ids) => {
            in_vocabulary(tokenizer, param, ids.iter().copied())?;
            ids
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid_field(param, "the prompt is empty"));
    }
    Ok(Tokenized {
        ids,
        opens_thinking,
    })
}

/// A prompt's token ids.
pub(crate) struct Tokenized {
    pub ids: Vec<u32>,
    /// A chat prompt whose template opened a `<think>` section for the answer.
    pub opens_thinking: bool,
}

/// 400 naming `param` unless every id is one the tokenizer has.
pub(crate) fn in_vocabulary(
    tokenizer: &Tokenizer,
    param: &'static str,
    mut ids: impl Iterator<Item = u32>,
) -> Result<(), ApiError> {
    let max = tokenizer.max_id();
    match ids.find(|&id| id > max) {
        Some(id) => Err(ApiError::invalid_field(
            param,
            format!("{param}: token id {id} is not in the vocabulary (0 to {max})"),
        )),
        None => Ok(()),
    }
}

/// How to continue a prompt of `prompt_tokens` tokens: what is asked for must fit the
/// context with the prompt, or it is 400 `context_length_exceeded` naming the field to
/// shorten (OpenAI and vLLM refuse it too, rather than cut the answer short), unless the
/// request takes its `max_tokens` as a bound the context may lower (`fit_context`,
/// Anthropic's); without `max_tokens`, the rest of the context.
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
        Some(_) if request.fit_context => room,
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
        grammar: None,
    })
}

/// Who may share kept caches with this request (the engine reuses a cache only within a
/// scope): the credentials it presented (its whole `Authorization` and `x-api-key` headers,
/// if any) and its `cache_salt`, each length-prefixed (or `-` when absent) so that no two
/// different triples give the same scope.
fn scope(headers: &HeaderMap, salt: Option<&str>) -> String {
    let part = |value: Option<String>| match value {
        None => "-".to_string(),
        Some(value) => format!("{}:{value}", value.len()),
    };
    // Escaped: a header need not be UTF-8, and lossy decoding would merge different ones.
    let header = |name: &str| (headers.get(name)).map(|v| v.as_bytes().escape_ascii().to_string());
    let (bearer, key) = (header("authorization"), header("x-api-key"));
    let salt = salt.map(str::to_string);
    format!("{}{}{}", part(bearer), part(key), part(salt))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary with `<tool_call>` as token 3 gets it banned, in id order among the
    /// request's own biases (its bias for that token replaced); one without, nothing.
    #[test]
    fn tool_choice_none_bans_the_call_token() {
        let tokenizer = |added: &str| {
            let json = serde_json::json!({
                "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "a": 1, "b": 2}, "unk_token": "<unk>"},
                "pre_tokenizer": {"type": "Whitespace"},
                "added_tokens": [{"id": 3, "content": added, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": false}],
            });
            Tokenizer::from_json(json.to_string().as_bytes(), None).unwrap()
        };
        let mut biases = vec![(1, 5.0), (3, 2.0), (7, -1.0)];
        ban_calls(&mut biases, &tokenizer("<tool_call>"), Format::Hermes);
        assert_eq!(biases, [(1, 5.0), (3, -100.0), (7, -1.0)]);
        let mut biases = vec![(1, 5.0), (7, -1.0)];
        ban_calls(&mut biases, &tokenizer("<tool_call>"), Format::Hermes);
        assert_eq!(biases, [(1, 5.0), (3, -100.0), (7, -1.0)]);
        let mut biases = vec![(1, 5.0)];
        ban_calls(&mut biases, &tokenizer("<|python_tag|>"), Format::Hermes);
        assert_eq!(biases, [(1, 5.0)]);
        ban_calls(&mut biases, &tokenizer("<|python_tag|>"), Format::Llama3);
        assert_eq!(biases, [(1, 5.0), (3, -100.0)]);
    }

    #[test]
    fn scopes_tell_every_key_and_salt_apart() {
        // `Authorization`, or `x-api-key` when it starts with `x:`.
        let headers = |key: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(key) = key {
                let (name, value) = match key.strip_prefix("x:") {
                    Some(value) => ("x-api-key", value),
                    None => ("authorization", key),
                };
                headers.insert(name, value.parse().unwrap());
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
            (Some("x:Bearer a"), Some("b")),
            (Some("x:a"), None),
            (Some("x:"), None),
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
