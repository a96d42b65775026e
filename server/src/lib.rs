//! `runtime serve`: an OpenAI-compatible HTTP server over the runtime library.
//!
//! The HTTP side (axum on tokio) parses and checks requests ([`api`]), tokenizes prompts and
//! turns engine events into responses or server-sent events ([`routes`]); one engine thread
//! owns the model and runs the requests ([`engine`]). The port is bound before the model
//! loads, so `/health` answers 503 until it is ready. SIGTERM or Ctrl-C stops accepting
//! connections, lets the requests under way finish, and returns.

pub mod api;
pub mod engine;
pub mod error;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, mpsc};

use runtime::backend::KernelBackend;
use runtime::generate::Generator;
use runtime::tokenizer::Tokenizer;

use crate::engine::{Engine, Job, Metrics};

/// How to serve.
#[derive(Debug, Clone)]
pub struct Options {
    pub host: String,
    pub port: u16,
    /// Sequences run at once; more requests wait in a queue.
    pub parallel: usize,
    /// Requests to `/v1/...` must carry `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The name `/v1/models` lists and responses carry.
    pub model: String,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Worker threads for the model (default: one per core).
    pub threads: Option<usize>,
}

/// What the HTTP side needs of the loaded model.
pub(crate) struct Loaded {
    pub tokenizer: Arc<Tokenizer>,
    /// max_position_embeddings.
    pub context: usize,
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
    Io(#[from] std::io::Error),
}

/// Serves until SIGTERM or Ctrl-C. `load` runs on the engine thread after the port is bound
/// (`on_listening` is told the address) and gives the model and its tokenizer.
pub fn serve<B, L>(
    options: Options,
    load: L,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError>
where
    B: KernelBackend,
    L: FnOnce() -> Result<(Generator<B>, Tokenizer), String> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let address = format!("{}:{}", options.host, options.port);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&address))
        .map_err(|source| ServeError::Bind { address, source })?;
    on_listening(listener.local_addr()?);

    let metrics = Arc::new(Metrics::default());
    let loaded = Arc::new(OnceLock::new());
    let (jobs, queue) = mpsc::channel::<Job>();
    // Told if the model fails to load: the server then stops with that error.
    let (failed, load_failed) = tokio::sync::oneshot::channel::<()>();
    let engine = {
        let (metrics, loaded) = (metrics.clone(), loaded.clone());
        let (parallel, threads) = (options.parallel, options.threads);
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
                    });
                    metrics
                        .ready
                        .store(true, std::sync::atomic::Ordering::Release);
                    let engine = Engine {
                        generator,
                        tokenizer,
                        parallel,
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
    let app = routes::router(state);
    let served = runtime.block_on(async {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal(async {
                if load_failed.await.is_err() {
                    // Loaded (the sender is gone unused): only a signal stops the server.
                    std::future::pending::<()>().await;
                }
            }))
            .await
    });
    // The router (and with it the job sender) is gone: the engine ends its sequences and
    // returns.
    let engine = engine
        .join()
        .map_err(|_| ServeError::Load("the engine panicked".into()))?;
    engine.map_err(ServeError::Load)?;
    served?;
    Ok(())
}

/// SIGTERM, Ctrl-C, or `other`.
async fn shutdown_signal(other: impl std::future::Future<Output = ()>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
        () = other => {},
    }
}
