//! What a request must pass before it is routed, and what every response gets on the way out.
//!
//! - `Host`, when the server is bound to a loopback address, must name a loopback address
//!   (or an `--allowed-host`): a web page that rebinds its own name to 127.0.0.1 (DNS
//!   rebinding) sends its own name as `Host` and is refused.
//! - `Origin`, when a browser sends one, must be the server's own or an `--allowed-origin`:
//!   a page elsewhere cannot make a browser run generations here (cross-site request forgery,
//!   which needs no CORS preflight for a `text/plain` POST). Allowed origins get CORS headers
//!   and their preflight answered. The server's own origin is `http://` + `Host`, or the
//!   scheme a `--trusted-proxy` reports in `X-Forwarded-Proto` (TLS ended at the proxy);
//!   that header from anyone else is ignored, or any client could claim any scheme.
//! - The body is refused at once (413) if `Content-Length` is over the limit, before any of
//!   it is read and before `Expect: 100-continue` is answered; otherwise it must arrive in
//!   full within the read timeout (408) and within the limit (413, for chunked bodies).
//! - With `--api-key`, requests to the API must carry the key (401), as OpenAI's clients send
//!   it (`Authorization: Bearer`) or Anthropic's (`x-api-key`), checked from the head: a
//!   client without it is answered at once, not after its body (which is then read and
//!   dropped before the connection closes).
//! - POST bodies on the API routes must be JSON (415), as vLLM requires.
//!
//! A refusal comes in the envelope of the protocol the path speaks ([`Protocol::of`]).
//!
//! The connection is marked as handling a request from when its body is complete until its
//! response has been sent, so that it is never evicted with work under way.

use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_service::Service;

use crate::connections::{Connection, Handling};
use crate::error::{ApiError, Protocol};

/// The checks' settings, from the options and the bound address.
pub(crate) struct Policy {
    /// The port when bound to a loopback address (then `Host` is checked), else `None`.
    pub loopback_port: Option<u16>,
    /// Host names served besides loopback ones (lowercase; `*`: any).
    pub allowed_hosts: Vec<String>,
    /// Origins allowed cross-origin requests (lowercase; `*`: any).
    pub allowed_origins: Vec<String>,
    /// Peers whose `X-Forwarded-Proto` names the scheme of the server's own origin.
    pub trusted_proxies: Vec<IpAddr>,
    pub body_limit: usize,
    pub read_timeout: Duration,
    /// The key the API routes require (`Authorization: Bearer <key>` or `x-api-key`), if any.
    pub api_key: Option<String>,
}

