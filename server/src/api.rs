//! The request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by
//! field into what the engine runs. A field this server does not act on is refused by name
//! (400) rather than ignored: a client that asks for `n: 3` or tools must not get one plain
//! answer as if that were what it asked for.

use runtime::chat::Message;
use runtime::grammar::Grammar;
use runtime::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Fields accepted and without effect here: metadata about the caller, or the default of a
/// feature this server does not have.
const HARMLESS: [&str; 3] = ["user", "metadata", "store"];

/// Most prompts one `/v1/completions` request may list (each is a choice, run as a request
/// of its own): one request must not queue an unbounded amount of work.
pub const MAX_PROMPTS: usize = 64;

/// What either endpoint asks to generate, before its prompt is tokenized.
#[derive(Debug, Clone)]
pub struct Request {
    /// `n` choices each: a chat has one; a completion lists one or more.
    pub prompts: Vec<Prompt>,
    /// At least 1 when given.
    pub max_tokens: Option<usize>,
    /// The field `max_tokens` came from (`max_tokens` or `max_completion_tokens`), for errors.
    pub max_tokens_param: &'static str,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub model: Option<String>,
    /// Each generated token's log-probability, with this many alternatives: chat's
    /// `logprobs` and `top_logprobs`, completions' `logprobs`.
    pub logprobs: Option<usize>,
    /// Kept caches are shared only between requests with the same salt (and API key), as
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<String>,
    /// Choices per prompt (OpenAI's `n`), each sampled with the request's seed plus its
    /// index; the prompt runs once.
    pub n: usize,
    /// What the answer must match (`response_format`), compiled by the HTTP side.
    pub grammar: Option<Grammar>,
}

/// The prompt: a conversation for the chat template, plain text, or token ids.
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat(Vec<Message>),
    Text(String),
    Ids(Vec<u32>),
}

impl Prompt {
    /// The request field that holds this prompt, for errors.
    pub fn param(&self) -> &'static str {
        match self {
            Prompt::Chat(_) => "messages",
            Prompt::Text(_) | Prompt::Ids(_) => "prompt",
        }
    }
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
    let max_tokens = chat_max_tokens(&mut fields)?;
    let grammar = response_format(take(&mut fields, "response_format")?)?;
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
    no_tool_calls(&mut fields, "tools", "tool_choice")?;
    no_tool_calls(&mut fields, "functions", "function_call")?;
    // Only how tool calls would be made, and there are none.
    take::<bool>(&mut fields, "parallel_tool_calls")?;
    let mut request = common(fields, vec![Prompt::Chat(messages)], max_tokens, logprobs)?;
    request.grammar = grammar;
    Ok(request)
}

/// OpenAI's `response_format`: `text`; `json_object` (any JSON object; with a `schema`, as
/// llama-server takes it, one valid against it); `json_schema` with `json_schema: {name,
/// schema, strict, description}`, the schema enforced whatever `strict` says.
fn response_format(format: Option<Value>) -> Result<Option<Grammar>, ApiError> {
    let invalid = |message: &str| ApiError::invalid_field("response_format", message);
    let Some(format) = format else {
        return Ok(None);
    };
    let schema = |value: Option<&Value>| match value {
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(schema.clone())),
        Some(_) => Err(invalid("response_format's schema must be a JSON object")),
        None => Ok(None),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match schema(format.get("schema"))? {
            Some(schema) => Grammar::JsonSchema(schema),
            None => Grammar::json_object(),
        })),
        Some("json_schema") => {
            let spec = (format.get("json_schema"))
                .ok_or_else(|| invalid("response_format json_schema needs a json_schema object"))?;
            match schema(spec.get("schema"))? {
                Some(schema) => Ok(Some(Grammar::JsonSchema(schema))),
                None => Err(invalid("response_format's json_schema needs a schema")),
            }
        }
        _ => Err(invalid(
            "response_format's type must be text, json_object or json_schema",
        )),
    }
}

/// Chat's length limit: `max_completion_tokens`, or its older name `max_tokens`. Both may be
/// given (some clients send both) but must then agree.
fn chat_max_tokens(
    fields: &mut Map<String, Value>,
) -> Result<Option<(usize, &'static str)>, ApiError> {
    let new = take::<usize>(fields, "max_completion_tokens")?;
    let old = take::<usize>(fields, "max_tokens")?;
    match (new, old) {
        (Some(new), Some(old)) if new != old => Err(ApiError::invalid_field(
            "max_tokens",
            format!(
                "max_tokens ({old}) and max_completion_tokens ({new}) differ; give one of them"
            ),
        )),
        (Some(n), _) => Ok(Some((n, "max_completion_tokens"))),
        (None, Some(n)) => Ok(Some((n, "max_tokens"))),
        (None, None) => Ok(None),
    }
}

