//! The body of OpenAI's `POST /v1/responses` read into the request `/v1/chat/completions`
//! runs ([`Request`]): `instructions` and `input` as a chat's messages (an assistant's
//! `function_call` items become its `tool_calls`, `function_call_output` items `tool`
//! messages, `reasoning` items a `<think>` section where the template has them), the flat
//! function tools and a `namespace`'s functions as a chat's tools (checked by
//! [`api::tools`]; OpenAI's hosted tools accepted and not offered), `text.format` as a chat's
//! `response_format` (the same grammar), `reasoning.effort` as the template's
//! `enable_thinking`. The server keeps no state: `previous_response_id` and `conversation`
//! are refused, and `store` is answered `false`. As for a chat, a field this server does
//! not act on is refused by name. What the response object echoes is kept in an [`Echo`].

use std::collections::HashMap;

use runtime::text::chat::{Arguments, FunctionCall, Message, ToolCall};
use serde_json::{Map, Value, json};

use crate::api::{self, Prompt, Request, take};
use crate::error::ApiError;
use crate::routes::Thinks;

/// Fields accepted with no effect: who the caller is (`user`, echoed, is too), a hint for
/// OpenAI's cache routing (the cache of every finished request is kept here anyway), and
/// the client's own notes on the request (Codex CLI sends its session's).
const HARMLESS: [&str; 3] = ["safety_identifier", "prompt_cache_key", "client_metadata"];

/// What `include` may ask for. `reasoning.encrypted_content` (which a stateless client of
/// OpenAI's asks for to send the reasoning back next turn) adds nothing: the reasoning items
/// carry their text, which the client sends back instead.
const INCLUDABLE: [&str; 1] = ["reasoning.encrypted_content"];

/// The fields the response object repeats from the request, in OpenAI's shapes.
pub(crate) type Echo = Map<String, Value>;

/// A Responses API body, read.
pub(crate) struct Parsed {
    /// The chat request to run.
    pub request: Request,
    /// What the answer echoes.
    pub echo: Echo,
    /// The namespaces of the functions offered in one, for the calls' items.
    pub namespaces: Namespaces,
}

/// Reads a Responses API body.
pub(crate) fn parse(body: &[u8], thinks: Thinks) -> Result<Parsed, ApiError> {
    let mut fields = api::object(body)?;
    for stateful in ["previous_response_id", "conversation"] {
        if take::<Value>(&mut fields, stateful)?.is_some() {
            return Err(ApiError::invalid_field(
                stateful,
                format!(
                    "{stateful} is not supported: this server is stateless and stores no responses; send the whole conversation as input"
                ),
            ));
        }
    }
    let mut echo = Echo::new();
    let input: Value = take(&mut fields, "input")?.ok_or_else(|| required("input"))?;
    let instructions: Option<String> = take(&mut fields, "instructions")?;
    let mut messages: Vec<Message> = instructions
        .iter()
        .map(|i| Message::new("system", i))
        .collect();
    messages.extend(conversation(input, thinks)?);
    echo.insert("instructions".into(), instructions.into());

    let Offered {
        tools,
        echoed,
        choice,
        namespaces,
    } = tools(&mut fields)?;
    echo.insert("tools".into(), echoed.into());
    echo.insert("tool_choice".into(), choice);
    echo.insert(
        "parallel_tool_calls".into(),
        tools.as_ref().is_none_or(|t| t.parallel).into(),
    );
    let (grammar, text) = text_format(&mut fields)?;
    api::format_with_tools(grammar.as_ref(), tools.as_ref(), "text.format")?;
    echo.insert("text".into(), text);
    let (template_kwargs, reasoning) = reasoning(&mut fields, thinks)?;
    echo.insert("reasoning".into(), reasoning);

    let max_tokens: Option<usize> = take(&mut fields, "max_output_tokens")?;
    if max_tokens == Some(0) {
        return Err(ApiError::invalid_field(
            "max_output_tokens",
            "max_output_tokens must be at least 1",
        ));
    }
    echo.insert("max_output_tokens".into(), max_tokens.into());
    // Only the sampling fields the Responses API has (no seed, penalties or bias).
    let mut sampled = Map::new();
    for field in ["temperature", "top_p"] {
        if let Some(value) = fields.remove(field) {
            sampled.insert(field.into(), value);
        }
    }
    // Echoed as sent (an f32 would print 0.7 as 0.699999988), OpenAI's defaults 1.
    for field in ["temperature", "top_p"] {
        let value = sampled.get(field).filter(|v| !v.is_null()).cloned();
        echo.insert(field.into(), value.unwrap_or_else(|| 1.0.into()));
    }
    let sampling = api::sampling(&mut sampled)?;
    let metadata = metadata(&mut fields)?;
    echo.insert("metadata".into(), metadata.into());
    let user: Option<String> = take(&mut fields, "user")?;
    echo.insert("user".into(), user.into());
    // Nothing is stored, whatever the request asks.
    take::<bool>(&mut fields, "store")?;
    echo.insert("store".into(), false.into());
    echo.insert("previous_response_id".into(), Value::Null);
    if let Some(truncation) = take::<String>(&mut fields, "truncation")?
        && truncation != "disabled"
    {
        return Err(ApiError::invalid_field(
            "truncation",
            format!(
                "truncation {truncation:?} is not supported: an input longer than the context is refused (\"disabled\")"
            ),
        ));
    }
    echo.insert("truncation".into(), "disabled".into());
    let include: Vec<String> = take(&mut fields, "include")?.unwrap_or_default();
    if let Some(other) = include.iter().find(|i| !INCLUDABLE.contains(&i.as_str())) {
        return Err(ApiError::invalid_field(
            "include",
            format!("include {other:?} is not supported: this server adds nothing to its output"),
        ));
    }
    let stream = take(&mut fields, "stream")?.unwrap_or(false);
    let model = take(&mut fields, "model")?;
    for field in HARMLESS {
        fields.remove(field);
    }
    if let Some(field) = fields.keys().next() {
        return Err(ApiError::invalid(format!("unknown field {field:?}")));
    }
    let request = Request {
        prompts: vec![Prompt::Chat(messages)],
        max_tokens,
        max_tokens_param: "max_output_tokens",
        sampling,
        stop: Vec::new(),
        stream,
        include_usage: false,
        model,
        logprobs: None,
        cache_salt: None,
        draft_limit: None,
        n: 1,
        grammar,
        format_param: "text.format",
        tools,
        template_kwargs,
        fit_context: false,
    };
    Ok(Parsed {
        request,
        echo,
        namespaces,
    })
}

