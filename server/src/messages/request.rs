//! The body of Anthropic's `POST /v1/messages` (and of `/v1/messages/count_tokens`) read into
//! the request `/v1/chat/completions` runs ([`Request`]): the conversation as OpenAI-shaped
//! messages (an assistant's `tool_use` blocks become its `tool_calls`, a user's `tool_result`
//! blocks `tool` messages), so that a chat template renders it as it renders a chat; the
//! tools as OpenAI's function tools, checked by [`api::tools`]. As there, a field this server
//! does not act on is refused by name, except those Anthropic's clients send that change
//! nothing here ([`HARMLESS`], a block's `cache_control` and `citations`).

use runtime::generate::sampling::SamplingParams;
use runtime::text::chat::{Arguments, FunctionCall, Message, ToolCall};
use runtime::text::grammar::Grammar;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::api::{self, Prompt, Request, Tools, take};
use crate::error::ApiError;

/// Fields accepted with no effect: who the caller is (`metadata`), a mark asking for the
/// prompt to be cached (`cache_control`: every finished request's cache is kept here), the
/// capacity tier (there is one).
const HARMLESS: [&str; 3] = ["metadata", "cache_control", "service_tier"];

/// Most stop sequences one request may give: each is looked for after every token.
pub const MAX_STOP_SEQUENCES: usize = 16;

/// What the body is for: an answer, or only its prompt's length (`count_tokens`, whose body
/// has no `max_tokens`, sampling or `stream`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    Create,
    Count,
}

/// Reads a Messages API body. `thinks`: the chat template knows `<think>` sections, so an
/// assistant turn's `thinking` blocks go back into its content as one (the template keeps or
/// drops them, as Qwen3's keeps those of the turn under way); otherwise they are dropped, as
/// a template that never saw reasoning has nowhere to put it.
pub(crate) fn parse(body: &[u8], purpose: Purpose, thinks: bool) -> Result<Request, ApiError> {
    let mut fields = api::object(body)?;
    let turns = turns(body, &mut fields)?;
    let model: String = take(&mut fields, "model")?.ok_or_else(|| required("model"))?;
    let mut messages = match take::<Value>(&mut fields, "system")? {
        Some(system) => vec![Message::new("system", text_blocks(system, "system")?)],
        None => Vec::new(),
    };
    messages.extend(conversation(turns, thinks)?);
    let tools = tools(&mut fields)?;
    let template_kwargs = thinking(&mut fields)?;
    let grammar = output_config(&mut fields)?;
    api::format_with_tools(grammar.as_ref(), tools.as_ref(), "output_config")?;
    context_management(&mut fields)?;
    let mut request = Request {
        prompts: vec![Prompt::Chat(messages)],
        max_tokens: None,
        max_tokens_param: "max_tokens",
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        stream: false,
        include_usage: false,
        model: Some(model),
        logprobs: None,
        cache_salt: None,
        draft_limit: None,
        n: 1,
        grammar,
        format_param: "output_config",
        tools,
        template_kwargs,
        // Anthropic's newer models stop at the context's end (`model_context_window_exceeded`)
        // rather than refuse a `max_tokens` past it, which its clients send (32000, say)
        // whatever the model's context.
        fit_context: true,
    };
    if purpose == Purpose::Create {
        generation(&mut fields, &mut request)?;
    }
    for field in HARMLESS {
        fields.remove(field);
    }
    match fields.keys().next() {
        Some(field) => Err(ApiError::invalid(format!("unknown field {field:?}"))),
        None => Ok(request),
    }
}

