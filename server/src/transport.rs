//! The HTTP/1.1 transport: accepting connections, serving each with hyper under deadlines,
//! and stopping.
//!
//! - A request's head must arrive within the read timeout of when the server starts waiting
//!   for it (hyper's `header_read_timeout`, which runs from a connection's start and again
//!   from the end of each response, so it is also the idle keep-alive timeout); the body
//!   then gets the same time again ([`guard`]). Responses, streamed or not, have no deadline.
//! - Open connections are capped ([`connections`]); at the cap a new connection closes the
//!   longest-waiting one that has no request under way.
//! - On SIGTERM or Ctrl-C the listener closes, connections with nothing under way close at
//!   once, the others finish their request; after the shutdown timeout (or a second signal)
//!   those left are closed and the server returns.
//! - hyper answers a request it cannot parse (400, 414, 431) itself, before any service
//!   runs, with an empty body; [`Socket`] gives those responses OpenAI's error envelope.
//!
//! HTTP/1.1 only, as llama-server and vLLM (uvicorn) serve.

use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::http::StatusCode;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use crate::connections::{Connection, Registry};
use crate::error::ApiError;
use crate::guard::{self, Policy};

/// Largest request head (request line and headers), in bytes: above hyper's URI limit, so
/// that an over-long URI is told apart (414) from an over-long head (431).
pub(crate) const MAX_HEAD_BYTES: usize = 80 * 1024;
/// hyper's limits on header fields and URI length.
const MAX_HEADERS: usize = 100;
const MAX_URI_BYTES: usize = 65534;

/// What stops the server: SIGTERM, SIGINT (Ctrl-C), or the model failing to load.
pub(crate) struct Stop {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
    load_failed: Option<oneshot::Receiver<()>>,
}

impl Stop {
    /// Installs the signal handlers (within a tokio runtime).
    pub fn new(load_failed: oneshot::Receiver<()>) -> Self {
        Self {
            terminate: signal(SignalKind::terminate()).ok(),
            interrupt: signal(SignalKind::interrupt()).ok(),
            load_failed: Some(load_failed),
        }
    }

    /// Resolves at the next signal, or when the model failed to load. Cancel-safe.
    async fn next(&mut self) {
        let Self {
            terminate,
            interrupt,
            load_failed,
        } = self;
        let failed = async {
            if let Some(receiver) = load_failed.as_mut() {
                let result = receiver.await;
                *load_failed = None;
                if result.is_ok() {
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            () = received(terminate) => {},
            () = received(interrupt) => {},
            () = failed => {},
        }
    }
}

async fn received(signal: &mut Option<Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// How serving ended.
pub(crate) struct Stopped {
    /// Connections still open at the shutdown deadline (or a second signal), closed then.
    pub cut: usize,
}

/// What every connection shares.
struct Shared {
    http: http1::Builder,
    router: axum::Router,
    policy: Arc<Policy>,
}

/// Serves until `stop`, then drains the connections for at most `shutdown_timeout`.
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    policy: Arc<Policy>,
    registry: Arc<Registry>,
    shutdown_timeout: Duration,
    stop: &mut Stop,
) -> Stopped {
    let shared = Arc::new(Shared {
        http: http1_builder(policy.read_timeout),
        router,
        policy,
    });
    let (stopping, stop_watch) = watch::channel(false);
    let mut tasks = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = tasks.join_next() => continue,
            () = stop.next() => break,
        };
        match accepted {
            // At the cap with every connection handling a request, a new one is closed.
            Ok((stream, peer)) => match registry.admit() {
                Some(connection) => {
                    let (shared, stop_watch) = (shared.clone(), stop_watch.clone());
                    let task = run_connection(stream, peer.ip(), connection, shared, stop_watch);
                    tasks.spawn(task);
                }
                None => drop(stream),
            },
            Err(e) => after_accept_error(e).await,
        }
    }
    drop(listener);
    let _ = stopping.send(true);
    tokio::select! {
        () = async { while tasks.join_next().await.is_some() {} } => {},
        () = tokio::time::sleep(shutdown_timeout) => {},
        () = stop.next() => {},
    }
    // Dropping the set aborts the connections left.
    Stopped { cut: tasks.len() }
}

fn http1_builder(read_timeout: Duration) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        // One flat buffer per write, so that `Socket` sees hyper's error responses whole.
        .writev(false);
    builder
}