fn required(field: &'static str) -> ApiError {
    ApiError::invalid_field(field, format!("{field} is required"))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid_field("input", message)
}

/// `metadata`: up to 16 string values, echoed.
fn metadata(fields: &mut Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let metadata: Map<String, Value> = take(fields, "metadata")?.unwrap_or_default();
    if metadata.len() > 16 || metadata.values().any(|v| !v.is_string()) {
        return Err(ApiError::invalid_field(
            "metadata",
            "metadata takes up to 16 keys with string values",
        ));
    }
    Ok(metadata)
}

/// An assistant turn being gathered from consecutive items: its reasoning, text and calls.
#[derive(Default)]
struct Turn {
    thinking: Vec<String>,
    texts: Vec<String>,
    calls: Vec<ToolCall>,
}

impl Turn {
    /// The turn as one assistant message (if it has anything), its reasoning a `<think>`
    /// section before its text where the template has them, as Qwen3's and DeepSeek-R1's
    /// read an earlier answer; otherwise dropped, as a template that never saw reasoning has
    /// nowhere to put it.
    fn flush(&mut self, thinks: Thinks, messages: &mut Vec<Message>) {
        let Turn {
            thinking,
            texts,
            calls,
        } = std::mem::take(self);
        if thinking.is_empty() && texts.is_empty() && calls.is_empty() {
            return;
        }
        let mut content = texts.join("\n");
        if thinks != Thinks::Never && !thinking.is_empty() {
            content = format!("<think>\n{}\n</think>\n\n{content}", thinking.join("\n"));
        }
        messages.push(Message {
            role: "assistant".into(),
            content: Some(content),
            tool_calls: (!calls.is_empty()).then_some(calls),
            tool_call_id: None,
        });
    }
}

