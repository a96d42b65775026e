//! Tool calls in a model's own format: which format a chat template teaches ([`Format`]),
//! a grammar that makes the model call a tool ([`Format::grammar`]), and the model's text
//! read back into calls as it streams ([`Parser`]).
//!
//! Two families are known, as llama.cpp tells them apart, by their template's text:
//! - Hermes (Qwen2.5, Hermes 2 Pro, and the ChatML templates written after them): each call
//!   a `<tool_call>` block holding `{"name": ..., "arguments": {...}}`, any other text
//!   the message's content.
//! - Llama 3.x: the whole message is one call, `{"name": ..., "parameters": {...}}`
//!   (after `<|python_tag|>`, a special token the text never shows), or several joined by
//!   `;`.
//!
//! A block or message that is not a call of an offered tool (an unknown name, broken JSON)
//! stays content: a call is never invented.

use std::convert::Infallible;

use serde_json::{Map, Value, json};

use crate::text::grammar::{Grammar, for_each_schema};
use crate::text::trim::{Trimmed, partial_suffix};

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`, one block a call.
    Hermes,
    /// `{"name": ..., "parameters": ...}`, the whole message.
    Llama3,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A tool the model may call: a function's name and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub parameters: Value,
}

/// A call the model made: the tool's name and its arguments as JSON text (compact, keys in
/// the model's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// What the model's text says, piece by piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Content(String),
    Call(Call),
}

impl Format {
    /// The format `template` teaches, if it renders tools in one of the known formats.
    pub fn of_template(template: &str) -> Option<Format> {
        if template.contains(OPEN) {
            Some(Format::Hermes)
        } else if template.contains("<|start_header_id|>ipython<|end_header_id|>") {
            Some(Format::Llama3)
        } else {
            None
        }
    }

    /// The text that starts a call, where a vocabulary may have it as one token.
    pub fn start(self) -> &'static str {
        match self {
            Format::Hermes => OPEN,
            Format::Llama3 => "<|python_tag|>",
        }
    }

    /// A grammar under which the model's whole message is calls of `tools` in this format:
    /// one, or with `parallel` one or more (Hermes; a Llama 3 message holds one call). The
    /// tools' names are unique and of letters, digits, `_` and `-` (OpenAI's rule, which
    /// the server checks): each names its parameters' place in the grammar's schema.
    pub fn grammar(self, tools: &[Tool], parallel: bool) -> Grammar {
        let schema = |arguments| call_schema(tools, arguments);
        match self {
            Format::Hermes => Grammar::Delimited {
                schema: schema("arguments"),
                open: format!("{OPEN}\n"),
                close: format!("\n{CLOSE}"),
                separator: parallel.then(|| "\n".to_string()),
            },
            Format::Llama3 => Grammar::JsonSchema(schema("parameters")),
        }
    }
}

/// The JSON Schema of one call of `tools`: an offered tool's name, and under `arguments` (the
/// format's key) arguments valid against its parameters. Each tool's parameters are put under
/// `$defs`, named by the tool, with their own references (`#`, `#/$defs/...`, any `#/...`)
/// pointed there: pasted into the call as written they would resolve against the call's
/// schema instead (issue 42).
fn call_schema(tools: &[Tool], arguments: &str) -> Value {
    let mut defs = Map::new();
    let each: Vec<Value> = (tools.iter())
        .map(|tool| {
            defs.insert(tool.name.clone(), embedded(&tool.name, &tool.parameters));
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": tool.name},
                    arguments: {"$ref": format!("#/$defs/{}", tool.name)},
                },
                "required": ["name", arguments],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({ "anyOf": each, "$defs": defs })
}

/// A tool's parameters as they are to sit at `#/$defs/{name}` of the call's schema: each
/// reference into the parameters (`#` and any `#/...`) pointed at that place. The root's
/// `$id` goes: it would make those references resolve against the tool's schema alone.
fn embedded(name: &str, parameters: &Value) -> Value {
    let mut schema = parameters.clone();
    if let Value::Object(root) = &mut schema {
        root.remove("$id");
    }
    let place = format!("#/$defs/{name}");
    let Ok(()) = for_each_schema::<Infallible>(&mut schema, "", &mut |object, _| {
        let pointer = match object.get("$ref").and_then(Value::as_str) {
            Some(reference) => reference.strip_prefix('#'),
            None => None,
        };
        // `#name` (an `$anchor`) is not a pointer: left as written.
        if let Some(pointer) = pointer.filter(|p| p.is_empty() || p.starts_with('/')) {
            let pointer = format!("{place}{pointer}");
            object.insert("$ref".into(), pointer.into());
        }
        Ok(())
    });
    schema
}

/// Reads a model's text into content and calls as it arrives. Content is the text outside
/// calls with the whitespace at either end left out (what a message's `content` is); it
/// streams as it comes, except a tail that may begin a call, and whitespace, which waits
/// for text after it. The deltas of any split of a text join to those of the whole.
#[derive(Debug)]
pub struct Parser {
    format: Format,
    names: Vec<String>,
    /// Text not yet told apart: a tail that may open a call, a call's body, or (Llama 3) a
    /// message that may be a call.
    held: String,
    state: State,
    content: Trimmed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Hermes: outside a block. Llama 3: the message's first character not seen yet.
    Text,
    /// Hermes: inside a `<tool_call>` block.
    Block,
    /// Llama 3: the message is plain content.
    Content,
    /// Llama 3: the message starts with `{`, so it may be a call; decided at the end.
    Object,
}

impl Parser {
    /// A parser of `format`, taking calls of the tools named `names` only.
    pub fn new(format: Format, names: Vec<String>) -> Self {
        Parser {
            format,
            names,
            held: String::new(),
            state: State::Text,
            content: Trimmed::default(),
        }
    }

    /// The parser's reading of the text so far: what can be told of it.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        match self.format {
            Format::Hermes => self.hermes(&mut out, false),
            Format::Llama3 => self.llama3(&mut out, false),
        }
        out
    }

    /// The rest, at the end of the message.
    pub fn finish(mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        match self.format {
            Format::Hermes => self.hermes(&mut out, true),
            Format::Llama3 => self.llama3(&mut out, true),
        }
        out
    }

    /// A whole message read at once: its content (`None` when empty) and calls.
    pub fn parse(format: Format, names: Vec<String>, text: &str) -> (Option<String>, Vec<Call>) {
        let mut parser = Parser::new(format, names);
        let mut deltas = parser.push(text);
        deltas.extend(parser.finish());
        let (mut content, mut calls) = (String::new(), Vec::new());
        for delta in deltas {
            match delta {
                Delta::Content(text) => content.push_str(&text),
                Delta::Call(call) => calls.push(call),
            }
        }
        ((!content.is_empty()).then_some(content), calls)
    }

    fn hermes(&mut self, out: &mut Vec<Delta>, end: bool) {
        loop {
            match self.state {
                State::Block => match block_end(&self.held) {
                    Some(at) => {
                        let body = self.held[..at].to_string();
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::Text;
                        self.block(out, &body);
                    }
                    None if end => {
                        let body = std::mem::take(&mut self.held);
                        self.unclosed_block(out, &body);
                        return;
                    }
                    None => return,
                },
                _ => match self.held.find(OPEN) {
                    Some(at) => {
                        let before = self.held[..at].to_string();
                        self.held.drain(..at + OPEN.len());
                        self.content(out, &before);
                        self.state = State::Block;
                    }
                    None => {
                        // Hold back a tail that may be the start of `<tool_call>`, until the
                        // end: a message that ends in one wrote text, not a call (issue 42).
                        let keep = if end {
                            0
                        } else {
                            partial_suffix(&self.held, OPEN)
                        };
                        let text: String = self.held.drain(..self.held.len() - keep).collect();
                        self.content(out, &text);
                        return;
                    }
                },
            }
        }
    }

    /// The body of a block the message ended in, unclosed: a call if whole; left out if a
    /// call's JSON cut short (by max_tokens: half a call is neither text nor a call); else
    /// text that only mentions the tag (`I put <tool_call> in my notes.`), content as it
    /// came (issue 42).
    fn unclosed_block(&mut self, out: &mut Vec<Delta>, body: &str) {
        if let Some(call) = self.call(body, "arguments") {
            out.push(Delta::Call(call));
        } else if !is_cut_short_object(body) {
            self.content(out, &format!("{OPEN}{body}"));
        }
    }

    /// A closed `<tool_call>` block's body: a call, or else content, written back as it
    /// came.
    fn block(&mut self, out: &mut Vec<Delta>, body: &str) {
        match self.call(body, "arguments") {
            Some(call) => out.push(Delta::Call(call)),
            None => self.content(out, &format!("{OPEN}{body}{CLOSE}")),
        }
    }

    fn llama3(&mut self, out: &mut Vec<Delta>, end: bool) {
        if self.state == State::Text {
            match self.held.trim_start().chars().next() {
                Some('{') => self.state = State::Object,
                Some(_) => self.state = State::Content,
                None if end => self.state = State::Content,
                None => return,
            }
        }
        match self.state {
            State::Object if end => {
                let text = std::mem::take(&mut self.held);
                match self.calls(&text) {
                    Some(calls) => out.extend(calls.into_iter().map(Delta::Call)),
                    None => self.content(out, &text),
                }
            }
            State::Object => {}
            _ => {
                let text = std::mem::take(&mut self.held);
                self.content(out, &text);
            }
        }
    }

    /// A Llama 3 message as calls: one JSON object or several joined by `;`, each a call.
    fn calls(&self, text: &str) -> Option<Vec<Call>> {
        let mut calls = Vec::new();
        let mut rest = text;
        loop {
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Fields>();
            calls.push(self.call_of(values.next()?.ok()?, "parameters")?);
            let after = rest[values.byte_offset()..].trim_start();
            if after.is_empty() {
                return Some(calls);
            }
            rest = after.strip_prefix(';')?;
            if rest.trim().is_empty() {
                return Some(calls);
            }
        }
    }

    /// `text` as one call: a JSON object naming an offered tool, with its arguments.
    fn call(&self, text: &str, key: &str) -> Option<Call> {
        self.call_of(serde_json::from_str(text.trim()).ok()?, key)
    }

    /// `object` as one call: `{"name": ..., key: {...}}` (either of `arguments` and
    /// `parameters` taken, and arguments written as a string of JSON), no other keys but
    /// Llama 3's `"type": "function"`. The arguments are the model's text with the
    /// whitespace between tokens left out: its numbers and strings as it wrote them (a
    /// round trip through f64 would turn 98765432109876543210987654321 into 9.87...e28).
    fn call_of(&self, mut object: Fields, key: &str) -> Option<Call> {
        let name: String = serde_json::from_str(object.remove("name")?.get()).ok()?;
        if !self.names.contains(&name) {
            return None;
        }
        if object
            .get("type")
            .is_some_and(|t| t.get() == "\"function\"")
        {
            object.remove("type");
        }
        let other = if key == "arguments" {
            "parameters"
        } else {
            "arguments"
        };
        let arguments = match object.remove(key).or_else(|| object.remove(other)) {
            None => "{}".to_string(),
            Some(raw) => {
                let text = match raw.get() {
                    quoted if quoted.starts_with('"') => serde_json::from_str(quoted).ok()?,
                    text => text.to_string(),
                };
                if !serde_json::from_str::<Value>(&text).ok()?.is_object() {
                    return None;
                }
                compact(&text)
            }
        };
        if !object.is_empty() {
            return None;
        }
        Some(Call { name, arguments })
    }

    /// Sends content, its ends trimmed.
    fn content(&mut self, out: &mut Vec<Delta>, text: &str) {
        out.extend(self.content.push(text).map(Delta::Content));
    }
}