/// Refuses a request that lets the model call tools (or the older functions): this server
/// only generates text. Tools offered with `tool_choice: "none"` ask for text, and are
/// ignored; so is `tool_choice: "auto"` with no tools.
fn no_tool_calls(
    fields: &mut Map<String, Value>,
    tools: &'static str,
    choice: &'static str,
) -> Result<(), ApiError> {
    let offered = take::<Value>(fields, tools)?;
    let choice_value = take::<Value>(fields, choice)?;
    if choice_value.as_ref().is_some_and(|c| c == "none") {
        return Ok(());
    }
    if offered.is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(unsupported(tools));
    }
    if choice_value.is_some_and(|c| c != "auto") {
        return Err(unsupported(choice));
    }
    Ok(())
}

/// Parses a `/v1/completions` body.
pub fn completion(body: &[u8]) -> Result<Request, ApiError> {
    let mut fields = object(body)?;
    let prompt: Value = take(&mut fields, "prompt")?
        .ok_or_else(|| ApiError::invalid_field("prompt", "prompt is required"))?;
    let prompts = completion_prompts(prompt)?;
    for field in ["echo", "suffix"] {
        if take::<Value>(&mut fields, field)?.is_some_and(|v| v != false) {
            return Err(unsupported(field));
        }
    }
    // One sample per choice is `best_of: 1`, what is done anyway.
    if take::<u64>(&mut fields, "best_of")?.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_field(
            "best_of",
            "best_of other than 1 is not supported",
        ));
    }
    let max_tokens = take(&mut fields, "max_tokens")?.map(|n| (n, "max_tokens"));
    let logprobs: Option<usize> = take(&mut fields, "logprobs")?;
    if logprobs.is_some_and(|n| n > 5) {
        return Err(ApiError::invalid_field(
            "logprobs",
            "logprobs must be in [0, 5]",
        ));
    }
    common(fields, prompts, max_tokens, logprobs)
}

/// The completions API's `prompt`: a string, a list of token ids, or a list of either (one
/// choice each).
fn completion_prompts(prompt: Value) -> Result<Vec<Prompt>, ApiError> {
    let malformed = || {
        ApiError::invalid_field(
            "prompt",
            "prompt must be a string, a list of token ids, or a list of strings or of lists of token ids",
        )
    };
    let one = |value: Value| match value {
        Value::String(text) => Ok(Prompt::Text(text)),
        Value::Array(ids) => token_ids(ids).map(Prompt::Ids),
        _ => Err(malformed()),
    };
    let prompts = match prompt {
        Value::Array(items) if items.first().is_some_and(Value::is_number) => {
            vec![Prompt::Ids(token_ids(items)?)]
        }
        Value::Array(items) => items.into_iter().map(one).collect::<Result<_, _>>()?,
        other => vec![one(other)?],
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid_field("prompt", "the prompt is empty"));
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid_field(
            "prompt",
            format!(
                "{} prompts in one request; at most {MAX_PROMPTS}",
                prompts.len()
            ),
        ));
    }
    Ok(prompts)
}

/// A list of token ids (each checked against the vocabulary once the tokenizer is at hand).
fn token_ids(items: Vec<Value>) -> Result<Vec<u32>, ApiError> {
    items
        .into_iter()
        .map(|item| {
            serde_json::from_value::<u32>(item.clone())
                .map_err(|_| ApiError::invalid_field("prompt", format!("{item} is not a token id")))
        })
        .collect()
}