/// `input`: a string (the user's message) or a list of items, as chat messages. Consecutive
/// assistant items (reasoning, messages, function calls: what one response output) are one
/// assistant turn.
fn conversation(input: Value, thinks: Thinks) -> Result<Vec<Message>, ApiError> {
    let items = match input {
        Value::String(text) => return Ok(vec![Message::new("user", text)]),
        Value::Array(items) => items,
        _ => return Err(invalid("input must be a string or a list of input items")),
    };
    if items.is_empty() {
        return Err(invalid("input is empty"));
    }
    let mut messages = Vec::new();
    let mut turn = Turn::default();
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(mut item) = item else {
            return Err(invalid(format!("input[{i}] must be an object")));
        };
        let kind = match item.remove("type") {
            None if item.contains_key("role") => "message".to_string(),
            Some(Value::String(kind)) => kind,
            _ => return Err(invalid(format!("input[{i}] needs a type"))),
        };
        // What an earlier response's output items carry besides their content.
        for echoed in ["id", "status"] {
            item.remove(echoed);
        }
        let string = |item: &mut Map<String, Value>, key: &str| match item.remove(key) {
            Some(Value::String(value)) => Ok(value),
            _ => Err(invalid(format!(
                "input[{i}]: a {kind} item needs {key}, a string"
            ))),
        };
        match kind.as_str() {
            "message" => {
                let role = string(&mut item, "role")?;
                let content = item.remove("content").unwrap_or(Value::Null);
                let text = message_text(content, &role, i)?;
                item.remove("phase");
                match role.as_str() {
                    "assistant" => turn.texts.push(text),
                    "user" | "system" | "developer" => {
                        turn.flush(thinks, &mut messages);
                        // OpenAI's newer name for the system role; templates know "system".
                        let role = if role == "developer" { "system" } else { &role };
                        messages.push(Message::new(role, text));
                    }
                    _ => {
                        return Err(invalid(format!(
                            "input[{i}]: role {role:?} is not one of user, assistant, system, developer"
                        )));
                    }
                }
            }
            "function_call" => {
                // Offered by its own name (`tools`), so called by it.
                item.remove("namespace");
                let call_id = string(&mut item, "call_id")?;
                let name = string(&mut item, "name")?;
                let arguments = string(&mut item, "arguments")?;
                // Empty arguments are none, as vLLM reads a chat's calls.
                let arguments = match arguments.trim() {
                    "" => Arguments::empty(),
                    text => Arguments::from_json(text).map_err(|e| {
                        invalid(format!(
                            "input[{i}]: the arguments of call {call_id:?} are not JSON: {e}"
                        ))
                    })?,
                };
                turn.calls.push(ToolCall {
                    id: call_id,
                    kind: "function".into(),
                    function: FunctionCall { name, arguments },
                });
            }
            "function_call_output" => {
                turn.flush(thinks, &mut messages);
                let call_id = string(&mut item, "call_id")?;
                let output = item.remove("output").unwrap_or(Value::Null);
                messages.push(Message {
                    role: "tool".into(),
                    content: Some(text_parts(output, &["input_text"], i)?),
                    tool_calls: None,
                    tool_call_id: Some(call_id),
                });
            }
            "reasoning" => {
                // The reasoning as written where the item has it, else its summary.
                let content = item.remove("content").unwrap_or(Value::Null);
                let summary = item.remove("summary").unwrap_or(Value::Null);
                item.remove("encrypted_content");
                let text = match content {
                    Value::Null => text_parts(summary, &["summary_text"], i)?,
                    content => text_parts(content, &["reasoning_text"], i)?,
                };
                turn.thinking.push(text);
            }
            "item_reference" => {
                return Err(invalid(format!(
                    "input[{i}]: item_reference is not supported: this server stores no items; send the item itself"
                )));
            }
            kind => {
                return Err(invalid(format!(
                    "input[{i}]: items of type {kind:?} are not supported: this server reads message, function_call, function_call_output and reasoning items"
                )));
            }
        }
        if let Some(key) = item.keys().next() {
            return Err(invalid(format!(
                "input[{i}]: unknown field {key:?} in a {kind} item"
            )));
        }
    }
    turn.flush(thinks, &mut messages);
    Ok(messages)
}

/// A message's content: a string, or its text parts (`input_text` from the user's side,
/// `output_text` from the assistant's) joined.
fn message_text(content: Value, role: &str, i: usize) -> Result<String, ApiError> {
    let kinds: &[&str] = match role {
        "assistant" => &["output_text"],
        _ => &["input_text"],
    };
    text_parts(content, kinds, i)
}

/// Text given as a string or a list of parts of `kinds` (each `{"type", "text"}`, an
/// output's `annotations` and `logprobs` aside), joined.
fn text_parts(value: Value, kinds: &[&str], i: usize) -> Result<String, ApiError> {
    let parts = match value {
        Value::String(text) => return Ok(text),
        Value::Array(parts) => parts,
        _ => {
            return Err(invalid(format!(
                "input[{i}]: content must be a string or a list of {} parts",
                kinds.join(" or ")
            )));
        }
    };
    let mut text = String::new();
    for part in parts {
        let Value::Object(mut part) = part else {
            return Err(invalid(format!("input[{i}]: each part must be an object")));
        };
        for echoed in ["annotations", "logprobs"] {
            part.remove(echoed);
        }
        let kind = part.remove("type");
        let kind = kind.as_ref().and_then(Value::as_str).unwrap_or_default();
        match part.remove("text") {
            Some(Value::String(piece)) if kinds.contains(&kind) && part.is_empty() => {
                text.push_str(&piece)
            }
            _ => {
                return Err(invalid(format!(
                    "input[{i}]: parts of type {kind:?} are not supported here: this server reads {} parts (a type and a text)",
                    kinds.join(" and ")
                )));
            }
        }
    }
    Ok(text)
}

/// Tool types OpenAI's servers run. Accepted and not offered to the model: this server runs
/// none, so the model answers without them, as it would choosing not to use them (clients
/// such as Codex CLI offer web search with every request). A `tool_choice` naming one is
/// refused.
const HOSTED_TOOLS: [&str; 9] = [
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
    "tool_search",
];

/// The namespace each function offered inside one is called in (`namespace` tools, which
/// Codex CLI sends): the function's name to its namespace's. A call of it is answered with
/// its `namespace`, as OpenAI's function_call items carry it.
pub(crate) type Namespaces = HashMap<String, String>;