/// A call's fields, each value as the model wrote it.
type Fields = std::collections::HashMap<String, Box<serde_json::value::RawValue>>;

/// The JSON text `json` without the whitespace between its tokens (strings kept whole).
fn compact(json: &str) -> String {
    let (mut out, mut in_string, mut escaped) = (String::with_capacity(json.len()), false, false);
    for c in json.chars() {
        if in_string {
            (escaped, in_string) = (c == '\\' && !escaped, c != '"' || escaped);
        } else if c.is_ascii_whitespace() {
            continue;
        } else {
            in_string = c == '"';
        }
        out.push(c);
    }
    out
}

/// Whether `text` is the start of a JSON object cut short (what a call being written is).
fn is_cut_short_object(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with('{') && serde_json::from_str::<Value>(text).is_err_and(|e| e.is_eof())
}

/// Where the block whose body starts `text` ends: the first `</tool_call>` after which the
/// body is not a JSON text cut short (a `</tool_call>` inside one of its strings is not the
/// end); `None` while there is none yet.
fn block_end(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(CLOSE) {
        let at = from + found;
        match serde_json::from_str::<Value>(text[..at].trim()) {
            Err(e) if e.is_eof() && !text[..at].trim().is_empty() => from = at + CLOSE.len(),
            _ => return Some(at),
        }
    }
    None
}