/// `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k` and `stream`.
fn generation(fields: &mut Map<String, Value>, request: &mut Request) -> Result<(), ApiError> {
    let max_tokens: usize = take(fields, "max_tokens")?.ok_or_else(|| required("max_tokens"))?;
    if max_tokens == 0 {
        // Anthropic's 0 warms its prompt cache without an answer: nothing to run here.
        return Err(ApiError::invalid_field(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    let stop: Vec<String> = take(fields, "stop_sequences")?.unwrap_or_default();
    if stop.len() > MAX_STOP_SEQUENCES || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_field(
            "stop_sequences",
            format!("stop_sequences takes up to {MAX_STOP_SEQUENCES} non-empty strings"),
        ));
    }
    // Anthropic's ranges and defaults: temperature 1 in [0, 1], no top_p or top_k.
    let temperature: f32 = take(fields, "temperature")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&temperature) {
        return Err(ApiError::invalid_field(
            "temperature",
            format!("temperature {temperature} must be in [0, 1]"),
        ));
    }
    let top_p: f32 = take(fields, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_field(
            "top_p",
            format!("top_p {top_p} must be in (0, 1]"),
        ));
    }
    let top_k: usize = take(fields, "top_k")?.unwrap_or(0);
    request.sampling = SamplingParams {
        temperature,
        top_p,
        top_k,
        seed: rand::random(),
        ..SamplingParams::default()
    };
    request.sampling.validate().map_err(ApiError::invalid)?;
    request.max_tokens = Some(max_tokens);
    request.stop = stop;
    request.stream = take(fields, "stream")?.unwrap_or(false);
    Ok(())
}

/// `output_config`: `format`, a JSON Schema the answer must satisfy (`{"type":
/// "json_schema", "schema"}`: the grammar chat's `response_format` gives), and `effort`, how
/// much work Anthropic's models put into an answer, which Claude Code sends with every
/// request: accepted, without effect (a model here has no such setting).
fn output_config(fields: &mut Map<String, Value>) -> Result<Option<Grammar>, ApiError> {
    let refused = |message: String| ApiError::invalid_field("output_config", message);
    let Some(mut config) = take::<Map<String, Value>>(fields, "output_config")? else {
        return Ok(None);
    };
    match config.remove("effort") {
        None | Some(Value::Null | Value::String(_)) => {}
        Some(_) => return Err(refused("output_config.effort must be a string".into())),
    }
    let grammar = match config.remove("format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(mut format)) => {
            if format
                .remove("type")
                .is_none_or(|kind| kind != "json_schema")
            {
                return Err(refused(
                    "output_config.format's type must be json_schema".into(),
                ));
            }
            let schema = match format.remove("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => schema,
                _ => {
                    return Err(refused(
                        "output_config.format needs schema, an object".into(),
                    ));
                }
            };
            if let Some(key) = format.keys().next() {
                return Err(refused(format!(
                    "output_config.format.{key} is not supported"
                )));
            }
            Some(Grammar::JsonSchema(schema))
        }
        Some(_) => return Err(refused("output_config.format must be an object".into())),
    };
    match config.keys().next() {
        Some(key) => Err(refused(format!("output_config.{key} is not supported"))),
        None => Ok(grammar),
    }
}

/// `context_management`: edits Anthropic's server makes to a long conversation before
/// running it. Clearing earlier turns' thinking (`clear_thinking_*`, which Claude Code asks
/// for) is accepted: which earlier reasoning a prompt shows is the chat template's choice
/// here. Any other edit (clearing tool results) would change the prompt and is refused.
fn context_management(fields: &mut Map<String, Value>) -> Result<(), ApiError> {
    let refused = |message: String| ApiError::invalid_field("context_management", message);
    let Some(mut config) = take::<Map<String, Value>>(fields, "context_management")? else {
        return Ok(());
    };
    let edits: Vec<Map<String, Value>> = match config.remove("edits") {
        None | Some(Value::Null) => Vec::new(),
        Some(edits) => serde_json::from_value(edits)
            .map_err(|_| refused("context_management.edits must be a list of objects".into()))?,
    };
    for edit in edits {
        match edit.get("type").and_then(Value::as_str) {
            Some(kind) if kind.starts_with("clear_thinking") => {}
            kind => {
                return Err(refused(format!(
                    "the context_management edit {kind:?} is not supported: send the conversation as it should run"
                )));
            }
        }
    }
    match config.keys().next() {
        Some(key) => Err(refused(format!(
            "context_management.{key} is not supported"
        ))),
        None => Ok(()),
    }
}

