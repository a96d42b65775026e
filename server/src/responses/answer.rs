//! The Responses API's answers: a whole `response` object, or its server-sent events, each
//! named by its `type` and numbered by `sequence_number` from 0: `response.created` and
//! `response.in_progress`; for each output item `response.output_item.added`, its content
//! part's `response.content_part.added`, the deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`) and their
//! `.done`, `response.content_part.done`, `response.output_item.done`; then
//! `response.completed` (or `response.incomplete`) with the whole response. An engine
//! failure is `response.failed`; a grammar refused while generating an `error` event. Both
//! are built by one [`Output`] from the pieces a chat's [`Reading`] says, so that the
//! streamed items join to the whole answer's.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use runtime::generate::StopReason;
use runtime::text::tools::{Call, Delta};
use serde_json::{Value, json};
use tokio::sync::mpsc as async_mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::request::{Echo, Namespaces};
use crate::engine::{Event, Finished};
use crate::error::ApiError;
use crate::reply::{Reading, Said};
use crate::text_events::{self, Failure, Read};

/// An id of OpenAI's shape: `prefix` and 24 hex digits.
fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:024x}", rand::random::<u128>() >> 32)
}

/// An output item.
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    /// A call's arguments are the model's JSON (its keys in the order it wrote them); its
    /// namespace, that of the function offered in one.
    Call {
        id: String,
        call_id: String,
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Reasoning { id, .. } | Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }

    /// The item as the response lists it, with `status`.
    fn json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text } => json!({
                "id": id, "type": "reasoning", "summary": [], "content": [reasoning_part(text)],
                "status": status,
            }),
            Item::Message { id, text } => json!({
                "id": id, "type": "message", "role": "assistant", "status": status,
                "content": [text_part(text)],
            }),
            Item::Call {
                id,
                call_id,
                name,
                namespace,
                arguments,
            } => {
                let mut item = json!({
                    "id": id, "type": "function_call", "call_id": call_id, "name": name,
                    "arguments": arguments, "status": status,
                });
                if let Some(namespace) = namespace {
                    item["namespace"] = namespace.as_str().into();
                }
                item
            }
        }
    }

    /// The item as `response.output_item.added` shows it: nothing written yet.
    fn opening(&self) -> Value {
        let mut item = self.json("in_progress");
        match self {
            Item::Call { .. } => item["arguments"] = "".into(),
            _ => item["content"] = json!([]),
        }
        item
    }

    /// Its content part as written so far (a call has none).
    fn part(&self) -> Option<Value> {
        match self {
            Item::Reasoning { text, .. } => Some(reasoning_part(text)),
            Item::Message { text, .. } => Some(text_part(text)),
            Item::Call { .. } => None,
        }
    }
}

