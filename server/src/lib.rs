//! `runtime serve`: an OpenAI-compatible HTTP server over the runtime library, which also
//! speaks Anthropic's Messages API.
//!
//! The HTTP side (hyper and axum on tokio) accepts connections under deadlines and a cap
//! ([`transport`], [`connections`]), checks what a request must pass before it is routed
//! ([`guard`]), parses and checks requests ([`api`]), tokenizes prompts and turns engine
//! events into responses or server-sent events ([`routes`], [`reply`]; Anthropic's
//! `/v1/messages` over the same path, [`messages`], and OpenAI's `/v1/responses`,
//! [`responses`]; `/v1/embeddings`, [`embeddings`]); one engine thread owns the
//! model and runs the requests ([`engine`]). The port is bound before the model loads, so
//! `/health` answers 503 until it is ready. SIGTERM or Ctrl-C stops accepting connections,
//! lets the requests under way finish within the shutdown timeout, and returns.

pub mod api;
mod connections;
mod embeddings;
pub mod engine;
pub mod error;
mod guard;
mod messages;
mod reply;
mod responses;
mod routes;
mod text_events;
mod tokens;
mod transport;
mod webui;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use runtime::generate::Generator;
use runtime::model::backend::KernelBackend;
use runtime::model::config::Pooling;
use runtime::text::grammar::{GrammarError, Grammars};
use runtime::text::tokenizer::{ContentSpecials, Tokenizer};

use crate::engine::{Engine, Metrics, Work};

/// How to serve.
#[derive(Debug, Clone)]
pub struct Options {
    pub host: String,
    pub port: u16,
    /// Sequences run at once; more requests wait in a queue.
    pub parallel: usize,
    /// Requests that may wait for a slot; past them a new request gets 429 with
    /// `Retry-After`. Each waiting request holds a connection: a value not below the
    /// connection cap is lowered to half of it, so that the queue cannot take every
    /// connection.
    pub max_queue: usize,
    /// Requests to `/v1/...` must carry `Authorization: Bearer <key>` or `x-api-key: <key>`.
    pub api_key: Option<String>,
    /// The name `/v1/models` lists and responses carry.
    pub model: String,
    /// Other names a request may give as its `model` (clients that send a fixed name),
    /// listed by `/v1/models` too.
    pub aliases: Vec<String>,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Worker threads for the model (default: one per core).
    pub threads: Option<usize>,
    /// How long a client has to send a request's head, from when the server starts waiting
    /// for it (so also how long an idle connection is kept), and then as long for its body.
    pub read_timeout: Duration,
    /// After SIGTERM or Ctrl-C, how long requests under way have to finish before the
    /// server closes their connections and returns.
    pub shutdown_timeout: Duration,
    /// Connections open at once (lowered to fit the open-file limit). At the cap a new
    /// connection closes the one waiting longest without a request under way.
    pub max_connections: usize,
    /// Origins (`scheme://host[:port]`, or `*` for any) allowed cross-origin requests.
    pub allowed_origins: Vec<String>,
    /// Host names served besides loopback ones when bound to a loopback address (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// Proxies whose `X-Forwarded-Proto` is believed: a browser's page behind one that
    /// terminates TLS has the origin `https://` + Host, which is then its own.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Bytes the KV caches kept from finished requests (for the next turn of their
    /// conversations) may take in all; the least recently used are dropped first.
    pub cache_budget: u64,
    /// What special-token text inside a chat message becomes: plain text (the default, so
    /// that a user cannot forge the template's turns) or the special token.
    pub content_specials: ContentSpecials,
    /// Leave a thinking model's `<think>` section in `content` instead of moving it to
    /// `reasoning_content`.
    pub keep_thinking: bool,
    /// Serve the chat page at `/`.
    pub webui: bool,
}