/// The fields both endpoints share; refuses any left over.
fn common(
    mut fields: Map<String, Value>,
    prompts: Vec<Prompt>,
    max_tokens: Option<(usize, &'static str)>,
    logprobs: Option<usize>,
) -> Result<Request, ApiError> {
    if let Some((0, param)) = max_tokens {
        // OpenAI and vLLM refuse it too: there would be nothing to generate.
        return Err(ApiError::invalid_field(
            param,
            format!("{param} must be at least 1"),
        ));
    }
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
    let n: usize = take(&mut fields, "n")?.unwrap_or(1);
    if n == 0 {
        return Err(ApiError::invalid_field("n", "n must be at least 1"));
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
    let sampling = sampling(&mut fields)?;
    let cache_salt: Option<String> = take(&mut fields, "cache_salt")?;
    if cache_salt.as_ref().is_some_and(String::is_empty) {
        return Err(ApiError::invalid_field(
            "cache_salt",
            "cache_salt must not be empty",
        ));
    }
    for field in HARMLESS {
        fields.remove(field);
    }
    if let Some(field) = fields.keys().next() {
        return Err(ApiError::invalid(format!("unknown field {field:?}")));
    }
    Ok(Request {
        prompts,
        max_tokens: max_tokens.map(|(n, _)| n),
        max_tokens_param: max_tokens.map_or("max_tokens", |(_, param)| param),
        sampling,
        stop,
        stream,
        include_usage,
        model,
        logprobs,
        cache_salt,
        n,
        grammar: None,
    })
}

/// `temperature`, `top_p`, `presence_penalty`, `frequency_penalty`, `logit_bias` and `seed`,
/// each checked by name. OpenAI's defaults: temperature 1, top_p 1, no penalty or bias; no
/// seed gives a fresh one. `logit_bias`'s ids are checked against the vocabulary once the
/// tokenizer is at hand.
fn sampling(fields: &mut Map<String, Value>) -> Result<SamplingParams, ApiError> {
    let temperature: f32 = take(fields, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid_field(
            "temperature",
            format!("temperature {temperature} must be in [0, 2]"),
        ));
    }
    let top_p: f32 = take(fields, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_field(
            "top_p",
            format!("top_p {top_p} must be in (0, 1]"),
        ));
    }
    let mut penalty = |field: &'static str| -> Result<f32, ApiError> {
        let value: f32 = take(fields, field)?.unwrap_or(0.0);
        if !(-2.0..=2.0).contains(&value) {
            return Err(ApiError::invalid_field(
                field,
                format!("{field} {value} must be in [-2, 2]"),
            ));
        }
        Ok(value)
    };
    let presence_penalty = penalty("presence_penalty")?;
    let frequency_penalty = penalty("frequency_penalty")?;
    let sampling = SamplingParams {
        temperature,
        top_p,
        presence_penalty,
        frequency_penalty,
        logit_bias: logit_bias(fields)?,
        seed: seed(fields)?.unwrap_or_else(rand::random),
        ..SamplingParams::default()
    };
    // Whatever else the sampler refuses (nothing the checks above let through, today).
    sampling.validate().map_err(ApiError::invalid)?;
    Ok(sampling)
}