fn reasoning_part(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The answer's output items as its pieces come, and the events that say so (each data
/// with its `type`, numbered when sent). Reasoning or text goes into the open item of its
/// kind or opens the next; a call is an item of its own, its arguments sent whole in one
/// delta (the reading has a call only once it is whole). Whitespace alone opens no message:
/// it waits for text after it.
#[derive(Default)]
struct Output {
    /// Closed items and their final status.
    done: Vec<(Item, &'static str)>,
    /// A reasoning or message item still being written: `done.len()` is its index.
    open: Option<Item>,
    /// Whitespace waiting for the text it precedes.
    space: String,
    /// The namespaces of the functions offered in one.
    namespaces: Namespaces,
}

impl Output {
    fn said(&mut self, said: Said, sent: &mut Vec<Value>) {
        match said {
            Said::Reasoning(text) => self.reasoning(&text, sent),
            Said::Delta(Delta::Content(text)) => self.text(&text, sent),
            Said::Delta(Delta::Call(call)) => self.call(call, sent),
        }
    }

    fn reasoning(&mut self, text: &str, sent: &mut Vec<Value>) {
        if text.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Item::Reasoning { .. })) {
            let item = Item::Reasoning {
                id: new_id("rs"),
                text: String::new(),
            };
            self.open(item, sent);
        }
        if let Some(Item::Reasoning { text: open, .. }) = &mut self.open {
            open.push_str(text);
        }
        sent.push(self.delta("response.reasoning_text.delta", text));
    }

    fn text(&mut self, text: &str, sent: &mut Vec<Value>) {
        let continues = matches!(self.open, Some(Item::Message { .. }));
        if !continues && text.trim().is_empty() {
            self.space.push_str(text);
            return;
        }
        let text = std::mem::take(&mut self.space) + text;
        if !continues {
            let item = Item::Message {
                id: new_id("msg"),
                text: String::new(),
            };
            self.open(item, sent);
        }
        if let Some(Item::Message { text: open, .. }) = &mut self.open {
            open.push_str(&text);
        }
        sent.push(self.delta("response.output_text.delta", &text));
    }

    fn call(&mut self, call: Call, sent: &mut Vec<Value>) {
        self.close("completed", sent);
        self.space.clear();
        let index = self.done.len();
        let arguments = call.arguments.clone();
        let item = Item::Call {
            id: new_id("fc"),
            call_id: new_id("call"),
            namespace: self.namespaces.get(&call.name).cloned(),
            name: call.name,
            arguments: call.arguments,
        };
        let id = item.id();
        sent.push(
            json!({"type": "response.output_item.added", "output_index": index,
                         "item": item.opening()}),
        );
        sent.push(
            json!({"type": "response.function_call_arguments.delta", "item_id": id,
                         "output_index": index, "delta": arguments}),
        );
        sent.push(
            json!({"type": "response.function_call_arguments.done", "item_id": id,
                         "output_index": index, "arguments": arguments}),
        );
        sent.push(
            json!({"type": "response.output_item.done", "output_index": index,
                         "item": item.json("completed")}),
        );
        self.done.push((item, "completed"));
    }

    /// Closes the open item and opens `item`, empty, with its content part.
    fn open(&mut self, item: Item, sent: &mut Vec<Value>) {
        self.close("completed", sent);
        self.space.clear();
        let index = self.done.len();
        sent.push(
            json!({"type": "response.output_item.added", "output_index": index,
                         "item": item.opening()}),
        );
        sent.push(
            json!({"type": "response.content_part.added", "item_id": item.id(),
                         "output_index": index, "content_index": 0, "part": item.part()}),
        );
        self.open = Some(item);
    }

    /// Closes the open item with `status`: its text's `.done`, its part's, its own.
    fn close(&mut self, status: &'static str, sent: &mut Vec<Value>) {
        let Some(item) = self.open.take() else {
            return;
        };
        let index = self.done.len();
        let (id, part) = (item.id(), item.part());
        let mut done = match &item {
            Item::Reasoning { text, .. } => {
                json!({"type": "response.reasoning_text.done", "text": text})
            }
            Item::Message { text, .. } => {
                json!({"type": "response.output_text.done", "text": text, "logprobs": []})
            }
            Item::Call { .. } => unreachable!("a call is never left open"),
        };
        done["item_id"] = id.into();
        done["output_index"] = index.into();
        done["content_index"] = 0.into();
        sent.push(done);
        sent.push(json!({"type": "response.content_part.done", "item_id": id,
                         "output_index": index, "content_index": 0, "part": part}));
        sent.push(
            json!({"type": "response.output_item.done", "output_index": index,
                         "item": item.json(status)}),
        );
        self.done.push((item, status));
    }

    /// A delta of the open item's content (a text delta's with its log-probabilities: none).
    fn delta(&self, kind: &str, text: &str) -> Value {
        let id = self.open.as_ref().map_or("", Item::id);
        let mut delta = json!({"type": kind, "item_id": id, "output_index": self.done.len(),
                               "content_index": 0, "delta": text});
        if kind == "response.output_text.delta" {
            delta["logprobs"] = json!([]);
        }
        delta
    }

    fn items(&self) -> Vec<Value> {
        (self.done.iter())
            .map(|(item, status)| item.json(status))
            .collect()
    }
}

/// Where the reasoning ends among the answer's text pieces, for `reasoning_tokens`. A
/// piece is a token's text (a character split over tokens comes in one piece), so the
/// count is the tokens', but for such characters; an answer that is all reasoning (one cut
/// short, or a prompt that opened the section) has all its tokens counted exactly.
#[derive(Default)]
struct Reasoned {
    /// Pieces read until the reply began.
    pieces: usize,
    /// The reading said reasoning.
    reasoned: bool,
    /// Pieces of reasoning before the first one of the reply (the piece where both meet
    /// counted as reasoning).
    before_reply: Option<usize>,
}