/// Checks the request, reads its body, routes it, and adds CORS headers to the response.
pub(crate) async fn handle(
    request: hyper::Request<Incoming>,
    policy: &Policy,
    connection: &Connection,
    peer: IpAddr,
    mut router: axum::Router,
) -> Response {
    connection.reading();
    let protocol = Protocol::of(request.uri().path());
    let scheme = scheme(request.headers(), peer, policy);
    let cors = match check_host(request.headers(), policy)
        .and_then(|()| check_origin(request.headers(), scheme, policy))
    {
        Ok(cors) => cors,
        Err(refused) => return closing(refused.respond(protocol)),
    };
    if let Some(origin) = &cors
        && is_preflight(&request)
    {
        return preflight(origin, request.headers());
    }
    // From the head alone: a client without the key is not waited on for its body.
    if let Err(refused) = check_key(&request, policy) {
        discard_body(request, policy);
        return with_cors(closing(refused.respond(protocol)), cors);
    }
    let response = match read_body(request, policy).await {
        Ok(request) => {
            let handling = connection.handling();
            let response = match router.call(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            response.map(|body| Body::new(Tracked { body, handling }))
        }
        Err(refused) => closing(refused.respond(protocol)),
    };
    with_cors(response, cors)
}

/// A response after which the connection is closed: the request's body may be unread.
fn closing(mut response: Response) -> Response {
    (response.headers_mut()).insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn forbidden(message: String) -> ApiError {
    ApiError::with_status(StatusCode::FORBIDDEN, message)
}

/// With an API key set, a request to the API (any path under `/v1/`, as vLLM guards them,
/// and the tokenizer's routes) must carry it, as `Authorization: Bearer <key>` (OpenAI's
/// clients) or `x-api-key: <key>` (Anthropic's; either header on any route): 401 otherwise.
/// Health, metrics and the chat page need none.
fn check_key(request: &hyper::Request<Incoming>, policy: &Policy) -> Result<(), ApiError> {
    let Some(key) = &policy.api_key else {
        return Ok(());
    };
    let path = request.uri().path();
    let api =
        path.starts_with("/v1/") || matches!(path, "/tokenize" | "/detokenize" | "/apply-template");
    if !api {
        return Ok(());
    }
    let headers = request.headers();
    let bearer = (headers.get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let anthropic = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    // Both compared, so that the time taken does not tell which header held the key.
    if same_key(bearer, key) | same_key(anthropic, key) {
        return Ok(());
    }
    Err(ApiError::with_status(
        StatusCode::UNAUTHORIZED,
        "invalid or missing API key",
    ))
}

/// When bound to a loopback address, `Host` must be `localhost`, a loopback IP, or an
/// allowed host; a port, if given, must be the bound one. No `Host` (not a browser) passes.
fn check_host(headers: &HeaderMap, policy: &Policy) -> Result<(), ApiError> {
    let (Some(port), Some(host)) = (policy.loopback_port, headers.get(header::HOST)) else {
        return Ok(());
    };
    let host = host.to_str().unwrap_or_default().to_ascii_lowercase();
    if host_is_served(&host, port, &policy.allowed_hosts) {
        return Ok(());
    }
    Err(forbidden(format!(
        "the Host header {host:?} does not name this server: bound to a loopback address, it serves localhost, 127.x.x.x and [::1] on port {port} (--allowed-host adds names)"
    )))
}

fn host_is_served(host: &str, port: u16, allowed: &[String]) -> bool {
    let Some((name, given_port)) = split_host(host) else {
        return false;
    };
    if allowed.iter().any(|a| a == "*" || a == name) {
        return true;
    }
    let loopback = name == "localhost"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
        || (name.strip_prefix('[').and_then(|n| n.strip_suffix(']')))
            .and_then(|ip| ip.parse::<std::net::Ipv6Addr>().ok())
            .is_some_and(|ip| ip.is_loopback());
    loopback && given_port.is_none_or(|p| p == port.to_string())
}

/// `name[:port]`, the name of an IPv6 address in brackets; `None` if malformed.
fn split_host(host: &str) -> Option<(&str, Option<&str>)> {
    let (name, rest) = if host.starts_with('[') {
        let end = host.find(']')? + 1;
        host.split_at(end)
    } else {
        match host.rfind(':') {
            Some(colon) => host.split_at(colon),
            None => (host, ""),
        }
    };
    match rest {
        "" => Some((name, None)),
        rest => Some((name, Some(rest.strip_prefix(':')?))),
    }
}

/// The scheme the client reached the server by: `https` when a trusted proxy says so in
/// `X-Forwarded-Proto` (its first value: the client's side, when proxies append), else
/// `http`, as this server speaks.
fn scheme(headers: &HeaderMap, peer: IpAddr, policy: &Policy) -> &'static str {
    if !policy.trusted_proxies.contains(&peer.to_canonical()) {
        return "http";
    }
    let forwarded = (headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok()))
    .and_then(|v| v.split(',').next())
    .map(str::trim);
    match forwarded {
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => "https",
        _ => "http",
    }
}

/// `Ok(Some(origin))` for an allowed cross-origin request (its response gets CORS headers),
/// `Ok(None)` for a same-origin request or one without `Origin` (not from a browser page).
fn check_origin(
    headers: &HeaderMap,
    scheme: &str,
    policy: &Policy,
) -> Result<Option<HeaderValue>, ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(None);
    };
    let given = origin.to_str().unwrap_or_default().to_ascii_lowercase();
    let own = (headers.get(header::HOST).and_then(|h| h.to_str().ok()))
        .map(|host| format!("{scheme}://{}", host.to_ascii_lowercase()));
    if own.as_deref() == Some(given.as_str()) {
        return Ok(None);
    }
    if (policy.allowed_origins.iter()).any(|allowed| allowed == "*" || *allowed == given) {
        return Ok(Some(origin.clone()));
    }
    Err(forbidden(format!(
        "cross-origin requests from {given:?} are refused: this server's origin here is {} (--allowed-origin allows an origin; behind a proxy that ends TLS, --trusted-proxy believes its X-Forwarded-Proto)",
        own.as_deref()
            .map_or("unknown (no Host)".into(), |own| format!("{own:?}"))
    )))
}

/// Whether `origin` is one an `--allowed-origin` can name: `*`, or `scheme://host[:port]`.
pub(crate) fn is_origin(origin: &str) -> bool {
    origin == "*"
        || (origin.split_once("://")).is_some_and(|(scheme, rest)| {
            !scheme.is_empty() && !rest.is_empty() && !rest.contains(['/', '?', '#', ' '])
        })
}