/// `logit_bias`: an object from token ids (as strings, JSON's keys) to biases in [-100,
/// 100], in id order.
fn logit_bias(fields: &mut Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bias: Map<String, Value> = take(fields, "logit_bias")?.unwrap_or_default();
    let invalid = |message: String| ApiError::invalid_field("logit_bias", message);
    let mut biases = (bias.into_iter())
        .map(|(id, value)| {
            let id: u32 = (id.parse())
                .map_err(|_| invalid(format!("logit_bias key {id:?} is not a token id")))?;
            let bias = (value.as_f64())
                .filter(|bias| (-100.0..=100.0).contains(bias))
                .ok_or_else(|| {
                    invalid(format!(
                        "logit_bias {value} for token {id} must be a number in [-100, 100]"
                    ))
                })?;
            Ok((id, bias as f32))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    biases.sort_by_key(|&(id, _)| id);
    Ok(biases)
}

/// `seed`: OpenAI's spec makes it an int64, so negative seeds are seeds too (taken as
/// their two's complement); an unsigned 64-bit one is accepted as well.
fn seed(fields: &mut Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match take::<Value>(fields, "seed")? {
        None => Ok(None),
        Some(value) => (value.as_u64())
            .or_else(|| value.as_i64().map(|n| n as u64))
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid_field("seed", format!("seed {value} is not a 64-bit integer"))
            }),
    }
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
        let [Prompt::Chat(messages)] = &request.prompts[..] else {
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
                r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#,
                "n must be at least 1",
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

    /// A field's error names it in `param`.
    fn param_of(result: Result<Request, ApiError>) -> Option<&'static str> {
        result.unwrap_err().param
    }

    fn chat_with(extra: &str) -> Result<Request, ApiError> {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}]{extra}}}"#);
        chat(body.as_bytes())
    }

    fn completion_with(prompt: &str, extra: &str) -> Result<Request, ApiError> {
        completion(format!(r#"{{"prompt":{prompt}{extra}}}"#).as_bytes())
    }

    #[test]
    fn out_of_range_fields_are_named() {
        for (extra, param) in [
            (r#","max_tokens":0"#, "max_tokens"),
            (r#","max_completion_tokens":0"#, "max_completion_tokens"),
            (r#","temperature":-1"#, "temperature"),
            (r#","temperature":2.5"#, "temperature"),
            (r#","top_p":0"#, "top_p"),
            (r#","top_p":1.5"#, "top_p"),
            (r#","seed":1.5"#, "seed"),
            (r#","seed":"7""#, "seed"),
            (r#","max_tokens":5,"max_completion_tokens":6"#, "max_tokens"),
            (r#","cache_salt":"""#, "cache_salt"),
            (r#","cache_salt":7"#, "cache_salt"),
        ] {
            assert_eq!(param_of(chat_with(extra)), Some(param), "{extra}");
        }
        assert_eq!(
            param_of(completion_with(r#""x""#, r#","max_tokens":0"#)),
            Some("max_tokens")
        );
        assert_eq!(
            param_of(completion_with(r#""x""#, r#","best_of":2"#)),
            Some("best_of")
        );
    }

    #[test]
    fn what_openai_allows_is_accepted() {
        // Both length fields, agreeing; the int64 seeds of OpenAI's spec, negative ones too.
        let request = chat_with(r#","max_tokens":9,"max_completion_tokens":9,"seed":-1"#).unwrap();
        assert_eq!(request.max_tokens, Some(9));
        assert_eq!(request.sampling.seed, u64::MAX);
        let request = chat_with(r#","max_tokens":3,"seed":18446744073709551615"#).unwrap();
        assert_eq!(request.max_tokens_param, "max_tokens");
        assert_eq!(request.sampling.seed, u64::MAX);
        assert_eq!(
            chat_with(r#","max_completion_tokens":4"#)
                .unwrap()
                .max_tokens_param,
            "max_completion_tokens"
        );
        // Tools the request says not to call; no tools and the default choice.
        let tools = r#","tools":[{"type":"function","function":{"name":"f"}}]"#;
        chat_with(&format!(
            r#"{tools},"tool_choice":"none","parallel_tool_calls":false"#
        ))
        .unwrap();
        chat_with(r#","tools":[],"tool_choice":"auto""#).unwrap();
        chat_with(r#","functions":[{"name":"f"}],"function_call":"none""#).unwrap();
        assert_eq!(param_of(chat_with(tools)), Some("tools"));
        let required = format!(r#"{tools},"tool_choice":"required""#);
        assert_eq!(param_of(chat_with(&required)), Some("tools"));
        let choice = r#","tool_choice":{"type":"function","function":{"name":"f"}}"#;
        assert_eq!(param_of(chat_with(choice)), Some("tool_choice"));
        // best_of 1 is what happens anyway; a salt is kept.
        completion_with(r#""x""#, r#","best_of":1"#).unwrap();
        let salted = chat_with(r#","cache_salt":"tenant-7""#).unwrap();
        assert_eq!(salted.cache_salt.as_deref(), Some("tenant-7"));
    }

    #[test]
    fn completion_prompts_are_strings_or_token_ids() {
        let prompts = |prompt: &str| completion_with(prompt, "").map(|r| r.prompts);
        let [Prompt::Text(text)] = &prompts(r#""Once""#).unwrap()[..] else {
            panic!("one text")
        };
        assert_eq!(text, "Once");
        let [Prompt::Ids(ids)] = &prompts("[1, 2, 3]").unwrap()[..] else {
            panic!("one id list")
        };
        assert_eq!(ids, &[1, 2, 3]);
        let several = prompts(r#"["a", "b", "c"]"#).unwrap();
        assert_eq!(several.len(), 3);
        assert!(several.iter().all(|p| matches!(p, Prompt::Text(_))));
        let lists = prompts("[[1], [2, 3]]").unwrap();
        assert!(
            matches!(&lists[..], [Prompt::Ids(a), Prompt::Ids(b)] if a == &[1] && b == &[2, 3])
        );
        assert_eq!(lists[0].param(), "prompt");
        let too_many = format!("[{}]", vec![r#""x""#; MAX_PROMPTS + 1].join(","));
        for (prompt, expected) in [
            ("[]", "empty"),
            ("42", "prompt must be"),
            (r#"{"a":1}"#, "prompt must be"),
            ("[-1]", "-1 is not a token id"),
            ("[4294967296]", "is not a token id"),
            (r#"[1, "a"]"#, "is not a token id"),
            (r#"["a", 1]"#, "prompt must be"),
            (r#"["a", ["b"]]"#, "is not a token id"),
            (&too_many, "at most 64"),
        ] {
            let error = completion_with(prompt, "").unwrap_err();
            assert_eq!(error.param, Some("prompt"), "{prompt}");
            assert!(
                error.message.contains(expected),
                "{prompt}: {}",
                error.message
            );
        }
    }
}
