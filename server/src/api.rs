//! The request bodies of `/v1/chat/completions` and `/v1/completions`, checked field by
//! field into what the engine runs. A field this server does not act on is refused by name
//! (400) rather than ignored: a client that asks for `n: 3` or tools must not get one plain
//! answer as if that were what it asked for.

use runtime::generate::sampling::SamplingParams;
use runtime::text::chat::{Arguments, FunctionCall, Message, ToolCall};
use runtime::text::grammar::Grammar;
use runtime::text::tools::{Format, Tool};
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
    /// llama-server's `speculative.n_max`: most tokens drafted at once for this request
    /// (0: none), where the server drafts (`runtime serve --draft`).
    pub draft_limit: Option<usize>,
    /// Choices per prompt (OpenAI's `n`), each sampled with the request's seed plus its
    /// index; the prompt runs once.
    pub n: usize,
    /// What the answer must match (`response_format`), compiled by the HTTP side.
    pub grammar: Option<Grammar>,
    /// The request field `grammar` came from, for errors: `response_format`, or the
    /// Responses API's `text`.
    pub format_param: &'static str,
    /// The tools offered to a chat, if any.
    pub tools: Option<Tools>,
    /// Further variables for the chat template (`chat_template_kwargs`).
    pub template_kwargs: Map<String, Value>,
    /// `max_tokens` is a bound that the room left in the context lowers (Anthropic's
    /// reading), rather than a length refused when it does not fit (OpenAI's).
    pub fit_context: bool,
}

/// Most tools one request may offer (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// The tools a chat offers and how the model may use them.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The `tools` objects as sent, for the chat template.
    pub offered: Vec<Value>,
    /// Each tool's name and parameters' schema, in order.
    pub functions: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: whether a forced answer may call several tools.
    pub parallel: bool,
}

impl Tools {
    /// The grammar that makes a model writing calls in `format` call a tool, for
    /// `tool_choice` `required` or a named function; none for `auto` and `none`.
    pub fn grammar(&self, format: Format) -> Option<Grammar> {
        match &self.choice {
            ToolChoice::Required => Some(format.grammar(&self.functions, self.parallel)),
            ToolChoice::Function(name) => {
                let only: Vec<Tool> = (self.functions.iter())
                    .filter(|f| f.name == *name)
                    .cloned()
                    .collect();
                Some(format.grammar(&only, false))
            }
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Text only: the tools are in the prompt (earlier turns may have used them), and the
    /// answer is not read for calls.
    None,
    /// The model's choice: its answer is read for calls.
    Auto,
    /// At least one call, of any tool, enforced by a grammar.
    Required,
    /// A call of this tool, enforced by a grammar.
    Function(String),
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
    tool_calls: Option<Vec<SentCall>>,
    tool_call_id: Option<String>,
}

/// A call an earlier assistant turn made, as OpenAI sends it back: its arguments a string.
#[derive(Deserialize)]
struct SentCall {
    id: String,
    function: SentFunction,
}

#[derive(Deserialize)]
struct SentFunction {
    name: String,
    arguments: String,
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
    let grammar = response_format(take(&mut fields, "response_format")?, "response_format")?;
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
    let tools = tools(&mut fields)?;
    no_tool_calls(&mut fields, "functions", "function_call")?;
    format_with_tools(grammar.as_ref(), tools.as_ref(), "response_format")?;
    let template_kwargs = take(&mut fields, "chat_template_kwargs")?.unwrap_or_default();
    let mut request = common(fields, vec![Prompt::Chat(messages)], max_tokens, logprobs)?;
    request.grammar = grammar;
    request.tools = tools;
    request.template_kwargs = template_kwargs;
    Ok(request)
}

/// `tools`, `tool_choice` and `parallel_tool_calls`: `None` when no tool is offered (an
/// empty list offers none), where `tool_choice` may only be `none` or `auto`.
pub(crate) fn tools(fields: &mut Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let offered: Vec<Value> = take(fields, "tools")?.unwrap_or_default();
    let choice = take::<Value>(fields, "tool_choice")?;
    let parallel = take(fields, "parallel_tool_calls")?.unwrap_or(true);
    let invalid = |message: String| ApiError::invalid_field("tools", format!("tools: {message}"));
    if offered.len() > MAX_TOOLS {
        return Err(invalid(format!(
            "{} tools; at most {MAX_TOOLS}",
            offered.len()
        )));
    }
    let mut functions: Vec<Tool> = Vec::with_capacity(offered.len());
    for tool in &offered {
        let function = match (tool.get("type"), tool.get("function")) {
            (Some(kind), Some(function)) if kind == "function" => function,
            _ => {
                return Err(invalid(
                    "each tool must be {\"type\": \"function\", \"function\": {...}}".into(),
                ));
            }
        };
        let name = (function.get("name").and_then(Value::as_str))
            .filter(|name| valid_name(name))
            .ok_or_else(|| {
                invalid("each function needs a name of 1 to 64 letters, digits, _ or -".into())
            })?;
        if functions.iter().any(|f| f.name == name) {
            return Err(invalid(format!("two tools are named {name:?}")));
        }
        // Arguments are an object: a schema that does not say so (`{}`) is taken as one.
        // No `parameters` is OpenAI's "empty parameter list": `{}` and nothing else.
        let parameters = match function.get("parameters") {
            None => serde_json::json!({
                "type": "object", "properties": {}, "additionalProperties": false
            }),
            Some(Value::Object(schema)) => match schema.get("type") {
                None => {
                    let mut schema = schema.clone();
                    schema.insert("type".into(), "object".into());
                    Value::Object(schema)
                }
                Some(kind) if kind == "object" => Value::Object(schema.clone()),
                Some(kind) => {
                    return Err(invalid(format!(
                        "the parameters of {name:?} must describe an object, not type {kind}"
                    )));
                }
            },
            Some(_) => {
                return Err(invalid(format!(
                    "the parameters of {name:?} must be a JSON Schema object"
                )));
            }
        };
        functions.push(Tool {
            name: name.into(),
            parameters,
        });
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(invalid_choice()),
        },
        Some(choice) => {
            let name = (choice.get("type").filter(|kind| *kind == "function"))
                .and_then(|_| choice.get("function")?.get("name")?.as_str())
                .ok_or_else(invalid_choice)?;
            if !functions.iter().any(|f| f.name == name) {
                return Err(ApiError::invalid_field(
                    "tool_choice",
                    format!("tool_choice names {name:?}, which is not among the tools"),
                ));
            }
            ToolChoice::Function(name.into())
        }
    };
    if functions.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(ApiError::invalid_field(
                "tool_choice",
                "tool_choice asks for a tool call, but no tools are given",
            )),
        };
    }
    Ok(Some(Tools {
        offered,
        functions,
        choice,
        parallel,
    }))
}