fn is_preflight(request: &hyper::Request<Incoming>) -> bool {
    request.method() == Method::OPTIONS
        && (request.headers()).contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// 204 allowing the methods the API uses and the headers the preflight asks for.
fn preflight(origin: &HeaderValue, headers: &HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let out = response.headers_mut();
    out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    out.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    if let Some(asked) = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    out.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    out.insert(
        header::VARY,
        HeaderValue::from_static(
            "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
        ),
    );
    response
}

fn with_cors(mut response: Response, origin: Option<HeaderValue>) -> Response {
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// The whole body, refused from `Content-Length` if that is over the limit, within the
/// read timeout and the limit otherwise.
async fn read_body(
    request: hyper::Request<Incoming>,
    policy: &Policy,
) -> Result<Request, ApiError> {
    let limit = policy.body_limit;
    let too_large = || {
        ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    };
    let (parts, body) = request.into_parts();
    let declared = (parts.headers.get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large());
    }
    let collected = tokio::time::timeout(policy.read_timeout, Limited::new(body, limit).collect())
        .await
        .map_err(|_| {
            ApiError::with_status(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    policy.read_timeout.as_secs_f64()
                ),
            )
        })?
        .map_err(|e| match e.is::<LengthLimitError>() {
            true => too_large(),
            false => ApiError::invalid(format!("cannot read the request body: {e}")),
        })?;
    Ok(Request::from_parts(parts, Body::from(collected.to_bytes())))
}

/// Reads and drops, in the background, the body of a request answered without it (within
/// the body limit and the read timeout): the connection then closes after the body instead
/// of being reset over it, so that a client still sending it reads the answer rather than a
/// broken pipe (nginx's lingering close). Not when the client waits for `100 Continue`
/// before it sends: reading would send that after the answer, and the client sends nothing.
fn discard_body(request: hyper::Request<Incoming>, policy: &Policy) {
    let expects_continue = (request.headers().get(header::EXPECT))
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        return;
    }
    let mut body = Limited::new(request.into_body(), policy.body_limit);
    let read_timeout = policy.read_timeout;
    tokio::spawn(tokio::time::timeout(read_timeout, async move {
        while let Some(Ok(_)) = body.frame().await {}
    }));
}

/// A response body that keeps its connection marked as handling a request until it is
/// dropped (sent in full, or abandoned by a client that left).
struct Tracked {
    body: Body,
    #[allow(dead_code)] // held for its drop
    handling: Handling,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// 415 unless a POST's `Content-Type` is `application/json` (parameters such as `charset`
/// allowed), as vLLM answers: a browser form or `text/plain` POST never runs a generation.
pub(crate) async fn json_only(request: Request, next: Next) -> Response {
    let media_type = (request.headers().get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim());
    if request.method() == Method::POST
        && !media_type.is_some_and(|t| t.eq_ignore_ascii_case("application/json"))
    {
        let got = media_type.map_or("none".to_string(), |t| format!("{t:?}"));
        let protocol = Protocol::of(request.uri().path());
        return ApiError::with_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "the request body must be JSON with Content-Type: application/json (got {got})"
            ),
        )
        .respond(protocol);
    }
    next.run(request).await
}

/// Whether `given` is `key`, in time that depends on neither: both are hashed first, so the
/// comparison (constant-time) sees equal lengths and leaks no prefix (vLLM's CVE-2025-59425
/// was a variable-time comparison of the key).
fn same_key(given: Option<&str>, key: &str) -> bool {
    let given = Sha256::digest(given.unwrap_or_default().as_bytes());
    let key = Sha256::digest(key.as_bytes());
    bool::from(given.as_slice().ct_eq(key.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_with_the_bound_port_or_none_are_served() {
        let allowed = [String::from("proxy.example")];
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "127.3.2.1",
            "[::1]:8080",
            "[::1]",
            "proxy.example",
            "proxy.example:443",
        ] {
            assert!(host_is_served(host, 8080, &allowed), "{host}");
        }
        for host in [
            "evil.example:8080",
            "localhost:8081",
            "127.0.0.1:80",
            "10.0.0.1:8080",
            "[::2]:8080",
            "localhost.evil.example",
            "[::1",
            "localhost:",
            "",
        ] {
            assert!(!host_is_served(host, 8080, &allowed), "{host}");
        }
        assert!(host_is_served("anything:1", 8080, &["*".into()]));
    }

    #[test]
    fn origins_are_scheme_and_host() {
        for ok in ["*", "http://localhost:3000", "https://app.example"] {
            assert!(is_origin(ok), "{ok}");
        }
        for bad in [
            "",
            "localhost:3000",
            "http://",
            "http://a.example/",
            "http://a/b",
        ] {
            assert!(!is_origin(bad), "{bad}");
        }
    }

    #[test]
    fn keys_compare_equal_only_when_equal() {
        assert!(same_key(Some("sesame"), "sesame"));
        for wrong in [
            None,
            Some(""),
            Some("sesam"),
            Some("sesame "),
            Some("Sesame"),
        ] {
            assert!(!same_key(wrong, "sesame"), "{wrong:?}");
        }
    }
}
