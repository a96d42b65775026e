//! The request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by
//! field into what the engine runs. A field this server does not act on is refused by name
//! (400) rather than ignored: a client that asks for `n: 3` or tools must not get one plain
//! answer as if that were what it asked for.

use runtime::chat::Message;
use runtime::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Fields accepted and without effect here: metadata about the caller, or the default of a
/// feature this server does not have.
const HARMLESS: [&str; 3] = ["user", "metadata", "store"];

/// What either endpoint asks to generate, before its prompt is tokenized.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub model: Option<String>,
    /// Each generated token's log-probability, with this many alternatives: chat's
    /// `logprobs` and `top_logprobs`, completions' `logprobs`.
    pub logprobs: Option<usize>,
}

/// The prompt: a conversation for the chat template, or plain text.
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat(Vec<Message>),
    Text(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// Parses a `/v1/chat/completions` body.
pub fn chat(body: &[u8]) -> Result<Request, ApiError> {
    let mut fields = object(body)?;
    let messages: Vec<ChatMessage> = take(&mut fields, "messages")?
        .ok_or_else(|| ApiError::invalid_field("messages", "messages is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid_field("messages", "messages is empty"));
    }
    let messages = messages
        .into_iter()
        .map(message)
        .collect::<Result<Vec<_>, _>>()?;
    let max_tokens = match take::<usize>(&mut fields, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => take(&mut fields, "max_tokens")?,
    };
    let format: Option<Value> = take(&mut fields, "response_format")?;
    if let Some(format) = format
        && format.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::invalid_field(
            "response_format",
            "response_format other than {\"type\": \"text\"} is not supported",
        ));
    }
    let logprobs = take(&mut fields, "logprobs")?.unwrap_or(false);
    let top: Option<usize> = take(&mut fields, "top_logprobs")?;
    let logprobs = match (logprobs, top) {
        (_, Some(top)) if top > 20 => {
            return Err(ApiError::invalid_field(
                "top_logprobs",
                "top_logprobs must be in [0, 20]",
            ));
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid_field(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        (true, top) => Some(top.unwrap_or(0)),
        (false, None) => None,
    };
    for field in ["tools", "tool_choice", "functions", "function_call"] {
        if take::<Value>(&mut fields, field)?.is_some_and(|v| !v.is_null()) {
            return Err(unsupported(field));
        }
    }
    common(fields, Prompt::Chat(messages), max_tokens, logprobs)
}

/// Parses a `/v1/completions` body.
pub fn completion(body: &[u8]) -> Result<Request, ApiError> {
    let mut fields = object(body)?;
    let prompt: Value = take(&mut fields, "prompt")?
        .ok_or_else(|| ApiError::invalid_field("prompt", "prompt is required"))?;
    let prompt = match prompt {
        Value::String(text) => text,
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or_default().to_string()
        }
        _ => {
            return Err(ApiError::invalid_field(
                "prompt",
                "prompt must be a string (or a list of one string)",
            ));
        }
    };
    for field in ["echo", "suffix", "best_of"] {
        if take::<Value>(&mut fields, field)?.is_some_and(|v| !v.is_null() && v != false) {
            return Err(unsupported(field));
        }
    }
    let max_tokens = take(&mut fields, "max_tokens")?;
    let logprobs: Option<usize> = take(&mut fields, "logprobs")?;
    if logprobs.is_some_and(|n| n > 5) {
        return Err(ApiError::invalid_field(
            "logprobs",
            "logprobs must be in [0, 5]",
        ));
    }
    common(fields, Prompt::Text(prompt), max_tokens, logprobs)
}

/// The fields both endpoints share; refuses any left over.
fn common(
    mut fields: Map<String, Value>,
    prompt: Prompt,
    max_tokens: Option<usize>,
    logprobs: Option<usize>,
) -> Result<Request, ApiError> {
    let model = take(&mut fields, "model")?;
    let stream = take(&mut fields, "stream")?.unwrap_or(false);
    let options: Option<StreamOptions> = take(&mut fields, "stream_options")?;
    if options.is_some() && !stream {
        return Err(ApiError::invalid_field(
            "stream_options",
            "stream_options is only allowed with stream: true",
        ));
    }
    let include_usage = options.and_then(|o| o.include_usage).unwrap_or(false);
    let n: Option<u32> = take(&mut fields, "n")?;
    if n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_field(
            "n",
            "n other than 1 is not supported",
        ));
    }
    if take::<Value>(&mut fields, "logit_bias")?
        .is_some_and(|v| !(v.is_null() || v == Value::Object(Map::new())))
    {
        return Err(unsupported("logit_bias"));
    }
    for field in ["frequency_penalty", "presence_penalty"] {
        if take::<f64>(&mut fields, field)?.is_some_and(|v| v != 0.0) {
            return Err(unsupported(field));
        }
    }
    let stop = match take(&mut fields, "stop")? {
        None => Vec::new(),
        Some(Stop::One(stop)) => vec![stop],
        Some(Stop::Many(stops)) => stops,
    };
    if stop.len() > 4 || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_field(
            "stop",
            "stop takes up to 4 non-empty strings",
        ));
    }
    // OpenAI's defaults: temperature 1, top_p 1; no seed gives a fresh one.
    let sampling = SamplingParams {
        temperature: take(&mut fields, "temperature")?.unwrap_or(1.0),
        top_p: take(&mut fields, "top_p")?.unwrap_or(1.0),
        seed: take(&mut fields, "seed")?.unwrap_or_else(rand::random),
        ..SamplingParams::default()
    };
    if sampling.temperature > 2.0 {
        return Err(ApiError::invalid_field(
            "temperature",
            format!("temperature {} must be in [0, 2]", sampling.temperature),
        ));
    }
    sampling
        .validate()
        .map_err(|e| ApiError::invalid(e.replace("top-p", "top_p")))?;
    for field in HARMLESS {
        fields.remove(field);
    }
    if let Some(field) = fields.keys().next() {
        return Err(ApiError::invalid(format!("unknown field {field:?}")));
    }
    Ok(Request {
        prompt,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        model,
        logprobs,
    })
}

