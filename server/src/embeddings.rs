//! `POST /v1/embeddings`, as OpenAI's API takes it: `input` a string, a list of strings, a
//! list of token ids or a list of lists of them (at most [`MAX_INPUTS`]); `encoding_format`
//! `float` (lists of numbers) or `base64` (each vector's little-endian f32 bytes, what
//! OpenAI's client asks for by default and decodes); `dimensions` where the model lists
//! sizes its embeddings may be cut to (`matryoshka_dimensions`), or its full size.
//!
//! The texts are tokenized here (the tokenizer's post-processor adds its special tokens, as
//! sentence-transformers' tokenizing does), checked (non-empty, within the context), and
//! handed to the engine as one job (`engine::Work::Embed`), which runs them between its
//! decoding steps on the one model. A model that generates embeds too, with its default
//! pooling (the last token's hidden state, normalized), as vLLM serves one.

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::Loaded;
use crate::api;
use crate::engine::{EmbedJob, Work};
use crate::error::ApiError;
use crate::routes::{QueuePlaces, State, check_model, in_vocabulary, ready};

/// Most inputs in one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

pub(crate) fn routes() -> Router<State> {
    Router::new().route("/v1/embeddings", post(embeddings))
}

/// How the vectors are written in the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Encoding {
    Float,
    Base64,
}

/// A parsed request.
#[derive(Debug, PartialEq)]
struct Request {
    inputs: Inputs,
    encoding: Encoding,
    dimensions: Option<usize>,
    model: Option<String>,
}

