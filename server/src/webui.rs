//! The chat page at `/` (`--no-webui` turns it off): static files compiled into the binary,
//! so it works offline and with no CDN: the page, its script and style, its icon, and
//! markdown-it (a markdown parser, vendored from npm into `webui/vendor/` by
//! `webui/vendor.sh`, which also checks the copy against `webui/package-lock.json`). The page
//! talks to the server only through the public API (`/v1/models`, `/v1/chat/completions` with
//! server-sent events), as any client does, so it needs no route or privilege of its own.
//!
//! Its responses carry a strict Content-Security-Policy: scripts, styles and requests from
//! this origin only, no inline script, no framing by other pages (clickjacking). The API key,
//! when the server has one, is typed into the page and kept in the tab's `sessionStorage`
//! unless the person ticks "remember" (then `localStorage`).

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../webui/index.html");
const SCRIPT: &str = include_str!("../webui/app.js");
const STYLE: &str = include_str!("../webui/style.css");
const ICON: &str = include_str!("../webui/icon.svg");
const MARKDOWN_IT: &str = include_str!("../webui/vendor/markdown-it.min.js");

/// Only what the page's own files need: nothing inline, nothing from elsewhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page's routes, merged into the server's router when the page is on.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> axum::Router<S> {
    axum::Router::new()
        .route(
            "/",
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/webui/app.js",
            get(|| async { file("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/webui/style.css",
            get(|| async { file("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/webui/vendor/markdown-it.min.js",
            get(|| async { file("text/javascript; charset=utf-8", MARKDOWN_IT) }),
        )
        .route(
            "/webui/icon.svg",
            get(|| async { file("image/svg+xml", ICON) }),
        )
        // Asked for by browsers and tools that do not read the page's <link rel="icon">.
        .route(
            "/favicon.ico",
            get(|| async { file("image/svg+xml", ICON) }),
        )
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    let mut set = |name, value| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(header::CONTENT_TYPE, content_type);
    set(header::CONTENT_SECURITY_POLICY, POLICY);
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(header::X_FRAME_OPTIONS, "DENY");
    set(header::REFERRER_POLICY, "no-referrer");
    // The files change only with the binary: a browser checks again on each visit.
    set(header::CACHE_CONTROL, "no-cache");
    response
}