/// Refuses a format (from the field `param`) beside tools the model may call: the answer
/// cannot follow the format's grammar and be read for calls too.
pub(crate) fn format_with_tools(
    grammar: Option<&Grammar>,
    tools: Option<&Tools>,
    param: &'static str,
) -> Result<(), ApiError> {
    if grammar.is_some() && tools.is_some_and(|t| t.choice != ToolChoice::None) {
        return Err(ApiError::invalid_field(
            param,
            format!("{param} cannot be combined with tools unless tool_choice is none"),
        ));
    }
    Ok(())
}

fn invalid_choice() -> ApiError {
    ApiError::invalid_field(
        "tool_choice",
        "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
    )
}

/// OpenAI's rule for a function's name.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && (name.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// OpenAI's `response_format`: `text`; `json_object` (any JSON object; with a `schema`, as
/// llama-server takes it, one valid against it); `json_schema` with `json_schema: {name,
/// schema, strict, description}`, the schema enforced whatever `strict` says. Errors name
/// `param`, the field the format came from.
pub(crate) fn response_format(
    format: Option<Value>,
    param: &'static str,
) -> Result<Option<Grammar>, ApiError> {
    let invalid = |message: String| ApiError::invalid_field(param, message);
    let Some(format) = format else {
        return Ok(None);
    };
    let schema = |value: Option<&Value>| match value {
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(schema.clone())),
        Some(_) => Err(invalid(format!("{param}'s schema must be a JSON object"))),
        None => Ok(None),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match schema(format.get("schema"))? {
            Some(schema) => Grammar::JsonSchema(schema),
            None => Grammar::json_object(),
        })),
        Some("json_schema") => {
            let spec = (format.get("json_schema")).ok_or_else(|| {
                invalid(format!("{param} json_schema needs a json_schema object"))
            })?;
            match schema(spec.get("schema"))? {
                Some(schema) => Ok(Some(Grammar::JsonSchema(schema))),
                None => Err(invalid(format!("{param}'s json_schema needs a schema"))),
            }
        }
        _ => Err(invalid(format!(
            "{param}'s type must be text, json_object or json_schema"
        ))),
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
    let draft_limit = take(&mut fields, "speculative.n_max")?;
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
        draft_limit,
        n,
        grammar: None,
        format_param: "response_format",
        tools: None,
        template_kwargs: Map::new(),
        fit_context: false,
    })
}