fn message(message: ChatMessage) -> Result<Message, ApiError> {
    if !matches!(
        message.role.as_str(),
        "system" | "developer" | "user" | "assistant"
    ) {
        return Err(ApiError::invalid_field(
            "messages",
            format!("message role {:?} is not supported", message.role),
        ));
    }
    let content = match message.content {
        None => String::new(),
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        return Err(ApiError::invalid_field(
                            "messages",
                            format!("content part of type {kind:?} is not supported"),
                        ));
                    }
                }
            }
            text
        }
    };
    // OpenAI's newer name for the system role; chat templates know "system".
    let role = match message.role.as_str() {
        "developer" => "system".to_string(),
        _ => message.role,
    };
    Ok(Message { role, content })
}

fn unsupported(field: &'static str) -> ApiError {
    ApiError::invalid_field(field, format!("{field} is not supported by this server"))
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::invalid("the body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

/// Removes `field` and reads it as `T`; `null` counts as absent.
fn take<T: serde::de::DeserializeOwned>(
    fields: &mut Map<String, Value>,
    field: &'static str,
) -> Result<Option<T>, ApiError> {
    match fields.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value)
            .map(Some)
            .map_err(|e| ApiError::invalid_field(field, format!("{field}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_error(body: &str) -> String {
        chat(body.as_bytes()).unwrap_err().message
    }

    #[test]
    fn chat_fields_are_read_and_unknown_ones_refused() {
        let request = chat(
            br#"{"model":"m","messages":[{"role":"system","content":"Be brief."},
               {"role":"user","content":[{"type":"text","text":"Hi"}]}],
               "max_completion_tokens":7,"temperature":0,"seed":5,"stop":"\n",
               "stream":true,"stream_options":{"include_usage":true},"user":"u"}"#,
        )
        .unwrap();
        let Prompt::Chat(messages) = &request.prompt else {
            panic!("a chat prompt")
        };
        assert_eq!(messages[1].content, "Hi");
        assert_eq!(request.max_tokens, Some(7));
        assert_eq!(request.sampling.temperature, 0.0);
        assert_eq!(request.sampling.seed, 5);
        assert_eq!(request.stop, ["\n"]);
        assert!(request.stream && request.include_usage);
        for (body, expected) in [
            (r#"{"messages":[]}"#, "messages is empty"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#,
                "n other than 1",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{}]}"#,
                "tools",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                "top_logprobs needs logprobs",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#,
                "top_logprobs must be in [0, 20]",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"colour":1}"#,
                "unknown field \"colour\"",
            ),
            (
                r#"{"messages":[{"role":"tool","content":"x"}]}"#,
                "role \"tool\"",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":-1}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"many"}"#,
                "max_tokens",
            ),
            (r#"[1]"#, "JSON object"),
            (r#"{"#, "not valid JSON"),
        ] {
            let message = chat_error(body);
            assert!(message.contains(expected), "{body}: {message}");
        }
    }
}