impl Reasoned {
    /// The reading said `said` for a new piece (`piece`) or at the end.
    fn saw(&mut self, said: &[Said], piece: bool) {
        if self.before_reply.is_some() {
            return;
        }
        self.pieces += usize::from(piece);
        let reasons = (said.iter()).any(|s| matches!(s, Said::Reasoning(r) if !r.is_empty()));
        self.reasoned |= reasons;
        let replies = said.iter().any(|s| match s {
            Said::Delta(Delta::Content(text)) => !text.trim().is_empty(),
            Said::Delta(Delta::Call(_)) => true,
            Said::Reasoning(_) => false,
        });
        if replies {
            self.before_reply = Some(self.pieces - usize::from(piece && !reasons));
        }
    }

    /// The reasoning's tokens, of an answer of `tokens` tokens.
    fn tokens(&self, tokens: usize) -> usize {
        match (self.reasoned, self.before_reply) {
            (false, _) => 0,
            (true, None) => tokens,
            (true, Some(pieces)) => pieces.min(tokens),
        }
    }
}

/// One answer being built.
pub(crate) struct Answer {
    id: String,
    created_at: u64,
    model: String,
    echo: Echo,
    reading: Option<Reading>,
    output: Output,
    /// Where the reasoning ends, for its count of tokens.
    reasoned: Reasoned,
    /// The request field its grammar came from, for a grammar refused while generating.
    grammar_param: &'static str,
}

impl Answer {
    /// The answer of `model` (as the request named it), echoing `echo`, its text read by
    /// `reading` (if for more than text), its calls in `namespaces`.
    pub fn new(
        model: String,
        echo: Echo,
        reading: Option<Reading>,
        namespaces: Namespaces,
        grammar_param: &'static str,
    ) -> Self {
        Self {
            id: new_id("resp"),
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model,
            echo,
            reading,
            output: Output {
                namespaces,
                ..Output::default()
            },
            reasoned: Reasoned::default(),
            grammar_param,
        }
    }

    fn push(&mut self, text: &str, sent: &mut Vec<Value>) {
        let Some(reading) = &mut self.reading else {
            return self.output.text(text, sent);
        };
        let said = reading.push(text);
        self.reasoned.saw(&said, true);
        for said in said {
            self.output.said(said, sent);
        }
    }

    /// Reads what the reading still holds and closes the open item: `incomplete` if the
    /// answer was cut at its length.
    fn finish(&mut self, ended: &Finished, sent: &mut Vec<Value>) {
        if let Some(reading) = self.reading.take() {
            let said = reading.finish();
            self.reasoned.saw(&said, false);
            for said in said {
                self.output.said(said, sent);
            }
        }
        self.output.close(Self::status(ended), sent);
    }