/// As hyper's and axum's servers do: errors of one connection are ignored; others (out of
/// file descriptors) are waited out briefly rather than spun on.
async fn after_accept_error(e: io::Error) {
    let of_one_connection = matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    );
    if !of_one_connection {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves one connection until it closes, is evicted, or the server stops.
async fn run_connection(
    stream: TcpStream,
    peer: IpAddr,
    connection: Connection,
    shared: Arc<Shared>,
    mut stopping: watch::Receiver<bool>,
) {
    // Streamed tokens are sent as they come, not held back by Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    let connection = Arc::new(connection);
    let service = {
        let (connection, shared) = (connection.clone(), shared.clone());
        service_fn(move |request| {
            let (connection, shared) = (connection.clone(), shared.clone());
            async move {
                let router = shared.router.clone();
                let policy = &shared.policy;
                let response = guard::handle(request, policy, &connection, peer, router).await;
                Ok::<_, Infallible>(response)
            }
        })
    };
    let served = (shared.http).serve_connection(TokioIo::new(Socket::new(stream)), service);
    tokio::pin!(served);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = served.as_mut() => return,
            () = connection.evicted() => return,
            changed = stopping.changed(), if !draining => {
                draining = true;
                if changed.is_err() || connection.is_waiting() {
                    return;
                }
                // The request under way finishes; the connection closes after it.
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A TCP stream that gives hyper's own error responses OpenAI's envelope.
///
/// hyper answers a request head it cannot parse (malformed: 400; URI too long: 414; head too
/// large: 431) before any service sees it, with `content-length: 0`; no hook changes that
/// response. Every response of ours has a body, so a head with one of those statuses and
/// `content-length: 0` at the end of a write is hyper's: it is replaced by the same head with
/// a JSON body (and `connection: close`, which hyper does after such an error anyway).
struct Socket {
    stream: TcpStream,
    /// What is sent instead of what hyper wrote, and how much of it has been sent.
    replacement: Option<(Vec<u8>, usize)>,
}

impl Socket {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            replacement: None,
        }
    }

    fn poll_send_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some((bytes, sent)) = &mut self.replacement else {
            return Poll::Ready(Ok(()));
        };
        while *sent < bytes.len() {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &bytes[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match &mut this.replacement {
            // hyper writes nothing after its error response; kept in order if it ever did.
            Some((bytes, _)) => bytes.extend_from_slice(buf),
            None => match with_envelope(buf) {
                Some(bytes) => this.replacement = Some((bytes, 0)),
                None => return Pin::new(&mut this.stream).poll_write(cx, buf),
            },
        }
        if let Poll::Ready(Err(e)) = this.poll_send_replacement(cx) {
            return Poll::Ready(Err(e));
        }
        // Taken: the rest is sent by the flush hyper calls next.
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_replacement(cx))?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_replacement(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

/// If `written` ends with a response head hyper made for a request it could not parse, the
/// same bytes with that response given an OpenAI error body; else `None`.
fn with_envelope(written: &[u8]) -> Option<Vec<u8>> {
    if !written.ends_with(b"\r\n\r\n") {
        return None;
    }
    let start = written.windows(7).rposition(|w| w == b"HTTP/1.")?;
    let head = std::str::from_utf8(&written[start..]).ok()?;
    let status = StatusCode::from_bytes(head.get(9..12)?.as_bytes()).ok()?;
    let message = match status {
        StatusCode::BAD_REQUEST => {
            "the request is not valid HTTP/1.1: its request line or a header is malformed"
                .to_string()
        }
        StatusCode::URI_TOO_LONG => format!("the request URI is longer than {MAX_URI_BYTES} bytes"),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => format!(
            "the request head is larger than {MAX_HEAD_BYTES} bytes or has more than {MAX_HEADERS} header fields"
        ),
        _ => return None,
    };
    let lines: Vec<&str> = head.trim_end().split("\r\n").collect();
    let is_bodiless = |line: &&str| line.eq_ignore_ascii_case("content-length: 0");
    if !lines.iter().any(is_bodiless) {
        return None;
    }
    let kept: Vec<&str> = lines.into_iter().filter(|l| !is_bodiless(l)).collect();
    let body = ApiError::with_status(status, message).body().to_string();
    let mut bytes = written[..start].to_vec();
    bytes.extend_from_slice(kept.join("\r\n").as_bytes());
    let headers = format!(
        "\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    bytes.extend_from_slice(headers.as_bytes());
    bytes.extend_from_slice(body.as_bytes());
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_bodiless_error_heads_get_an_envelope() {
        let date = "date: Mon, 01 Jan 2024 00:00:00 GMT\r\n";
        let hyper_431 = format!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n{date}\r\n"
        );
        let rewritten = String::from_utf8(with_envelope(hyper_431.as_bytes()).unwrap()).unwrap();
        let (head, body) = rewritten.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains(date.trim_end()) && !head.contains("content-length: 0"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");

        // After the tail of an earlier response in the same write.
        let after = format!("0\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n");
        let rewritten = with_envelope(after.as_bytes()).unwrap();
        assert!(rewritten.starts_with(b"0\r\n\r\nHTTP/1.1 400 Bad Request\r\n"));

        for ours in [
            format!("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n{date}\r\n"),
            format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 80\r\n{date}\r\n"
            ),
            "HTTP/1.1 100 Continue\r\n\r\n".to_string(),
            "data: HTTP/1.1 400 \r\n\r\n".to_string(),
        ] {
            assert!(with_envelope(ours.as_bytes()).is_none(), "{ours}");
        }
    }
}