/// `temperature`, `top_p`, `presence_penalty`, `frequency_penalty`, `logit_bias` and `seed`,
/// each checked by name. OpenAI's defaults: temperature 1, top_p 1, no penalty or bias; no
/// seed gives a fresh one. `logit_bias`'s ids are checked against the vocabulary once the
/// tokenizer is at hand.
pub(crate) fn sampling(fields: &mut Map<String, Value>) -> Result<SamplingParams, ApiError> {
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
    let invalid = |text: String| ApiError::invalid_field("messages", text);
    if !matches!(
        message.role.as_str(),
        "system" | "developer" | "user" | "assistant" | "tool"
    ) {
        return Err(invalid(format!(
            "message role {:?} is not supported",
            message.role
        )));
    }
    let content = match message.content {
        None => None,
        Some(Content::Text(text)) => Some(text),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        return Err(invalid(format!(
                            "content part of type {kind:?} is not supported"
                        )));
                    }
                }
            }
            Some(text)
        }
    };
    // The templates write a call's arguments with `tojson`: the value, not its text, read as
    // vLLM reads it (Python's `json.loads`, `Arguments`).
    let tool_calls = match (message.role.as_str(), message.tool_calls) {
        (_, None) => None,
        ("assistant", Some(calls)) => Some(
            (calls.into_iter())
                .map(|call| {
                    // Empty arguments are no arguments, as vLLM reads them (clients send
                    // "" for a call to a tool without parameters).
                    let text = call.function.arguments.trim();
                    let arguments = if text.is_empty() {
                        Arguments::empty()
                    } else {
                        Arguments::from_json(text).map_err(|e| {
                            invalid(format!(
                                "the arguments of tool call {:?} are not JSON: {e}",
                                call.id
                            ))
                        })?
                    };
                    Ok(ToolCall {
                        id: call.id,
                        kind: "function".into(),
                        function: FunctionCall {
                            name: call.function.name,
                            arguments,
                        },
                    })
                })
                .collect::<Result<Vec<_>, ApiError>>()?,
        ),
        (role, Some(_)) => {
            return Err(invalid(format!("a {role} message cannot have tool_calls")));
        }
    };
    if message.role == "tool" && message.tool_call_id.is_none() {
        return Err(invalid("a tool message needs tool_call_id".into()));
    }
    // A message without content has an empty one: OpenAI's clients send `content: null`
    // beside tool calls, which transformers 5 leaves out of the message, and Qwen3's
    // template fails on a message without it; the others render "" as they render none.
    let content = content.or_else(|| Some(String::new()));
    // OpenAI's newer name for the system role; chat templates know "system".
    let role = match message.role.as_str() {
        "developer" => "system".to_string(),
        _ => message.role,
    };
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id: message.tool_call_id,
    })
}

fn unsupported(field: &'static str) -> ApiError {
    ApiError::invalid_field(field, format!("{field} is not supported by this server"))
}