fn required(field: &'static str) -> ApiError {
    ApiError::invalid_field(field, format!("{field}: Field required"))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid_field("messages", message)
}

/// A turn as sent: its content read later, block by block.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn<'a> {
    role: String,
    #[serde(borrow)]
    content: &'a RawValue,
}

/// `messages`, read from the body's text rather than from its parsed fields: a `tool_use`
/// block's `input` is kept as written (its keys in their order, its numbers exact), as an
/// OpenAI call's arguments are.
fn turns(
    body: &[u8],
    fields: &mut Map<String, Value>,
) -> Result<Vec<(String, Vec<Block>)>, ApiError> {
    #[derive(Deserialize)]
    struct Conversation<'a> {
        #[serde(borrow)]
        messages: Option<Vec<Turn<'a>>>,
    }
    fields.remove("messages");
    let conversation: Conversation =
        (serde_json::from_slice(body)).map_err(|e| invalid(format!("messages: {e}")))?;
    let turns = conversation.messages.ok_or_else(|| required("messages"))?;
    if turns.is_empty() {
        return Err(invalid("messages: at least one message is required"));
    }
    (turns.into_iter())
        .map(|turn| {
            if !matches!(turn.role.as_str(), "user" | "assistant" | "system") {
                return Err(invalid(format!(
                    "messages: role {:?} is not one of user, assistant, system",
                    turn.role
                )));
            }
            let blocks = blocks(turn.content, &turn.role)?;
            Ok((turn.role, blocks))
        })
        .collect()
}

/// A content block, as the conversation needs it.
enum Block {
    Text(String),
    Thinking(String),
    ToolUse(ToolCall),
    ToolResult {
        id: String,
        content: String,
    },
    /// `redacted_thinking`: encrypted reasoning no model here can read.
    Dropped,
}

/// A turn's content: a string (one text block) or a list of blocks.
fn blocks(content: &RawValue, role: &str) -> Result<Vec<Block>, ApiError> {
    if content.get().starts_with('"') {
        let text = serde_json::from_str(content.get()).map_err(|e| invalid(e.to_string()))?;
        return Ok(vec![Block::Text(text)]);
    }
    let blocks: Vec<&RawValue> = serde_json::from_str(content.get()).map_err(|e| {
        invalid(format!(
            "messages: content must be a string or a list of content blocks: {e}"
        ))
    })?;
    blocks.into_iter().map(|raw| block(raw, role)).collect()
}

fn block(raw: &RawValue, role: &str) -> Result<Block, ApiError> {
    let mut fields: Map<String, Value> = serde_json::from_str(raw.get())
        .map_err(|_| invalid("messages: each content block must be an object"))?;
    let kind = match fields.remove("type") {
        Some(Value::String(kind)) => kind,
        _ => return Err(invalid("messages: each content block needs a type")),
    };
    let string = |fields: &mut Map<String, Value>, key: &str| match fields.remove(key) {
        Some(Value::String(value)) => Ok(value),
        _ => Err(invalid(format!(
            "messages: a {kind} block needs {key}, a string"
        ))),
    };
    let block = match (kind.as_str(), role) {
        ("text", _) => {
            fields.remove("citations");
            Block::Text(string(&mut fields, "text")?)
        }
        ("thinking", "assistant") => {
            // Ours are unsigned (`""`); another's signature means nothing here.
            string(&mut fields, "signature")?;
            Block::Thinking(string(&mut fields, "thinking")?)
        }
        ("redacted_thinking", "assistant") => {
            string(&mut fields, "data")?;
            Block::Dropped
        }
        ("tool_use", "assistant") => Block::ToolUse(tool_use(raw, &mut fields, string)?),
        ("tool_result", "user") => {
            let id = string(&mut fields, "tool_use_id")?;
            let content = match fields.remove("content") {
                None | Some(Value::Null) => String::new(),
                Some(content) => text_blocks(content, "a tool_result's content")?,
            };
            // The templates have no place for it: the model reads it in the result.
            let content = match fields.remove("is_error") {
                None | Some(Value::Null | Value::Bool(false)) => content,
                Some(Value::Bool(true)) => format!("Error: {content}"),
                Some(_) => return Err(invalid("messages: is_error must be a boolean")),
            };
            Block::ToolResult { id, content }
        }
        ("thinking" | "redacted_thinking" | "tool_use" | "tool_result", role) => {
            return Err(invalid(format!(
                "messages: a {role} message cannot have {kind} blocks"
            )));
        }
        (kind, _) => {
            return Err(invalid(format!(
                "messages: content blocks of type {kind:?} are not supported: this server reads text, tool_use, tool_result and thinking blocks"
            )));
        }
    };
    fields.remove("cache_control");
    match fields.keys().next() {
        Some(key) => Err(invalid(format!(
            "messages: unknown field {key:?} in a {kind} block"
        ))),
        None => Ok(block),
    }
}