/// `input`: texts, or token ids.
#[derive(Debug, PartialEq)]
enum Inputs {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

async fn embeddings(Extract(state): Extract<State>, body: Bytes) -> Response {
    match embed(state, body).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn embed(state: State, body: Bytes) -> Result<Value, ApiError> {
    let request = parse(&body)?;
    check_model(&state, request.model.as_deref())?;
    check_dimensions(ready(&state)?, request.dimensions)?;
    QueuePlaces::check(&state.metrics, state.options.max_queue)?;
    // Tokenizing is CPU work: off the async threads, and off the engine's.
    let tokenizing = state.clone();
    let inputs = request.inputs;
    let inputs = tokio::task::spawn_blocking(move || tokenize(&tokenizing, inputs))
        .await
        .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = EmbedJob {
        inputs,
        dimensions: request.dimensions,
        reply,
    };
    let mut places = QueuePlaces::take(&state.metrics, 1, state.options.max_queue)?;
    if state.jobs.send(Work::Embed(job)).is_err() {
        return Err(shutting_down());
    }
    places.hand_over();
    drop(places);
    let vectors = match answer.await {
        Ok(Ok(vectors)) => vectors,
        Ok(Err(e)) => return Err(ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, e)),
        Err(_) => return Err(shutting_down()),
    };
    let data: Vec<Value> = (vectors.iter().enumerate())
        .map(|(index, vector)| {
            json!({"object": "embedding", "index": index, "embedding": encode(vector, request.encoding)})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": state.options.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

fn shutting_down() -> ApiError {
    ApiError::with_status(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is shutting down",
    )
}

/// The body's fields; any other is refused by name.
fn parse(body: &[u8]) -> Result<Request, ApiError> {
    let mut fields = api::object(body)?;
    let input: Value = api::take(&mut fields, "input")?
        .ok_or_else(|| ApiError::invalid_field("input", "input is required"))?;
    let inputs = inputs(input)?;
    let model = api::take::<String>(&mut fields, "model")?;
    let encoding = match api::take::<String>(&mut fields, "encoding_format")?.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::invalid_field(
                "encoding_format",
                format!("encoding_format {other:?} is not supported: \"float\" or \"base64\""),
            ));
        }
    };
    let dimensions = api::take::<usize>(&mut fields, "dimensions")?;
    if dimensions == Some(0) {
        return Err(ApiError::invalid_field(
            "dimensions",
            "dimensions must be at least 1",
        ));
    }
    // OpenAI's end-user id: nothing to do with it here.
    api::take::<String>(&mut fields, "user")?;
    if let Some(field) = fields.keys().next() {
        return Err(ApiError::invalid(format!("unknown field {field:?}")));
    }
    Ok(Request {
        inputs,
        encoding,
        dimensions,
        model,
    })
}

/// `input`: a string, a list of token ids, or a list of strings or of lists of token ids
/// (not both), 1 to [`MAX_INPUTS`] of them, none empty.
fn inputs(input: Value) -> Result<Inputs, ApiError> {
    let malformed = || {
        ApiError::invalid_field(
            "input",
            "input must be a string, a list of token ids, or a list of strings or of lists of token ids",
        )
    };
    let empty = |i: usize| ApiError::invalid_field("input", format!("input {i} is empty"));
    let items = match input {
        Value::String(text) => vec![Value::String(text)],
        Value::Array(items) if items.first().is_some_and(Value::is_number) => {
            vec![Value::Array(items)]
        }
        Value::Array(items) => items,
        _ => return Err(malformed()),
    };
    if items.is_empty() {
        return Err(ApiError::invalid_field("input", "input is an empty list"));
    }
    if items.len() > MAX_INPUTS {
        return Err(ApiError::invalid_field(
            "input",
            format!(
                "{} inputs in one request; at most {MAX_INPUTS}",
                items.len()
            ),
        ));
    }
    let texts = items.iter().all(Value::is_string);
    let inputs = if texts {
        let texts: Vec<String> = (items.into_iter())
            .map(|item| item.as_str().unwrap_or_default().to_string())
            .collect();
        if let Some(i) = texts.iter().position(String::is_empty) {
            return Err(empty(i));
        }
        Inputs::Texts(texts)
    } else {
        let ids = (items.into_iter())
            .map(|item| match item {
                Value::Array(ids) => token_ids(ids),
                _ => Err(malformed()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(i) = ids.iter().position(Vec::is_empty) {
            return Err(empty(i));
        }
        Inputs::Ids(ids)
    };
    Ok(inputs)
}

/// A list of token ids (checked against the vocabulary once the tokenizer is at hand).
fn token_ids(items: Vec<Value>) -> Result<Vec<u32>, ApiError> {
    (items.into_iter())
        .map(|item| {
            serde_json::from_value::<u32>(item.clone())
                .map_err(|_| ApiError::invalid_field("input", format!("{item} is not a token id")))
        })
        .collect()
}

/// 400 naming `dimensions` unless the model's embeddings may be cut to that size.
fn check_dimensions(loaded: &Loaded, dimensions: Option<usize>) -> Result<(), ApiError> {
    let (pooling, hidden) = (&loaded.pooling, loaded.hidden_size);
    match dimensions {
        Some(d) if !pooling.allows(d, hidden) => Err(ApiError::invalid_field(
            "dimensions",
            match pooling.matryoshka_dimensions.is_empty() {
                true => format!(
                    "dimensions {d} is not supported: this model's embeddings have {hidden} and it lists no shorter sizes they may be cut to (matryoshka_dimensions)"
                ),
                false => format!(
                    "dimensions {d} is not supported: this model's embeddings have {hidden}, or may be cut to {:?} (matryoshka_dimensions)",
                    pooling.matryoshka_dimensions
                ),
            },
        )),
        _ => Ok(()),
    }
}

/// Every input's token ids: texts through the tokenizer (its special tokens added), ids
/// checked against the vocabulary; each must fit the context.
fn tokenize(state: &State, inputs: Inputs) -> Result<Vec<Vec<u32>>, ApiError> {
    let loaded = ready(state)?;
    let tokenizer = &loaded.tokenizer;
    let ids = match inputs {
        Inputs::Texts(texts) => (texts.iter())
            .map(|text| tokenizer.encode(text))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::invalid_field("input", e.to_string()))?,
        Inputs::Ids(ids) => {
            in_vocabulary(tokenizer, "input", ids.iter().flatten().copied())?;
            ids
        }
    };
    for (i, ids) in ids.iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::invalid_field(
                "input",
                format!("input {i} has no tokens"),
            ));
        }
        if ids.len() > loaded.context {
            return Err(ApiError::context_length(
                "input",
                format!(
                    "input {i} has {} tokens; this model's context holds {} (max_position_embeddings)",
                    ids.len(),
                    loaded.context
                ),
            ));
        }
    }
    Ok(ids)
}

