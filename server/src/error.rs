//! Errors as OpenAI's API returns them: a status and `{"error": {"message", "type", "param",
//! "code"}}`, which its client libraries turn into their typed exceptions; or, on Anthropic's
//! routes, as Anthropic's does: `{"type": "error", "error": {"type", "message"}}`. The path
//! decides ([`Protocol::of`]), so that errors raised before routing (the guard's 401, 403,
//! 413, 415) come in the envelope the route's clients read.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request that cannot be served, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// OpenAI's `code` where it is not the one the status implies.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for what is not supported.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::with_status(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_field(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::invalid(message)
        }
    }

    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 `context_length_exceeded`, naming the field to shorten: the prompt (`messages`,
    /// `prompt`) or the tokens asked for (`max_tokens`), as OpenAI answers.
    pub fn context_length(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            ..Self::invalid_field(param, message)
        }
    }

    /// 404 `model_not_found`: the request names a model this server does not serve.
    pub fn model_not_found(model: &str, served: &str) -> Self {
        Self {
            param: Some("model"),
            code: Some("model_not_found"),
            ..Self::with_status(
                StatusCode::NOT_FOUND,
                format!("the model {model:?} does not exist; this server serves {served:?}"),
            )
        }
    }

    /// 429 `rate_limit_exceeded`: `max_queue` requests already wait for a slot
    /// (`--max-queue`); the response says when to retry ([`RETRY_AFTER_SECONDS`]).
    pub fn queue_full(max_queue: usize) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            ..Self::with_status(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the server is busy: {max_queue} requests already wait for a free slot (--max-queue {max_queue}); retry later"
                ),
            )
        }
    }

    /// OpenAI's `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            // What OpenAI's 429 for too many requests says.
            StatusCode::TOO_MANY_REQUESTS => "requests",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            status if status.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's `code`: the error's own, else the one it has for the status.
    fn code(&self) -> Option<&'static str> {
        if self.code.is_some() {
            return self.code;
        }
        match self.status {
            StatusCode::UNAUTHORIZED => Some("invalid_api_key"),
            StatusCode::PAYLOAD_TOO_LARGE => Some("request_too_large"),
            _ => None,
        }
    }

    /// The body, `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code(),
            }
        })
    }
}

/// Whose API a route speaks, for the envelope of its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    OpenAi,
    Anthropic,
}

impl Protocol {
    /// Anthropic's for `/v1/messages` and the paths under it; OpenAI's for every other.
    pub fn of(path: &str) -> Self {
        match path.strip_prefix("/v1/messages") {
            Some("") => Protocol::Anthropic,
            Some(rest) if rest.starts_with('/') => Protocol::Anthropic,
            _ => Protocol::OpenAi,
        }
    }
}

impl ApiError {
    /// The error as a response in `protocol`'s envelope.
    pub fn respond(self, protocol: Protocol) -> Response {
        match protocol {
            Protocol::OpenAi => self.into_response(),
            Protocol::Anthropic => {
                let response = (self.status, Json(self.anthropic_body())).into_response();
                with_retry_after(response)
            }
        }
    }

    /// Anthropic's body: `{"type": "error", "error": {"type", "message"}}`, the type its
    /// clients map to their exceptions, from the status.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            // Loading or shutting down: what Anthropic says when it cannot take the request.
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            status if status.is_server_error() => "api_error",
            _ => "invalid_request_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": self.message}})
    }
}

/// `Retry-After` of a 429: a second, about what a slot takes to free while requests are
/// short, and soon enough for a client polling a busy server; OpenAI's Python client waits
/// what it says before its next attempt.
pub const RETRY_AFTER_SECONDS: u64 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        with_retry_after((self.status, Json(self.body())).into_response())
    }
}

/// A 429 says when to retry.
fn with_retry_after(mut response: Response) -> Response {
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        (response.headers_mut()).insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropics_routes_are_told_by_their_path() {
        for path in [
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/messages/x",
        ] {
            assert_eq!(Protocol::of(path), Protocol::Anthropic, "{path}");
        }
        for path in [
            "/v1/chat/completions",
            "/v1/messagesx",
            "/v1/models",
            "/messages",
        ] {
            assert_eq!(Protocol::of(path), Protocol::OpenAi, "{path}");
        }
        let body = ApiError::with_status(StatusCode::UNAUTHORIZED, "no").anthropic_body();
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "authentication_error", "message": "no"}})
        );
    }
}