/// A `tool_use` block as the call an assistant turn made, its `input` read from the block's
/// text as an OpenAI call's arguments are read ([`Arguments`]).
fn tool_use(
    raw: &RawValue,
    fields: &mut Map<String, Value>,
    string: impl Fn(&mut Map<String, Value>, &str) -> Result<String, ApiError>,
) -> Result<ToolCall, ApiError> {
    #[derive(Deserialize)]
    struct Input<'a> {
        #[serde(borrow)]
        input: Option<&'a RawValue>,
    }
    let id = string(fields, "id")?;
    let name = string(fields, "name")?;
    if !fields
        .remove("input")
        .is_some_and(|input| input.is_object())
    {
        return Err(invalid(format!(
            "messages: the tool_use block {id:?} needs input, an object"
        )));
    }
    let input: Input = serde_json::from_str(raw.get()).map_err(|e| invalid(e.to_string()))?;
    let text = input.input.map_or("{}", RawValue::get);
    let arguments = Arguments::from_json(text).map_err(|e| invalid(e.to_string()))?;
    Ok(ToolCall {
        id,
        kind: "function".into(),
        function: FunctionCall { name, arguments },
    })
}

/// Text given as a string or a list of text blocks (joined by newlines): `system`, a
/// tool_result's content.
fn text_blocks(value: Value, what: &str) -> Result<String, ApiError> {
    let refused = || ApiError::invalid(format!("{what} must be a string or a list of text blocks"));
    let blocks = match value {
        Value::String(text) => return Ok(text),
        Value::Array(blocks) => blocks,
        _ => return Err(refused()),
    };
    let texts = blocks.into_iter().map(|block| {
        let Value::Object(mut fields) = block else {
            return Err(refused());
        };
        for harmless in ["cache_control", "citations"] {
            fields.remove(harmless);
        }
        match (fields.remove("type"), fields.remove("text")) {
            (Some(kind), Some(Value::String(text))) if kind == "text" && fields.is_empty() => {
                Ok(text)
            }
            _ => Err(refused()),
        }
    });
    Ok(texts.collect::<Result<Vec<_>, _>>()?.join("\n"))
}

/// The turns as chat messages. Consecutive turns of a role are one turn (as Anthropic
/// combines them); a user turn's tool results are `tool` messages, in order with its text; a
/// last turn of the assistant is refused: Anthropic continues it (prefill), and a chat
/// template would start a new turn after it instead.
fn conversation(turns: Vec<(String, Vec<Block>)>, thinks: bool) -> Result<Vec<Message>, ApiError> {
    let mut merged: Vec<(String, Vec<Block>)> = Vec::with_capacity(turns.len());
    for (role, blocks) in turns {
        match merged.last_mut() {
            Some((last, earlier)) if *last == role => earlier.extend(blocks),
            _ => merged.push((role, blocks)),
        }
    }
    if merged.last().is_some_and(|(role, _)| role == "assistant") {
        return Err(invalid(
            "messages: the last message is the assistant's: continuing it (prefill) is not supported; end with a user message",
        ));
    }
    let mut messages = Vec::new();
    for (role, blocks) in merged {
        match role.as_str() {
            "assistant" => messages.push(assistant(blocks, thinks)),
            _ => user(&role, blocks, &mut messages),
        }
    }
    Ok(messages)
}