/// What the HTTP side needs of the loaded model.
pub(crate) struct Loaded {
    pub tokenizer: Arc<Tokenizer>,
    /// max_position_embeddings.
    pub context: usize,
    /// The model's vocab_size and end ids, for its grammars.
    pub vocab_size: usize,
    pub end_ids: Vec<u32>,
    /// An embedding model, which generates no text.
    pub embedding_model: bool,
    /// How texts are embedded, and the embeddings' full size (hidden_size).
    pub pooling: Pooling,
    pub hidden_size: usize,
    /// The vocabulary as grammars see it, made for the first request that has one.
    pub grammars: OnceLock<Result<Grammars, GrammarError>>,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("cannot load the model: {0}")]
    Load(String),
    #[error("{0}")]
    Options(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Serves until SIGTERM or Ctrl-C. `load` runs on the engine thread after the port is bound
/// (`on_listening` is told the address) and gives the model and its tokenizer.
pub fn serve<B, L>(
    mut options: Options,
    load: L,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError>
where
    B: KernelBackend,
    L: FnOnce() -> Result<(Generator<B>, Tokenizer), String> + Send + 'static,
{
    check(&options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let address = format!("{}:{}", options.host, options.port);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&address))
        .map_err(|source| ServeError::Bind { address, source })?;
    let local = listener.local_addr()?;
    on_listening(local);
    let connection_limit = connection_cap(options.max_connections);
    let registry = connections::Registry::new(connection_limit);
    options.max_queue = queue_cap(options.max_queue, connection_limit);
    let policy = Arc::new(policy(&options, local));

    let metrics = Arc::new(Metrics::default());
    let loaded = Arc::new(OnceLock::new());
    let (jobs, queue) = mpsc::channel::<Work>();
    // Told if the model fails to load: the server then stops with that error.
    let (failed, load_failed) = tokio::sync::oneshot::channel::<()>();
    // Installed before the model loads, so that a signal then stops the server too.
    let mut stop = {
        let _context = runtime.enter();
        transport::Stop::new(load_failed)
    };
    let engine = {
        let (metrics, loaded) = (metrics.clone(), loaded.clone());
        let (parallel, threads) = (options.parallel, options.threads);
        let cache_budget = options.cache_budget;
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || -> Result<(), String> {
                runtime::in_thread_pool(threads, move || {
                    let (generator, tokenizer) = load().inspect_err(|_| {
                        let _ = failed.send(());
                    })?;
                    let tokenizer = Arc::new(tokenizer);
                    let _ = loaded.set(Loaded {
                        tokenizer: tokenizer.clone(),
                        context: generator.config.max_position_embeddings,
                        vocab_size: generator.config.vocab_size,
                        end_ids: generator.eos_ids().to_vec(),
                        embedding_model: generator.config.embedding_model,
                        pooling: generator.pooling.clone(),
                        hidden_size: generator.config.hidden_size,
                        grammars: OnceLock::new(),
                    });
                    metrics
                        .ready
                        .store(true, std::sync::atomic::Ordering::Release);
                    let engine = Engine {
                        generator,
                        tokenizer,
                        parallel,
                        cache_budget,
                    };
                    engine.run(queue, &metrics);
                    Ok(())
                })
                .map_err(|e| e.to_string())?
            })?
    };
    let state = routes::State {
        jobs,
        metrics,
        loaded,
        options: Arc::new(options),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let shutdown_timeout = state.options.shutdown_timeout;
    let more_api = (tokens::routes())
        .merge(messages::routes())
        .merge(responses::routes())
        .merge(embeddings::routes());
    let app = routes::router(state, more_api);
    let stopped = runtime.block_on(transport::serve(
        listener,
        app,
        policy,
        registry,
        shutdown_timeout,
        &mut stop,
    ));
    if stopped.cut > 0 {
        eprintln!(
            "note: closed {} connection(s) still open {} s after the signal (--shutdown-timeout)",
            stopped.cut,
            shutdown_timeout.as_secs_f64()
        );
    }
    // Drops what is left of the connections, and with them the job sender and the event
    // receivers: the engine cancels its sequences before their next token and returns.
    runtime.shutdown_timeout(Duration::from_millis(200));
    let waited = Instant::now();
    while !engine.is_finished() {
        if waited.elapsed() > ENGINE_GRACE {
            // Within a long prefill step: the process exits without waiting for it.
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let engine = engine
        .join()
        .map_err(|_| ServeError::Load("the engine panicked".into()))?;
    engine.map_err(ServeError::Load)
}

/// How long the engine gets, once the connections are closed, to end its sequences.
const ENGINE_GRACE: Duration = Duration::from_secs(1);

/// Files the server keeps for itself beyond its connections (the model's files, the engine,
/// standard streams), and for a burst of connections accepted before evicted ones close.
const RESERVED_FILES: u64 = 64;

/// Refuses options no client could use.
fn check(options: &Options) -> Result<(), ServeError> {
    if let Some(key) = &options.api_key {
        let sendable = key.chars().all(|c| c.is_ascii_graphic() || c == ' ');
        if key.is_empty() || key.trim() != key || !sendable {
            return Err(ServeError::Options(
                "--api-key must be non-empty printable ASCII without surrounding spaces: no client could send this one".into(),
            ));
        }
    }
    let names = std::iter::once(&options.model).chain(&options.aliases);
    if let Some(bad) = names.into_iter().find(|name| name.trim().is_empty()) {
        return Err(ServeError::Options(format!(
            "--served-model-name {bad:?} is empty: no client could name it"
        )));
    }
    if let Some(bad) = (options.allowed_origins.iter()).find(|o| !guard::is_origin(o)) {
        return Err(ServeError::Options(format!(
            "--allowed-origin {bad:?} is not an origin: scheme://host[:port] (e.g. http://localhost:3000), or *"
        )));
    }
    if options.max_queue == 0 {
        return Err(ServeError::Options(
            "--max-queue must be at least 1: every request waits in the queue until the engine takes it".into(),
        ));
    }
    if options.read_timeout.is_zero() {
        return Err(ServeError::Options(
            "--read-timeout must be at least 1 s".into(),
        ));
    }
    Ok(())
}

fn policy(options: &Options, local: SocketAddr) -> guard::Policy {
    let lowercase = |names: &[String]| -> Vec<String> {
        let trimmed = names.iter().map(|n| n.trim_end_matches('/'));
        trimmed.map(str::to_ascii_lowercase).collect()
    };
    guard::Policy {
        loopback_port: local.ip().is_loopback().then_some(local.port()),
        allowed_hosts: lowercase(&options.allowed_hosts),
        allowed_origins: lowercase(&options.allowed_origins),
        trusted_proxies: (options.trusted_proxies.iter())
            .map(|ip| ip.to_canonical())
            .collect(),
        body_limit: options.body_limit,
        read_timeout: options.read_timeout,
        api_key: options.api_key.clone(),
    }
}

/// `wanted`, lowered to what the open-file limit leaves (its soft limit first raised to the
/// hard one: every connection is a file).
fn connection_cap(wanted: usize) -> usize {
    let files: u64 = raise_open_file_limit();
    let cap = files.saturating_sub(RESERVED_FILES).max(1);
    if (wanted as u64) <= cap {
        return wanted;
    }
    eprintln!(
        "note: at most {cap} connections at once (the open-file limit is {files}), not {wanted}"
    );
    cap as usize
}

/// `wanted`, lowered to half of `connections` if it is not below them: each waiting request
/// holds a connection, and a full queue must leave some for everyone else (`/health`).
fn queue_cap(wanted: usize, connections: usize) -> usize {
    if wanted < connections {
        return wanted;
    }
    let cap = (connections / 2).max(1);
    eprintln!(
        "note: at most {cap} requests wait for a slot (half the {connections} connections), not {wanted}"
    );
    cap
}

/// Raises the soft limit on open files to the hard limit, and returns the limit in force.
fn raise_open_file_limit() -> libc::rlim_t {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            ..limit
        };
        if limit.rlim_cur < limit.rlim_max && libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            limit = raised;
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue as long as the connections (or longer) would let waiting requests take
    /// every connection: it is halved to fit.
    #[test]
    fn the_queue_leaves_connections_free() {
        assert_eq!(queue_cap(512, 1024), 512);
        assert_eq!(queue_cap(1023, 1024), 1023);
        assert_eq!(queue_cap(1024, 1024), 512);
        assert_eq!(queue_cap(5000, 136), 68);
        assert_eq!(queue_cap(3, 1), 1);
    }
}
