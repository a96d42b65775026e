//! Errors as OpenAI's API returns them: a status and `{"error": {"message", "type", "param",
//! "code"}}`, which its client libraries turn into their typed exceptions.

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

/// `Retry-After` of a 429: a second, about what a slot takes to free while requests are
/// short, and soon enough for a client polling a busy server; OpenAI's Python client waits
/// what it says before its next attempt.
pub const RETRY_AFTER_SECONDS: u64 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            (response.headers_mut()).insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
        }
        response
    }
}