/// A user (or system) turn: its text, split where tool results come between.
fn user(role: &str, blocks: Vec<Block>, messages: &mut Vec<Message>) {
    let mut texts: Option<Vec<String>> = None;
    let flush = |texts: &mut Option<Vec<String>>, messages: &mut Vec<Message>| {
        if let Some(texts) = texts.take() {
            messages.push(Message::new(role, texts.join("\n")));
        }
    };
    for block in blocks {
        match block {
            Block::Text(text) => texts.get_or_insert_default().push(text),
            Block::ToolResult { id, content } => {
                flush(&mut texts, messages);
                messages.push(Message {
                    role: "tool".into(),
                    content: Some(content),
                    tool_calls: None,
                    tool_call_id: Some(id),
                });
            }
            // Refused by role when read.
            Block::Thinking(_) | Block::ToolUse(_) | Block::Dropped => {}
        }
    }
    flush(&mut texts, messages);
}

/// An assistant turn: its text, its calls, its reasoning as a `<think>` section before the
/// text when the template knows them.
fn assistant(blocks: Vec<Block>, thinks: bool) -> Message {
    let (mut texts, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for block in blocks {
        match block {
            Block::Text(text) => texts.push(text),
            Block::Thinking(text) => thinking.push(text),
            Block::ToolUse(call) => calls.push(call),
            Block::ToolResult { .. } | Block::Dropped => {}
        }
    }
    let mut content = texts.join("\n");
    if thinks && !thinking.is_empty() {
        content = format!("<think>\n{}\n</think>\n\n{content}", thinking.join("\n"));
    }
    Message {
        role: "assistant".into(),
        content: Some(content),
        tool_calls: (!calls.is_empty()).then_some(calls),
        tool_call_id: None,
    }
}

/// `tools` and `tool_choice` in OpenAI's shapes, checked as a chat's are: `{name,
/// description, input_schema}` a function tool, `auto`/`any`/`tool`/`none` OpenAI's
/// `auto`/`required`/a named function/`none`, `disable_parallel_tool_use` the opposite of
/// `parallel_tool_calls`. Anthropic's server tools (web search, code execution...) are
/// refused: nothing here runs them.
fn tools(fields: &mut Map<String, Value>) -> Result<Option<Tools>, ApiError> {
    let offered: Vec<Map<String, Value>> = take(fields, "tools")?.unwrap_or_default();
    let refused = |message: String| ApiError::invalid_field("tools", message);
    let mut functions = Vec::with_capacity(offered.len());
    for (i, mut tool) in offered.into_iter().enumerate() {
        match tool.remove("type") {
            None | Some(Value::Null) => {}
            Some(kind) if kind == "custom" => {}
            Some(kind) => {
                return Err(refused(format!(
                    "tools[{i}] is of type {kind}, a tool Anthropic's servers run; this server runs none (give custom tools: name, description, input_schema)"
                )));
            }
        }
        tool.remove("cache_control");
        let mut function = Map::new();
        for key in ["name", "description"] {
            if let Some(value) = tool.remove(key) {
                function.insert(key.into(), value);
            }
        }
        let schema = (tool.remove("input_schema"))
            .ok_or_else(|| refused(format!("tools[{i}] needs input_schema")))?;
        function.insert("parameters".into(), schema);
        if let Some(key) = tool.keys().next() {
            return Err(refused(format!(
                "tools[{i}].{key} is not supported by this server"
            )));
        }
        functions.push(json!({"type": "function", "function": function}));
    }
    let mut openai = Map::new();
    openai.insert("tools".into(), functions.into());
    if let Some(choice) = take::<Map<String, Value>>(fields, "tool_choice")? {
        let (choice, parallel) = tool_choice(choice)?;
        openai.insert("tool_choice".into(), choice);
        openai.insert("parallel_tool_calls".into(), parallel.into());
    }
    api::tools(&mut openai)
}

/// Anthropic's `tool_choice` as OpenAI's, and whether calls may come in parallel.
fn tool_choice(mut choice: Map<String, Value>) -> Result<(Value, bool), ApiError> {
    let refused = |message: &str| ApiError::invalid_field("tool_choice", message);
    let parallel = match choice.remove("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(disabled)) => !disabled,
        Some(_) => return Err(refused("disable_parallel_tool_use must be a boolean")),
    };
    let openai = match choice.remove("type").as_ref().and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.remove("name") {
            Some(Value::String(name)) => json!({"type": "function", "function": {"name": name}}),
            _ => return Err(refused("tool_choice of type tool needs the tool's name")),
        },
        _ => {
            return Err(refused(
                "tool_choice's type must be auto, any, tool or none",
            ));
        }
    };
    match choice.keys().next() {
        Some(key) => Err(refused(&format!("tool_choice.{key} is not supported"))),
        None => Ok((openai, parallel)),
    }
}