/// The body as a JSON object.
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::invalid("the body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

/// Removes `field` and reads it as `T`; `null` counts as absent.
pub(crate) fn take<T: serde::de::DeserializeOwned>(
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
        assert_eq!(messages[1].text(), "Hi");
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
                "each tool must be",
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
                "needs tool_call_id",
            ),
            (
                r#"{"messages":[{"role":"function","content":"x"}]}"#,
                "role \"function\"",
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
        // No tools and the default choice; the older functions not called.
        chat_with(r#","tools":[],"tool_choice":"auto""#).unwrap();
        chat_with(r#","functions":[{"name":"f"}],"function_call":"none""#).unwrap();
        let choice = r#","tool_choice":{"type":"function","function":{"name":"f"}}"#;
        assert_eq!(param_of(chat_with(choice)), Some("tool_choice"));
        // best_of 1 is what happens anyway; a salt is kept.
        completion_with(r#""x""#, r#","best_of":1"#).unwrap();
        let salted = chat_with(r#","cache_salt":"tenant-7""#).unwrap();
        assert_eq!(salted.cache_salt.as_deref(), Some("tenant-7"));
    }

    /// Tools, each choice of how to use them, and a conversation that used them.
    #[test]
    fn tools_and_tool_messages_are_read() {
        let tools = r#","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}},{"type":"function","function":{"name":"g-2"}}]"#;
        let read = |more: &str| chat_with(&format!("{tools}{more}")).map(|r| r.tools.unwrap());
        let auto = read("").unwrap();
        assert_eq!((auto.choice, auto.parallel), (ToolChoice::Auto, true));
        assert_eq!(auto.functions[1].name, "g-2");
        assert_eq!(
            auto.functions[1].parameters,
            serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false}),
            "no parameters: an empty list (issue 42)"
        );
        assert_eq!(auto.offered.len(), 2);
        assert_eq!(
            read(r#","tool_choice":"none""#).unwrap().choice,
            ToolChoice::None
        );
        let required = read(r#","tool_choice":"required","parallel_tool_calls":false"#).unwrap();
        assert_eq!(
            (required.choice, required.parallel),
            (ToolChoice::Required, false)
        );
        let named = read(r#","tool_choice":{"type":"function","function":{"name":"g-2"}}"#);
        assert_eq!(named.unwrap().choice, ToolChoice::Function("g-2".into()));
        for (more, param, expected) in [
            (
                r#","tool_choice":{"type":"function","function":{"name":"h"}}"#,
                "tool_choice",
                "not among the tools",
            ),
            (
                r#","tool_choice":"always""#,
                "tool_choice",
                "must be none, auto",
            ),
            (
                r#","response_format":{"type":"json_object"}"#,
                "response_format",
                "cannot be combined",
            ),
        ] {
            let error = read(more).unwrap_err();
            assert_eq!(error.param, Some(param), "{more}");
            assert!(
                error.message.contains(expected),
                "{more}: {}",
                error.message
            );
        }
        let many: Vec<String> = (0..=MAX_TOOLS)
            .map(|i| format!(r#"{{"type":"function","function":{{"name":"f{i}"}}}}"#))
            .collect();
        for (tools, expected) in [
            (format!("[{}]", many.join(",")), "at most 128"),
            (r#"[{"type":"function","function":{"name":"a b"}}]"#.into(), "letters, digits"),
            (r#"[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#.into(), "two tools"),
            (r#"[{"type":"function","function":{"name":"f","parameters":[]}}]"#.into(), "JSON Schema object"),
            (r#"[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}]"#.into(), "describe an object"),
        ] {
            let error = chat_with(&format!(r#","tools":{tools}"#)).unwrap_err();
            assert_eq!(error.param, Some("tools"));
            assert!(error.message.contains(expected), "{}", error.message);
        }
        let error = chat_with(r#","tool_choice":"required""#).unwrap_err();
        assert_eq!(error.param, Some("tool_choice"));
        // A conversation with a call and its result: the arguments read as JSON.
        let request = chat(
            br#"{"messages":[{"role":"user","content":"x"},
               {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},
               {"role":"tool","tool_call_id":"c1","content":"2"}]}"#,
        )
        .unwrap();
        let [Prompt::Chat(messages)] = &request.prompts[..] else {
            panic!("a chat prompt")
        };
        let calls = messages[1].tool_calls.as_ref().unwrap();
        assert_eq!(
            calls[0].function.arguments,
            Arguments::from_json("{\"x\":1}").unwrap()
        );
        assert_eq!(messages[1].content.as_deref(), Some(""));
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
        // Empty arguments are none (vLLM's reading).
        let empty = r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":""}}]}]}"#;
        let request = chat(empty.as_bytes()).unwrap();
        let [Prompt::Chat(messages)] = &request.prompts[..] else {
            panic!("a chat prompt")
        };
        let calls = messages[0].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].function.arguments, Arguments::empty());
        let broken = r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{x"}}]}]}"#;
        assert!(chat_error(broken).contains("not JSON"));
    }

    /// A conversation that used a tool, sent back as OpenAI's clients send it (each call's
    /// arguments a string of JSON), renders as transformers renders it once the strings are
    /// read as vLLM reads them (`json.loads`): runtime/tests/data/chat-tools/round_trips.json,
    /// made by scripts/make_tool_round_trip_goldens.py; arguments with integers past 64 and
    /// 128 bits, `-0`, `1E400`, a repeated key, escapes (issue 42).
    #[test]
    fn tool_round_trips_render_as_transformers_does() {
        let data = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../runtime/tests/data/chat-tools"
        );
        let file = std::fs::read(format!("{data}/round_trips.json")).unwrap();
        let round_trips: Value = serde_json::from_slice(&file).unwrap();
        let cases = round_trips["cases"].as_array().unwrap();
        assert!(cases.len() >= 24);
        for case in cases {
            let body = serde_json::json!({"messages": case["messages"], "tools": case["tools"],
                                          "chat_template_kwargs": case["kwargs"]});
            let request = chat(body.to_string().as_bytes()).unwrap();
            let [Prompt::Chat(messages)] = &request.prompts[..] else {
                panic!("a chat prompt")
            };
            let template = case["template"].as_str().unwrap();
            let token = |name: &str| case[name].as_str().unwrap_or_default().to_string();
            let rendered = runtime::text::chat::ChatRequest {
                template: std::fs::read_to_string(format!("{data}/{template}")).unwrap(),
                bos_token: token("bos_token"),
                eos_token: token("eos_token"),
                messages: messages.clone(),
                tools: request.tools.map(|tools| tools.offered),
                kwargs: request.template_kwargs,
            }
            .render()
            .unwrap();
            assert_eq!(rendered, case["text"].as_str().unwrap(), "{}", case["name"]);
        }
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