/// The tools as a chat takes them, as the response echoes them, the choice as echoed, and
/// the namespaces of namespaced functions.
struct Offered {
    tools: Option<api::Tools>,
    echoed: Vec<Value>,
    choice: Value,
    namespaces: Namespaces,
}

/// `tools`, `tool_choice` and `parallel_tool_calls`, checked as a chat's ([`api::tools`]):
/// flat function tools, and the function tools of a `namespace` offered by their own names
/// (which must not repeat). Tools OpenAI's servers run ([`HOSTED_TOOLS`]) are not offered;
/// other kinds (`custom`, `local_shell`, ...) are refused.
fn tools(fields: &mut Map<String, Value>) -> Result<Offered, ApiError> {
    let echoed: Vec<Value> = take(fields, "tools")?.unwrap_or_default();
    let refused = |message: String| ApiError::invalid_field("tools", message);
    let mut functions = Vec::with_capacity(echoed.len());
    let mut namespaces = Namespaces::new();
    for (i, tool) in echoed.iter().enumerate() {
        let Some(tool) = tool.as_object() else {
            return Err(refused(format!("tools[{i}] must be an object")));
        };
        let mut tool = tool.clone();
        match tool.remove("type") {
            Some(kind) if kind == "function" => {
                functions.push(function_tool(tool, &format!("tools[{i}]"))?);
            }
            Some(kind) if kind == "namespace" => {
                let name = match tool.remove("name") {
                    Some(Value::String(name)) if !name.is_empty() => name,
                    _ => return Err(refused(format!("tools[{i}] needs a name, a string"))),
                };
                tool.remove("description");
                let Some(Value::Array(inner)) = tool.remove("tools") else {
                    return Err(refused(format!("tools[{i}] needs tools, a list")));
                };
                if let Some(key) = tool.keys().next() {
                    return Err(refused(format!(
                        "tools[{i}].{key} is not supported by this server"
                    )));
                }
                for (j, function) in inner.into_iter().enumerate() {
                    let at = format!("tools[{i}].tools[{j}]");
                    let Value::Object(mut function) = function else {
                        return Err(refused(format!("{at} must be an object")));
                    };
                    if function.remove("type") != Some("function".into()) {
                        return Err(refused(format!(
                            "{at}: a namespace's tools must be function tools here"
                        )));
                    }
                    if let Some(Value::String(function)) = function.get("name") {
                        namespaces.insert(function.clone(), name.clone());
                    }
                    functions.push(function_tool(function, &at)?);
                }
            }
            Some(Value::String(kind)) if HOSTED_TOOLS.contains(&kind.as_str()) => {}
            Some(kind) => {
                return Err(refused(format!(
                    "tools[{i}] is of type {kind}, which this server does not offer: it takes function and namespace tools (and accepts, without running them, the tools OpenAI's servers run)"
                )));
            }
            None => return Err(refused(format!("tools[{i}] needs a type"))),
        }
    }
    let choice: Option<Value> = take(fields, "tool_choice")?;
    let parallel: Option<bool> = take(fields, "parallel_tool_calls")?;
    let mut chat = Map::new();
    chat.insert("tools".into(), functions.into());
    if let Some(choice) = &choice {
        chat.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(parallel) = parallel {
        chat.insert("parallel_tool_calls".into(), parallel.into());
    }
    Ok(Offered {
        tools: api::tools(&mut chat)?,
        echoed,
        choice: choice.unwrap_or_else(|| "auto".into()),
        namespaces,
    })
}

/// A flat function tool (its `type` taken) as a chat's: `name`, `description`, `parameters`
/// and `strict` under `function`; any other key refused, naming it `at.key`.
fn function_tool(mut tool: Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let mut function = Map::new();
    for key in ["name", "description", "parameters", "strict"] {
        match tool.remove(key) {
            None | Some(Value::Null) => {}
            Some(value) => {
                function.insert(key.into(), value);
            }
        }
    }
    if let Some(key) = tool.keys().next() {
        return Err(ApiError::invalid_field(
            "tools",
            format!("{at}.{key} is not supported by this server"),
        ));
    }
    Ok(json!({"type": "function", "function": function}))
}

/// The Responses API's `tool_choice` as a chat's: the same strings; `{"type": "function",
/// "name"}` a named function. `allowed_tools` and OpenAI's own tools are refused.
fn tool_choice(choice: &Value) -> Result<Value, ApiError> {
    let refused = |message: String| ApiError::invalid_field("tool_choice", message);
    let Some(fields) = choice.as_object() else {
        return Ok(choice.clone());
    };
    match fields.get("type").and_then(Value::as_str) {
        Some("function") => match (fields.get("name"), fields.len()) {
            (Some(Value::String(name)), 2) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            _ => Err(refused(
                "tool_choice of type function takes the function's name and nothing else".into(),
            )),
        },
        Some("allowed_tools") => Err(refused(
            "tool_choice of type allowed_tools is not supported: offer only the allowed tools instead".into(),
        )),
        Some(kind) => Err(refused(format!(
            "tool_choice of type {kind:?} names a tool this server does not run: it takes none, auto, required or {{\"type\": \"function\", \"name\": ...}}"
        ))),
        None => Err(refused("tool_choice needs a type".into())),
    }
}

/// `text`: its `format` as a chat's `response_format` (`text`, `json_object`, `json_schema`
/// with `name`, `schema`, `strict`, `description` side by side rather than nested), the
/// schema enforced whatever `strict` says; `verbosity` only `medium`, what the model does.
/// The grammar, and `text` as the response echoes it.
fn text_format(
    fields: &mut Map<String, Value>,
) -> Result<(Option<runtime::text::grammar::Grammar>, Value), ApiError> {
    let refused = |message: String| ApiError::invalid_field("text", message);
    let mut text: Map<String, Value> = take(fields, "text")?.unwrap_or_default();
    let format = text.remove("format").filter(|f| !f.is_null());
    let verbosity = text.remove("verbosity").filter(|v| !v.is_null());
    if let Some(verbosity) = verbosity.as_ref().filter(|v| *v != "medium") {
        return Err(refused(format!(
            "text.verbosity {verbosity} is not supported: the model writes as it writes (medium)"
        )));
    }
    if let Some(key) = text.keys().next() {
        return Err(refused(format!("text.{key} is not supported")));
    }
    // A chat's `json_schema` has its fields nested under `json_schema`.
    let chat_format = match &format {
        Some(Value::Object(spec)) if spec.get("type").is_some_and(|t| t == "json_schema") => {
            let mut nested = spec.clone();
            nested.remove("type");
            Some(json!({"type": "json_schema", "json_schema": nested}))
        }
        Some(Value::Object(_)) | None => format.clone(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "text.format",
                "text.format must be an object",
            ));
        }
    };
    let grammar = api::response_format(chat_format, "text.format")?;
    let mut echo = json!({"format": format.unwrap_or_else(|| json!({"type": "text"}))});
    if let Some(verbosity) = verbosity {
        echo["verbosity"] = verbosity;
    }
    Ok((grammar, echo))
}