/// A vector as the answer carries it: numbers, or its little-endian f32 bytes in base64.
fn encode(vector: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => vector.iter().map(|&v| json!(v)).collect(),
        Encoding::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
            base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(body: &str) -> ApiError {
        parse(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn reads_every_form_of_input() {
        let texts = |list: &[&str]| Inputs::Texts(list.iter().map(|t| t.to_string()).collect());
        let cases = [
            (r#""a b""#, texts(&["a b"])),
            (r#"["a", "b"]"#, texts(&["a", "b"])),
            (r#"[1, 2, 3]"#, Inputs::Ids(vec![vec![1, 2, 3]])),
            (r#"[[1], [2, 3]]"#, Inputs::Ids(vec![vec![1], vec![2, 3]])),
        ];
        for (input, expected) in cases {
            let body = format!(r#"{{"input": {input}, "model": "m", "user": "u"}}"#);
            let request = parse(body.as_bytes()).unwrap();
            assert_eq!(request.inputs, expected, "{input}");
            assert_eq!(request.encoding, Encoding::Float);
        }
        let body = r#"{"input": "a", "encoding_format": "base64", "dimensions": 16}"#;
        let request = parse(body.as_bytes()).unwrap();
        assert_eq!(
            (request.encoding, request.dimensions),
            (Encoding::Base64, Some(16))
        );
    }

    /// Each malformed request is a 400 naming its field.
    #[test]
    fn refuses_malformed_requests_naming_the_field() {
        let many = format!(r#"{{"input": {:?}}}"#, vec!["a"; MAX_INPUTS + 1]);
        for (body, param, said) in [
            (r#"{"input": ""}"#, Some("input"), "input 0 is empty"),
            (r#"{"input": ["a", ""]}"#, Some("input"), "input 1 is empty"),
            (r#"{"input": [[1], []]}"#, Some("input"), "input 1 is empty"),
            (r#"{"input": []}"#, Some("input"), "empty list"),
            (
                r#"{"input": ["a", [1]]}"#,
                Some("input"),
                "must be a string",
            ),
            (r#"{"input": [-1]}"#, Some("input"), "not a token id"),
            (r#"{"input": 5}"#, Some("input"), "must be a string"),
            (r#"{}"#, Some("input"), "required"),
            (&many, Some("input"), "at most 2048"),
            (
                r#"{"input": "a", "encoding_format": "int8"}"#,
                Some("encoding_format"),
                "\"int8\"",
            ),
            (
                r#"{"input": "a", "dimensions": 0}"#,
                Some("dimensions"),
                "at least 1",
            ),
            (
                r#"{"input": "a", "dimensions": -3}"#,
                Some("dimensions"),
                "dimensions",
            ),
            (
                r#"{"input": "a", "colour": 1}"#,
                None,
                "unknown field \"colour\"",
            ),
        ] {
            let e = error(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param, param, "{body}: {}", e.message);
            assert!(e.message.contains(said), "{body}: {}", e.message);
        }
    }

    /// base64 is the vector's little-endian f32 bytes, as OpenAI's client decodes it
    /// (`np.frombuffer(base64.b64decode(s), dtype="float32")`).
    #[test]
    fn base64_is_little_endian_f32() {
        let encoded = encode(&[1.0, -2.5], Encoding::Base64);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap();
        assert_eq!(bytes, [0, 0, 128, 63, 0, 0, 32, 192]);
    }
}