    /// The response object: `status`, the items closed so far, `usage` and `error`.
    fn response(&self, status: &str, ended: Option<&Finished>, error: Value) -> Value {
        let incomplete = (ended.is_some_and(|e| e.reason == StopReason::Length))
            .then(|| json!({"reason": "max_output_tokens"}));
        let mut response = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": error, "incomplete_details": incomplete,
            "model": self.model, "output": self.output.items(),
            "usage": ended.map(|e| self.usage(e)),
        });
        let fields = response.as_object_mut().expect("an object");
        fields.extend(self.echo.clone());
        response
    }

    /// OpenAI's usage: the prompt's tokens (those found in a kept cache among them), the
    /// answer's (its reasoning's among them).
    fn usage(&self, ended: &Finished) -> Value {
        json!({
            "input_tokens": ended.prompt_tokens,
            "input_tokens_details": {"cached_tokens": ended.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": ended.completion_tokens,
            "output_tokens_details": {
                "reasoning_tokens": self.reasoned.tokens(ended.completion_tokens),
            },
            "total_tokens": ended.prompt_tokens + ended.completion_tokens,
        })
    }

    /// The status an ended answer has.
    fn status(ended: &Finished) -> &'static str {
        match ended.reason {
            StopReason::Length => "incomplete",
            _ => "completed",
        }
    }

    /// The whole answer as one response object.
    pub async fn whole(mut self, mut events: async_mpsc::UnboundedReceiver<Event>) -> Response {
        let mut sent = Vec::new();
        let ended = loop {
            match text_events::next(&mut events).await {
                Read::Text(piece) => self.push(&piece, &mut sent),
                Read::Done(finished) => break finished,
                Read::Failed(failure) => return self.ended_badly(failure).into_response(),
            }
            // The events are for a stream.
            sent.clear();
        };
        self.finish(&ended, &mut sent);
        let status = Self::status(&ended);
        Json(self.response(status, Some(&ended), Value::Null)).into_response()
    }

    /// Server-sent events, each named by its `event:` line and numbered. A request that has
    /// to wait for a slot says so in a comment. The client leaving cancels the request at
    /// once, whether or not it runs.
    pub fn stream(
        mut self,
        mut events: async_mpsc::UnboundedReceiver<Event>,
    ) -> Sse<UnboundedReceiverStream<Result<SseEvent, Infallible>>> {
        let (out, stream) = async_mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut sequence_number = 0u64;
            let mut send = |mut data: Value| {
                data["sequence_number"] = sequence_number.into();
                sequence_number += 1;
                let name = data["type"].as_str().unwrap_or("error").to_string();
                let event = SseEvent::default().event(name).data(data.to_string());
                out.send(Ok(event)).is_ok()
            };
            let response = self.response("in_progress", None, Value::Null);
            for kind in ["response.created", "response.in_progress"] {
                if !send(json!({"type": kind, "response": response})) {
                    return;
                }
            }
            let mut told_waiting = false;
            loop {
                let Some(read) =
                    text_events::next_streamed(&mut events, &out, &mut told_waiting).await
                else {
                    return;
                };
                let mut sent = Vec::new();
                let ended = match read {
                    Read::Text(piece) => {
                        self.push(&piece, &mut sent);
                        false
                    }
                    Read::Done(end) => {
                        self.finish(&end, &mut sent);
                        let status = Self::status(&end);
                        let kind = format!("response.{status}");
                        let response = self.response(status, Some(&end), Value::Null);
                        sent.push(json!({"type": kind, "response": response}));
                        true
                    }
                    Read::Failed(failure) => {
                        sent.push(self.failure(failure));
                        true
                    }
                };
                for data in sent {
                    if !send(data) {
                        return;
                    }
                }
                if ended {
                    return;
                }
            }
        });
        Sse::new(UnboundedReceiverStream::new(stream))
    }

    /// The last event of a stream that did not end with `Done`: a grammar refused is an
    /// `error` naming the field it came from; the engine's failure (or its stopping)
    /// `response.failed`.
    fn failure(&self, failure: Failure) -> Value {
        let error = self.ended_badly(failure);
        if error.status.is_client_error() {
            return json!({"type": "error", "code": "invalid_request_error",
                          "message": error.message, "param": error.param});
        }
        let failed = json!({"code": "server_error", "message": error.message});
        json!({"type": "response.failed", "response": self.response("failed", None, failed)})
    }

    /// The error of an answer that did not end with `Done`.
    fn ended_badly(&self, failure: Failure) -> ApiError {
        let param = self.grammar_param;
        failure.error(|message| {
            ApiError::invalid_field(param, format!("{param}'s grammar: {message}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::testing::events;
    use runtime::text::tools::Format;

    use super::*;
    use crate::reply::{Thinking, ToolReading};

    const ANSWER: &str = "<think>\nThe weather, then.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";

    fn echo() -> Echo {
        let echo =
            json!({"tools": [], "tool_choice": "auto", "store": false, "metadata": {"k": "v"}});
        echo.as_object().unwrap().clone()
    }

    /// An answer reading reasoning and Hermes calls of `get_weather`.
    fn answer() -> Answer {
        let tools = ToolReading {
            format: Format::Hermes,
            names: vec!["get_weather".into()],
            parallel: true,
        };
        let reading = Reading::new(Thinking::Split, Some(&tools));
        // Offered in a namespace, as Codex CLI offers some of its tools.
        let namespaces = Namespaces::from([("get_weather".into(), "weather".into())]);
        Answer::new("m".into(), echo(), reading, namespaces, "tools")
    }

    fn whole(answer: Answer, events: async_mpsc::UnboundedReceiver<Event>) -> (u16, Value) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (status, bytes) = runtime.block_on(async {
            let response = answer.whole(events).await;
            let status = response.status().as_u16();
            (
                status,
                axum::body::to_bytes(response.into_body(), 1 << 20).await,
            )
        });
        (status, serde_json::from_slice(&bytes.unwrap()).unwrap())
    }

    /// The streamed events' data, each named by its type, numbered 0, 1, 2...
    fn streamed(answer: Answer, events: async_mpsc::UnboundedReceiver<Event>) -> Vec<Value> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bytes = runtime.block_on(async {
            let response = answer.stream(events).into_response();
            axum::body::to_bytes(response.into_body(), 1 << 20).await
        });
        let text = String::from_utf8(bytes.unwrap().to_vec()).unwrap();
        let field = |event: &str, name: &str| {
            let prefix = format!("{name}: ");
            (event.lines()).find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        };
        let events: Vec<Value> = (text.split("\n\n").filter(|e| !e.is_empty()))
            .map(|event| {
                let name = field(event, "event").unwrap();
                let data: Value = serde_json::from_str(&field(event, "data").unwrap()).unwrap();
                assert_eq!(data["type"], name.as_str());
                data
            })
            .collect();
        for (n, data) in events.iter().enumerate() {
            assert_eq!(data["sequence_number"], n, "{data}");
        }
        events
    }

    /// The output items the events say, checking their order as it goes: each item added
    /// at its index, its part added, its deltas, its `.done`s, then done; a call's
    /// arguments joined from their deltas.
    fn items_of(events: &[Value]) -> Vec<Value> {
        let (mut items, mut open) = (Vec::<Value>::new(), false);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
        for data in &events[2..events.len() - 1] {
            let index = data["output_index"].as_u64().unwrap() as usize;
            let kind = data["type"].as_str().unwrap();
            if kind == "response.output_item.added" {
                assert!(!open && index == items.len(), "{kinds:?}");
                assert_eq!(data["item"]["status"], "in_progress");
                items.push(data["item"].clone());
                open = true;
                continue;
            }
            assert!(open && index == items.len() - 1, "{kinds:?}");
            let item = items.last_mut().unwrap();
            if !["response.output_item.done", "response.output_item.added"].contains(&kind) {
                assert_eq!(data["item_id"], item["id"], "{data}");
            }
            let append = |item: &mut Value, delta: &Value| {
                let field = match item["type"].as_str().unwrap() {
                    "function_call" => &mut item["arguments"],
                    _ => &mut item["content"][0]["text"],
                };
                *field = (field.as_str().unwrap().to_string() + delta.as_str().unwrap()).into();
            };
            match kind {
                "response.content_part.added" => {
                    item["content"] = json!([data["part"]]);
                }
                "response.output_text.delta"
                | "response.reasoning_text.delta"
                | "response.function_call_arguments.delta" => {
                    append(item, &data["delta"]);
                }
                "response.output_text.done" | "response.reasoning_text.done" => {
                    assert_eq!(data["text"], item["content"][0]["text"]);
                }
                "response.function_call_arguments.done" => {
                    assert_eq!(data["arguments"], item["arguments"]);
                }
                "response.content_part.done" => {
                    assert_eq!(data["part"], item["content"][0]);
                }
                "response.output_item.done" => {
                    item["status"] = data["item"]["status"].clone();
                    assert_eq!(&data["item"], item);
                    open = false;
                }
                other => panic!("{other} inside the response: {kinds:?}"),
            }
        }
        assert!(!open, "{kinds:?}");
        items
    }

    /// Reasoning, prose and two calls: items in that order, whole or streamed in pieces of
    /// any size, a call's arguments in the model's key order, the final response the whole
    /// one.
    #[test]
    fn streamed_items_join_to_the_whole_answer() {
        for size in [1, 2, 3, 7, 16, ANSWER.len()] {
            let (status, whole) = whole(answer(), events(ANSWER, size, StopReason::Eos, 40));
            assert_eq!(status, 200);
            let output = whole["output"].as_array().unwrap();
            let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
            assert_eq!(
                kinds,
                ["reasoning", "message", "function_call", "function_call"]
            );
            assert_eq!(output[0]["content"][0]["text"], "The weather, then.");
            assert_eq!(
                output[1]["content"][0],
                json!({"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []})
            );
            assert_eq!(output[2]["arguments"], r#"{"city":"Paris","days":2}"#);
            assert_eq!(output[3]["name"], "get_weather");
            assert_eq!(output[3]["namespace"], "weather");
            assert_ne!(output[2]["call_id"], output[3]["call_id"]);
            assert!(output.iter().all(|i| i["status"] == "completed"));
            assert_eq!(
                (&whole["status"], &whole["object"]),
                (&json!("completed"), &json!("response"))
            );
            assert_eq!(whole["incomplete_details"], Value::Null);
            assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
            assert_eq!(whole["metadata"], json!({"k": "v"}));
            let usage = &whole["usage"];
            assert_eq!(
                (
                    &usage["input_tokens"],
                    &usage["output_tokens"],
                    &usage["total_tokens"]
                ),
                (&json!(7), &json!(40), &json!(47))
            );
            assert_eq!(usage["input_tokens_details"]["cached_tokens"], 3);
            // The pieces before the reply ("Let me look"), those of `</think>` among them.
            let reasoning = usage["output_tokens_details"]["reasoning_tokens"]
                .as_u64()
                .unwrap();
            let (close, reply) = (
                ANSWER.find("</think>").unwrap(),
                ANSWER.find("Let").unwrap(),
            );
            let bounds = (close / size) as u64..=(reply / size + 1) as u64;
            assert!(bounds.contains(&reasoning), "{reasoning} pieces of {size}");

            let events = streamed(answer(), events(ANSWER, size, StopReason::Eos, 40));
            let last = events.last().unwrap();
            assert_eq!(last["type"], "response.completed");
            assert_eq!(events[0]["response"]["output"], json!([]));
            assert_eq!(events[0]["response"]["status"], "in_progress");
            let items = Value::from(items_of(&events));
            assert_eq!(
                without_ids(&items),
                without_ids(&whole["output"]),
                "pieces of {size}"
            );
            assert_eq!(
                last["response"]["output"].as_array().unwrap(),
                &items_of(&events)
            );
            assert_eq!(last["response"]["usage"]["output_tokens"], 40);
        }
    }

    /// Cut at its length: `incomplete` with `max_output_tokens`, the message item too.
    /// Whitespace alone is no message; before text, it is the text's.
    #[test]
    fn an_answer_cut_short_is_incomplete() {
        let plain = || Answer::new("m".into(), echo(), None, Namespaces::new(), "text.format");
        let (_, cut) = whole(plain(), events("Hi there", 3, StopReason::Length, 2));
        assert_eq!(cut["status"], "incomplete");
        assert_eq!(
            cut["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(cut["output"][0]["status"], "incomplete");
        let sent = streamed(plain(), events("Hi there", 3, StopReason::Length, 2));
        let last = sent.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            without_ids(&last["response"]["output"]),
            without_ids(&cut["output"])
        );
        assert_eq!(
            without_ids(&Value::from(items_of(&sent))),
            without_ids(&cut["output"])
        );
        let (_, blank) = whole_of(plain(), " \n ");
        assert_eq!(blank["output"], json!([]));
        for size in [1, 2, 4] {
            let (_, spaced) = whole(plain(), events("  Hi", size, StopReason::Eos, 3));
            assert_eq!(spaced["output"][0]["content"][0]["text"], "  Hi");
            let items = items_of(&streamed(plain(), events("  Hi", size, StopReason::Eos, 3)));
            assert_eq!(items[0]["content"][0]["text"], "  Hi");
        }
    }

    /// Output items without the ids each answer draws anew.
    fn without_ids(items: &Value) -> Value {
        let mut items = items.clone();
        for item in items.as_array_mut().unwrap() {
            for id in ["id", "call_id"] {
                item.as_object_mut().unwrap().remove(id);
            }
        }
        items
    }

    fn whole_of(answer: Answer, text: &str) -> (u16, Value) {
        whole(answer, events(text, 1, StopReason::Eos, 3))
    }

    /// A failure: a 500 or 400 (naming the grammar's field) before anything is sent;
    /// streamed, `response.failed` or `error`, the last event.
    #[test]
    fn failures_end_the_answer() {
        let failing = |event: Event| {
            let (sender, receiver) = async_mpsc::unbounded_channel();
            sender.send(Event::Text("Hi".into())).unwrap();
            sender.send(event).unwrap();
            receiver
        };
        let plain = || Answer::new("m".into(), echo(), None, Namespaces::new(), "text.format");
        let (status, body) = whole(plain(), failing(Event::Failed("out of memory".into())));
        assert_eq!(
            (status, &body["error"]["type"]),
            (500, &json!("server_error"))
        );
        let (status, body) = whole(plain(), failing(Event::Refused("too deep".into())));
        assert_eq!(
            (status, &body["error"]["param"]),
            (400, &json!("text.format"))
        );
        let events = streamed(plain(), failing(Event::Failed("out of memory".into())));
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.failed");
        assert_eq!(
            last["response"]["error"],
            json!({"code": "server_error", "message": "out of memory"})
        );
        let events = streamed(plain(), failing(Event::Refused("too deep".into())));
        let last = events.last().unwrap();
        assert_eq!(
            (&last["type"], &last["param"]),
            (&json!("error"), &json!("text.format"))
        );
    }
}