/// `reasoning`: `effort` as the template's `enable_thinking`: `none` and `minimal` off,
/// `low` to `xhigh` on (no budget: the reasoning counts against `max_output_tokens`);
/// absent, the template's default. Refused where the template cannot do it: a model that
/// never reasons asked to, one that always does asked not to. `summary`: only `auto` (no
/// summary is written: the reasoning comes whole). The kwargs, and `reasoning` as echoed.
fn reasoning(
    fields: &mut Map<String, Value>,
    thinks: Thinks,
) -> Result<(Map<String, Value>, Value), ApiError> {
    let refused = |message: String| ApiError::invalid_field("reasoning", message);
    let mut kwargs = Map::new();
    let mut config: Map<String, Value> = take(fields, "reasoning")?.unwrap_or_default();
    let effort = config.remove("effort").filter(|e| !e.is_null());
    let summary = config.remove("summary").filter(|s| !s.is_null());
    let summary = summary.or_else(|| config.remove("generate_summary").filter(|s| !s.is_null()));
    if let Some(key) = config.keys().next() {
        return Err(refused(format!("reasoning.{key} is not supported")));
    }
    if let Some(summary) = summary.as_ref().filter(|s| *s != "auto") {
        return Err(refused(format!(
            "reasoning.summary {summary} is not supported: no summary is written, the reasoning comes whole (auto)"
        )));
    }
    if let Some(effort) = &effort {
        let on = match effort.as_str() {
            Some("none" | "minimal") => false,
            Some("low" | "medium" | "high" | "xhigh") => true,
            _ => {
                return Err(refused(format!(
                    "reasoning.effort {effort} must be none, minimal, low, medium, high or xhigh"
                )));
            }
        };
        match (thinks, on) {
            (Thinks::Never, true) => {
                return Err(refused(format!(
                    "reasoning.effort {effort} is not supported: this model's chat template has no reasoning (<think>) section"
                )));
            }
            (Thinks::Always, false) => {
                return Err(refused(format!(
                    "reasoning.effort {effort} is not supported: this model's chat template always opens a reasoning section and has no switch (enable_thinking) to turn it off"
                )));
            }
            (Thinks::Switch, on) => {
                kwargs.insert("enable_thinking".into(), on.into());
            }
            _ => {}
        }
    }
    Ok((kwargs, json!({"effort": effort, "summary": summary})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ToolChoice;
    use runtime::text::grammar::Grammar;

    fn parse_with(extra: Value, thinks: Thinks) -> Result<(Request, Echo), ApiError> {
        parsed_with(extra, thinks).map(|parsed| (parsed.request, parsed.echo))
    }

    fn parsed_with(extra: Value, thinks: Thinks) -> Result<Parsed, ApiError> {
        let mut body = json!({"model": "m", "input": "Hi"});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        parse(body.to_string().as_bytes(), thinks)
    }

    fn messages_of(request: &Request) -> &[Message] {
        let [Prompt::Chat(messages)] = &request.prompts[..] else {
            panic!("a chat prompt")
        };
        messages
    }

    fn error(extra: Value) -> ApiError {
        parse_with(extra, Thinks::Never).unwrap_err()
    }

    /// A conversation that used a tool, as a client sends an earlier response's output
    /// back: reasoning, text and calls one assistant turn (the reasoning a `<think>`
    /// section, or dropped), each output a `tool` message; `instructions` first.
    #[test]
    fn input_items_become_a_chats_messages() {
        let input = json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "A call."}]},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
             "arguments": "{\"city\": \"Paris\", \"n\": 98765432109876543210}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": ""},
            {"type": "function_call_output", "call_id": "call_1", "output": "21"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "none"}]},
            {"role": "user", "content": "Thanks."},
        ]);
        let extra = json!({"input": input, "instructions": "You help."});
        let (request, echo) = parse_with(extra.clone(), Thinks::Switch).unwrap();
        let messages = messages_of(&request);
        let summary: Vec<(&str, &str, Option<&str>)> = (messages.iter())
            .map(|m| (m.role.as_str(), m.text(), m.tool_call_id.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                ("system", "You help.", None),
                ("system", "Be brief.", None),
                ("user", "Weather?", None),
                (
                    "assistant",
                    "<think>\nA call.\n</think>\n\nLet me look.",
                    None
                ),
                ("tool", "21", Some("call_1")),
                ("tool", "none", Some("call_2")),
                ("user", "Thanks.", None),
            ]
        );
        let calls = messages[3].tool_calls.as_ref().unwrap();
        assert_eq!(
            (calls[0].id.as_str(), calls[0].function.name.as_str()),
            ("call_1", "f")
        );
        assert_eq!(
            calls[0].function.arguments,
            Arguments::from_json(r#"{"city": "Paris", "n": 98765432109876543210}"#).unwrap()
        );
        assert_eq!(calls[1].function.arguments, Arguments::empty());
        assert_eq!(echo["instructions"], "You help.");
        // A template without `<think>`: the reasoning is dropped.
        let (request, _) = parse_with(extra, Thinks::Never).unwrap();
        assert_eq!(messages_of(&request)[3].text(), "Let me look.");
        // A string is the user's message.
        let (request, _) = parse_with(json!({}), Thinks::Never).unwrap();
        assert_eq!(messages_of(&request)[0], Message::new("user", "Hi"));
    }

    /// Flat function tools as a chat's, each choice mapped; OpenAI's own tools and choices
    /// refused by name.
    #[test]
    fn tools_and_choices_are_a_chats() {
        let tools = json!([{"type": "function", "name": "f", "description": "F.", "strict": true,
                            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                           {"type": "function", "name": "g", "parameters": null}]);
        let read = |more: Value| {
            let mut extra = json!({"tools": tools});
            for (key, value) in more.as_object().unwrap() {
                extra[key] = value.clone();
            }
            parse_with(extra, Thinks::Never).map(|(r, echo)| (r.tools.unwrap(), echo))
        };
        let (auto, echo) = read(json!({})).unwrap();
        assert_eq!((&auto.choice, auto.parallel), (&ToolChoice::Auto, true));
        assert_eq!(auto.offered[0]["function"]["description"], "F.");
        assert_eq!(
            auto.offered[0]["function"]["parameters"],
            tools[0]["parameters"]
        );
        assert_eq!(auto.functions[1].name, "g");
        assert_eq!(
            (
                &echo["tools"],
                &echo["tool_choice"],
                &echo["parallel_tool_calls"]
            ),
            (&tools, &json!("auto"), &json!(true))
        );
        let (named, echo) = read(
            json!({"tool_choice": {"type": "function", "name": "g"}, "parallel_tool_calls": false}),
        )
        .unwrap();
        assert_eq!(
            (named.choice, named.parallel),
            (ToolChoice::Function("g".into()), false)
        );
        assert_eq!(
            echo["tool_choice"],
            json!({"type": "function", "name": "g"})
        );
        assert_eq!(echo["parallel_tool_calls"], false);
        for (choice, expected) in [
            ("required", ToolChoice::Required),
            ("none", ToolChoice::None),
        ] {
            assert_eq!(
                read(json!({"tool_choice": choice})).unwrap().0.choice,
                expected
            );
        }
        for (more, param, expected) in [
            (
                json!({"tool_choice": {"type": "function", "name": "h"}}),
                "tool_choice",
                "not among the tools",
            ),
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
                "tool_choice",
                "name and nothing else",
            ),
            (
                json!({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}),
                "tool_choice",
                "allowed_tools",
            ),
            (
                json!({"tool_choice": {"type": "file_search"}}),
                "tool_choice",
                "does not run",
            ),
            (
                json!({"tool_choice": "always"}),
                "tool_choice",
                "must be none, auto",
            ),
            (
                json!({"tools": [{"type": "custom", "name": "apply_patch"}]}),
                "tools",
                "type \"custom\", which this server does not offer",
            ),
            (
                json!({"tools": [{"type": "function", "name": "f"},
                    {"type": "namespace", "name": "n", "tools": [
                    {"type": "function", "name": "f"}]}]}),
                "tools",
                "two tools are named \"f\"",
            ),
            (
                json!({"tools": [{"type": "namespace", "name": "n", "tools": [
                    {"type": "custom", "name": "c"}]}]}),
                "tools",
                "tools[0].tools[0]: a namespace's tools must be function tools",
            ),
            (
                json!({"tools": [{"type": "namespace", "name": "n"}]}),
                "tools",
                "tools[0] needs tools",
            ),
            (
                json!({"tools": [{"type": "function", "name": "f", "colour": 1}]}),
                "tools",
                "tools[0].colour",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
                "tools",
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "name": "a b"}]}),
                "tools",
                "letters, digits",
            ),
            (
                json!({"text": {"format": {"type": "json_object"}}}),
                "text.format",
                "cannot be combined",
            ),
        ] {
            let error = read(more.clone()).unwrap_err();
            assert_eq!(error.param, Some(param), "{more}");
            assert!(
                error.message.contains(expected),
                "{more}: {}",
                error.message
            );
        }
        // `none` leaves the tools in the prompt and allows a format.
        let (none, _) =
            read(json!({"tool_choice": "none", "text": {"format": {"type": "json_object"}}}))
                .unwrap();
        assert_eq!(none.choice, ToolChoice::None);
    }

    /// Codex CLI's tools: a namespace's functions are offered by their own names and their
    /// calls answered in it; a hosted tool (web search) is echoed but not offered.
    #[test]
    fn namespaced_functions_are_offered_and_hosted_tools_are_not() {
        let tools = json!([
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                {"type": "function", "name": "spawn_agent", "strict": false,
                 "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
            {"type": "web_search", "external_web_access": false}]);
        let parsed = parsed_with(
            json!({"tools": tools, "tool_choice": {"type": "function", "name": "spawn_agent"}}),
            Thinks::Never,
        )
        .unwrap();
        let offered = parsed.request.tools.unwrap();
        let names: Vec<&str> = (offered.functions.iter())
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["exec_command", "spawn_agent"]);
        assert_eq!(offered.choice, ToolChoice::Function("spawn_agent".into()));
        assert_eq!(
            parsed.namespaces,
            Namespaces::from([("spawn_agent".into(), "agents".into())])
        );
        assert_eq!(parsed.echo["tools"], tools);
        // Hosted tools alone offer nothing; forcing one is refused.
        let (request, _) =
            parse_with(json!({"tools": [{"type": "web_search"}]}), Thinks::Never).unwrap();
        assert!(request.tools.is_none());
        let error = error(json!({"tools": [{"type": "web_search"}],
                                 "tool_choice": {"type": "web_search"}}));
        assert_eq!(error.param, Some("tool_choice"));
        // A namespaced call sent back is read by its name.
        let input = json!([{"role": "user", "content": "Go."},
            {"type": "function_call", "call_id": "c1", "name": "spawn_agent",
             "namespace": "agents", "arguments": "{}"}]);
        let (request, _) = parse_with(json!({"input": input}), Thinks::Never).unwrap();
        let calls = messages_of(&request)[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0].function.name, "spawn_agent");
    }

    #[test]
    fn text_formats_are_a_chats_response_format() {
        let grammar = |format: Value| {
            parse_with(json!({"text": {"format": format}}), Thinks::Never)
                .map(|(r, echo)| (r.grammar, echo))
        };
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let (found, echo) =
            grammar(json!({"type": "json_schema", "name": "n", "schema": schema, "strict": true}))
                .unwrap();
        assert_eq!(found, Some(Grammar::JsonSchema(schema.clone())));
        assert_eq!(echo["text"]["format"]["name"], "n");
        assert_eq!(grammar(json!({"type": "text"})).unwrap().0, None);
        assert!(grammar(json!({"type": "json_object"})).unwrap().0.is_some());
        let (request, echo) = parse_with(json!({}), Thinks::Never).unwrap();
        assert_eq!(
            (request.grammar, request.format_param),
            (None, "text.format")
        );
        assert_eq!(echo["text"], json!({"format": {"type": "text"}}));
        for (format, expected) in [
            (
                json!({"type": "json_schema", "name": "n"}),
                "needs a schema",
            ),
            (json!({"type": "yaml"}), "text.format's type must be"),
            (json!("json"), "must be an object"),
        ] {
            let error = grammar(format).unwrap_err();
            assert_eq!(error.param, Some("text.format"));
            assert!(error.message.contains(expected), "{}", error.message);
        }
        let error = error(json!({"text": {"verbosity": "low"}}));
        assert_eq!(error.param, Some("text"));
    }

    /// `effort` switches Qwen3's `enable_thinking`; what a template cannot do is refused.
    #[test]
    fn effort_sets_the_templates_switch() {
        let kwargs = |effort: &str, thinks: Thinks| {
            parse_with(
                json!({"reasoning": {"effort": effort, "summary": "auto"}}),
                thinks,
            )
            .map(|(r, echo)| (r.template_kwargs, echo))
        };
        let (on, echo) = kwargs("high", Thinks::Switch).unwrap();
        assert_eq!(on["enable_thinking"], true);
        assert_eq!(
            echo["reasoning"],
            json!({"effort": "high", "summary": "auto"})
        );
        assert_eq!(
            kwargs("minimal", Thinks::Switch).unwrap().0["enable_thinking"],
            false
        );
        assert!(kwargs("medium", Thinks::Always).unwrap().0.is_empty());
        assert!(kwargs("none", Thinks::Never).unwrap().0.is_empty());
        for (effort, thinks, expected) in [
            ("high", Thinks::Never, "no reasoning"),
            ("none", Thinks::Always, "turn it off"),
            ("extreme", Thinks::Switch, "must be none"),
        ] {
            let error = kwargs(effort, thinks).unwrap_err();
            assert_eq!(error.param, Some("reasoning"));
            assert!(error.message.contains(expected), "{}", error.message);
        }
        let error = parse_with(
            json!({"reasoning": {"summary": "detailed"}}),
            Thinks::Switch,
        );
        assert_eq!(error.unwrap_err().param, Some("reasoning"));
        assert_eq!(
            Thinks::of(Some("{{ '<think>' }}{{ enable_thinking }}")),
            Thinks::Switch
        );
        assert_eq!(Thinks::of(Some("<think>\n")), Thinks::Always);
        assert_eq!(Thinks::of(None), Thinks::Never);
    }

    /// What the answer echoes, and what is refused by name: state, unknown fields, what
    /// this server cannot give.
    #[test]
    fn what_is_not_acted_on_is_refused_by_name() {
        let extra = json!({"max_output_tokens": 7, "temperature": 0, "top_p": 0.5, "store": true,
                           "metadata": {"k": "v"}, "user": "u", "truncation": "disabled",
                           "include": ["reasoning.encrypted_content"], "stream": true,
                           "prompt_cache_key": "c", "safety_identifier": "s",
                           "client_metadata": {"session_id": "x"}});
        let (request, echo) = parse_with(extra, Thinks::Never).unwrap();
        assert_eq!(request.max_tokens, Some(7));
        assert_eq!(request.max_tokens_param, "max_output_tokens");
        assert_eq!(
            (request.sampling.temperature, request.sampling.top_p),
            (0.0, 0.5)
        );
        assert!(request.stream && !request.fit_context);
        assert_eq!(echo["store"], false);
        assert_eq!(echo["metadata"], json!({"k": "v"}));
        assert_eq!(
            (&echo["user"], &echo["max_output_tokens"]),
            (&json!("u"), &json!(7))
        );
        for (extra, param, expected) in [
            (
                json!({"previous_response_id": "resp_1"}),
                Some("previous_response_id"),
                "stateless",
            ),
            (
                json!({"conversation": "conv_1"}),
                Some("conversation"),
                "stateless",
            ),
            (json!({"input": null}), Some("input"), "input is required"),
            (json!({"input": []}), Some("input"), "input is empty"),
            (json!({"input": 5}), Some("input"), "a string or a list"),
            (json!({"colour": 1}), None, "unknown field \"colour\""),
            (json!({"seed": 1}), None, "unknown field \"seed\""),
            (
                json!({"max_output_tokens": 0}),
                Some("max_output_tokens"),
                "at least 1",
            ),
            (json!({"temperature": 3}), Some("temperature"), "[0, 2]"),
            (
                json!({"truncation": "auto"}),
                Some("truncation"),
                "not supported",
            ),
            (
                json!({"include": ["message.output_text.logprobs"]}),
                Some("include"),
                "message.output_text.logprobs",
            ),
            (
                json!({"metadata": {"k": 1}}),
                Some("metadata"),
                "string values",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                Some("input"),
                "stores no items",
            ),
            (
                json!({"input": [{"type": "web_search_call"}]}),
                Some("input"),
                "\"web_search_call\"",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                Some("input"),
                "role \"tool\"",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
                Some("input"),
                "\"input_image\"",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}),
                Some("input"),
                "\"output_text\"",
            ),
            (
                json!({"input": [{"role": "user", "content": "x", "name": "n"}]}),
                Some("input"),
                "unknown field \"name\"",
            ),
            (
                json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]}),
                Some("input"),
                "not JSON",
            ),
            (
                json!({"input": [{"type": "function_call_output", "output": "x"}]}),
                Some("input"),
                "needs call_id",
            ),
        ] {
            let error = error(extra.clone());
            assert_eq!(error.param, param, "{extra}");
            assert!(
                error.message.contains(expected),
                "{extra}: {}",
                error.message
            );
        }
    }
}