/// `thinking` as the chat template's `enable_thinking` (Qwen3's and SmolLM3's switch):
/// `enabled` true, `disabled` false, `adaptive` the template's default (the model's choice).
/// `budget_tokens` is required, as Anthropic requires it, but not enforced: the reasoning
/// counts against `max_tokens`, as Anthropic's does. A template without the switch ignores
/// it; the answer then has no thinking block, as a model that chose not to think.
fn thinking(fields: &mut Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let refused = |message: String| ApiError::invalid_field("thinking", message);
    let mut kwargs = Map::new();
    let Some(mut config) = take::<Map<String, Value>>(fields, "thinking")? else {
        return Ok(kwargs);
    };
    match config.remove("display") {
        None | Some(Value::Null) => {}
        Some(display) if display == "summarized" => {}
        Some(display) => {
            return Err(refused(format!(
                "thinking.display {display} is not supported: the reasoning is returned as written"
            )));
        }
    }
    let enable = match config.remove("type").as_ref().and_then(Value::as_str) {
        Some("enabled") => {
            let budget = config.remove("budget_tokens");
            if budget
                .as_ref()
                .and_then(Value::as_u64)
                .is_none_or(|n| n == 0)
            {
                return Err(refused(
                    "thinking of type enabled needs budget_tokens, a positive integer".into(),
                ));
            }
            Some(true)
        }
        Some("disabled") => Some(false),
        Some("adaptive") => None,
        _ => {
            return Err(refused(
                "thinking's type must be enabled, disabled or adaptive".into(),
            ));
        }
    };
    if let Some(key) = config.keys().next() {
        return Err(refused(format!("thinking.{key} is not supported")));
    }
    if let Some(enable) = enable {
        kwargs.insert("enable_thinking".into(), enable.into());
    }
    Ok(kwargs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ToolChoice;

    /// A body with `extra`'s fields, where the string `"INPUT"` stands for a call's input
    /// as written in [`INPUT`] (JSON values cannot hold it: a number past 64 bits).
    fn parse_with(extra: Value, thinks: bool) -> Result<Request, ApiError> {
        let mut body = json!({"model": "m", "max_tokens": 5,
                              "messages": [{"role": "user", "content": "Hi"}]});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        let body = body.to_string().replace(r#""INPUT""#, INPUT);
        parse(body.as_bytes(), Purpose::Create, thinks)
    }

    const INPUT: &str = r#"{"z": 98765432109876543210987654321, "a": [1.0]}"#;

    fn messages_of(request: &Request) -> &[Message] {
        let [Prompt::Chat(messages)] = &request.prompts[..] else {
            panic!("a chat prompt")
        };
        messages
    }

    fn error(extra: Value) -> String {
        parse_with(extra, false).unwrap_err().message
    }

    /// A conversation that used a tool: turns of a role merged, blocks joined by newlines,
    /// a call's input as written (key order, a number past 64 bits), its result a `tool`
    /// message (an error's marked), earlier reasoning a `<think>` section or dropped.
    #[test]
    fn a_conversation_becomes_a_chats_messages() {
        let conversation = json!({
            "system": [{"type": "text", "text": "Be brief."},
                       {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "user", "content": [{"type": "text", "text": "In Paris."}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "A call.", "signature": ""},
                    {"type": "redacted_thinking", "data": "xyz"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f",
                     "input": "INPUT"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
                     "content": [{"type": "text", "text": "down"}]},
                    {"type": "text", "text": "Thanks."}]},
            ],
        });
        let request = parse_with(conversation.clone(), true).unwrap();
        let messages = messages_of(&request);
        let summary: Vec<(&str, &str, Option<&str>)> = (messages.iter())
            .map(|m| (m.role.as_str(), m.text(), m.tool_call_id.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                ("system", "Be brief.\nBe kind.", None),
                ("user", "Weather?\nIn Paris.", None),
                ("assistant", "<think>\nA call.\n</think>\n\n", None),
                ("tool", "21", Some("toolu_1")),
                ("tool", "Error: down", Some("toolu_1")),
                ("user", "Thanks.", None),
            ]
        );
        let calls = messages[2].tool_calls.as_ref().unwrap();
        assert_eq!(
            (calls[0].id.as_str(), calls[0].function.name.as_str()),
            ("toolu_1", "f")
        );
        assert_eq!(
            calls[0].function.arguments,
            Arguments::from_json(INPUT).unwrap()
        );
        // A template without `<think>`: the reasoning is dropped.
        let request = parse_with(conversation, false).unwrap();
        assert_eq!(messages_of(&request)[2].text(), "");
        assert!(request.fit_context && request.max_tokens == Some(5));
    }

    #[test]
    fn tools_and_choices_are_openais() {
        let tools = json!([{"name": "f", "description": "F.", "cache_control": {"type": "ephemeral"},
                            "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                           {"type": "custom", "name": "g", "input_schema": {"type": "object"}}]);
        let read = |choice: Value| {
            let mut extra = json!({"tools": tools});
            if !choice.is_null() {
                extra["tool_choice"] = choice;
            }
            parse_with(extra, false).map(|r| r.tools.unwrap())
        };
        let auto = read(Value::Null).unwrap();
        assert_eq!((&auto.choice, auto.parallel), (&ToolChoice::Auto, true));
        assert_eq!(
            auto.offered[0]["function"]["parameters"],
            tools[0]["input_schema"]
        );
        assert_eq!(auto.offered[0]["function"]["description"], "F.");
        let any = read(json!({"type": "any", "disable_parallel_tool_use": true})).unwrap();
        assert_eq!((any.choice, any.parallel), (ToolChoice::Required, false));
        let named = read(json!({"type": "tool", "name": "g"})).unwrap();
        assert_eq!(named.choice, ToolChoice::Function("g".into()));
        assert_eq!(
            read(json!({"type": "none"})).unwrap().choice,
            ToolChoice::None
        );
        for (choice, expected) in [
            (json!({"type": "tool", "name": "h"}), "not among the tools"),
            (json!({"type": "tool"}), "needs the tool's name"),
            (json!({"type": "required"}), "auto, any, tool or none"),
            (json!({"type": "auto", "colour": 1}), "tool_choice.colour"),
        ] {
            let message = read(choice).unwrap_err().message;
            assert!(message.contains(expected), "{message}");
        }
        for (tools, expected) in [
            (
                json!([{"type": "bash_20250124", "name": "bash"}]),
                "this server runs none",
            ),
            (json!([{"name": "f"}]), "needs input_schema"),
            (
                json!([{"name": "f", "input_schema": {}, "strict": true}]),
                "tools[0].strict",
            ),
            (
                json!([{"name": "a b", "input_schema": {}}]),
                "letters, digits",
            ),
        ] {
            let message = error(json!({"tools": tools}));
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn claude_codes_output_config_and_context_management_are_read() {
        let request = parse_with(
            json!({"output_config": {"effort": "high"},
                   "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}),
            false,
        )
        .unwrap();
        assert!(request.grammar.is_none());
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let request = parse_with(
            json!({"output_config": {"format": {"type": "json_schema", "schema": schema}}}),
            false,
        )
        .unwrap();
        assert!(matches!(&request.grammar, Some(Grammar::JsonSchema(s)) if *s == schema));
        for (extra, named) in [
            (
                json!({"output_config": {"format": {"type": "text"}}}),
                "json_schema",
            ),
            (
                json!({"output_config": {"format": {"type": "json_schema"}}}),
                "schema",
            ),
            (json!({"output_config": {"effort": 3}}), "effort"),
            (json!({"output_config": {"verbosity": "low"}}), "verbosity"),
            (
                json!({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),
                "clear_tool_uses",
            ),
        ] {
            let e = parse_with(extra.clone(), false).unwrap_err();
            assert_eq!(e.status, 400, "{extra}");
            assert!(e.message.contains(named), "{extra}: {}", e.message);
        }
    }

    #[test]
    fn thinking_sets_the_templates_switch() {
        let kwargs = |thinking: Value| {
            parse_with(json!({"thinking": thinking}), true).map(|r| r.template_kwargs)
        };
        let enabled = kwargs(json!({"type": "enabled", "budget_tokens": 1024})).unwrap();
        assert_eq!(enabled["enable_thinking"], true);
        assert_eq!(
            kwargs(json!({"type": "disabled"})).unwrap()["enable_thinking"],
            false
        );
        assert!(
            kwargs(json!({"type": "adaptive", "display": "summarized"}))
                .unwrap()
                .is_empty()
        );
        for thinking in [
            json!({"type": "enabled"}),
            json!({"type": "enabled", "budget_tokens": 0}),
            json!({"type": "between_tools"}),
            json!({"type": "adaptive", "display": "omitted"}),
            json!({"type": "disabled", "budget_tokens": 5}),
        ] {
            assert_eq!(
                kwargs(thinking.clone()).unwrap_err().param,
                Some("thinking"),
                "{thinking}"
            );
        }
    }

    #[test]
    fn what_is_not_acted_on_is_refused_by_name() {
        for (extra, expected) in [
            (json!({"max_tokens": null}), "max_tokens: Field required"),
            (json!({"max_tokens": 0}), "at least 1"),
            (json!({"temperature": 1.2}), "[0, 1]"),
            (json!({"top_p": 0}), "(0, 1]"),
            (json!({"stop_sequences": [""]}), "non-empty"),
            (json!({"stop_sequences": vec!["x"; 17]}), "up to 16"),
            (json!({"container": "c"}), "unknown field \"container\""),
            (json!({"messages": []}), "at least one message"),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "role \"tool\"",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "name": "n"}]}),
                "unknown field",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "\"image\"",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "colour": 1}]}]}),
                "\"colour\" in a text block",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "1", "name": "f", "input": {}}]}]}),
                "user message cannot have tool_use",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "1"}]}, {"role": "user", "content": "x"}]}),
                "assistant message cannot have tool_result",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "f", "input": [1]}]}, {"role": "user", "content": "x"}]}),
                "input, an object",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}),
                "prefill",
            ),
            (json!({"system": [{"type": "image"}]}), "system must be"),
        ] {
            let message = error(extra.clone());
            assert!(message.contains(expected), "{extra}: {message}");
        }
        // Accepted without effect.
        let harmless = json!({"metadata": {"user_id": "u"}, "cache_control": {"type": "ephemeral"},
                              "service_tier": "auto", "stream": true, "top_k": 5,
                              "stop_sequences": ["\n\n"]});
        let request = parse_with(harmless, false).unwrap();
        assert!(request.stream && request.sampling.top_k == 5 && request.stop == ["\n\n"]);
        // Counting takes no answer's fields.
        let count = |body: Value| parse(body.to_string().as_bytes(), Purpose::Count, false);
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]});
        count(body.clone()).unwrap();
        let mut with_max = body;
        with_max["max_tokens"] = 5.into();
        assert!(count(with_max).unwrap_err().message.contains("max_tokens"));
    }
}
