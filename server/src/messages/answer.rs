//! Anthropic's answers: a whole `message` object, or its server-sent events (`message_start`,
//! a `ping`, each content block's `content_block_start`, `content_block_delta`s and
//! `content_block_stop`, then `message_delta` with the stop reason and usage, and
//! `message_stop`). Both are built by one [`Blocks`] from the pieces a chat's [`Reading`]
//! says, so that the streamed blocks join to the whole answer's.

use std::convert::Infallible;

use axum::Json;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use runtime::generate::StopReason;
use runtime::text::tools::{Call, Delta};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc as async_mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::engine::{Event, Finished};
use crate::error::{ApiError, Protocol};
use crate::reply::{Reading, Said};
use crate::text_events::{self, Failure, Read};

/// A content block of the answer. A call's `input` is the model's JSON as it wrote it (its
/// keys in their order), which the client sends back in the next turn.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    /// Unsigned: the signature Anthropic's clients keep and send back is empty.
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Box<RawValue>,
    },
}

/// A stream's event: its name and its data.
type Sent = (&'static str, Value);

/// The answer's blocks as its pieces come, and the events that say so. Text or reasoning
/// goes into the open block of its kind or opens the next; a call is a block of its own, its
/// input sent whole in one `input_json_delta` (the reading has a call only once it is
/// whole). Whitespace alone opens no text block: it waits for text after it.
#[derive(Default)]
struct Blocks {
    done: Vec<Block>,
    /// A text or thinking block still being written: `done.len()` is its index.
    open: Option<Block>,
    /// Whitespace waiting for the text it precedes.
    space: String,
}

impl Blocks {
    fn said(&mut self, said: Said, sent: &mut Vec<Sent>) {
        match said {
            Said::Reasoning(text) => self.thinking(&text, sent),
            Said::Delta(Delta::Content(text)) => self.text(&text, sent),
            Said::Delta(Delta::Call(call)) => self.call(call, sent),
        }
    }

    fn text(&mut self, text: &str, sent: &mut Vec<Sent>) {
        let continues = matches!(self.open, Some(Block::Text { .. }));
        if !continues && text.trim().is_empty() {
            self.space.push_str(text);
            return;
        }
        let text = std::mem::take(&mut self.space) + text;
        if !continues {
            let block = Block::Text {
                text: String::new(),
            };
            self.open(block, sent);
        }
        if let Some(Block::Text { text: open }) = &mut self.open {
            open.push_str(&text);
        }
        sent.push(self.delta(json!({"type": "text_delta", "text": text})));
    }

    fn thinking(&mut self, text: &str, sent: &mut Vec<Sent>) {
        if text.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Block::Thinking { .. })) {
            let block = Block::Thinking {
                thinking: String::new(),
                signature: String::new(),
            };
            self.open(block, sent);
        }
        if let Some(Block::Thinking { thinking, .. }) = &mut self.open {
            thinking.push_str(text);
        }
        sent.push(self.delta(json!({"type": "thinking_delta", "thinking": text})));
    }

    fn call(&mut self, call: Call, sent: &mut Vec<Sent>) {
        self.close(sent);
        self.space.clear();
        let index = self.done.len();
        let id = format!("toolu_{:024x}", rand::random::<u128>() >> 32);
        let start = json!({"type": "tool_use", "id": id, "name": call.name, "input": {}});
        sent.push(block_start(index, start));
        let delta = json!({"type": "input_json_delta", "partial_json": call.arguments});
        sent.push(block_delta(index, delta));
        sent.push(block_stop(index));
        // The reading gives a call only when its arguments are a JSON object.
        let input = RawValue::from_string(call.arguments)
            .unwrap_or_else(|_| RawValue::from_string("{}".into()).expect("JSON"));
        self.done.push(Block::ToolUse {
            id,
            name: call.name,
            input,
        });
    }

    /// Closes the open block and opens `block`, empty.
    fn open(&mut self, block: Block, sent: &mut Vec<Sent>) {
        self.close(sent);
        self.space.clear();
        let value = serde_json::to_value(&block).expect("a block is JSON");
        sent.push(block_start(self.done.len(), value));
        self.open = Some(block);
    }

    fn close(&mut self, sent: &mut Vec<Sent>) {
        if let Some(block) = self.open.take() {
            sent.push(block_stop(self.done.len()));
            self.done.push(block);
        }
    }

    /// A delta of the open block.
    fn delta(&self, delta: Value) -> Sent {
        block_delta(self.done.len(), delta)
    }

    fn calls(&self) -> usize {
        (self.done.iter())
            .filter(|block| matches!(block, Block::ToolUse { .. }))
            .count()
    }
}

fn block_start(index: usize, block: Value) -> Sent {
    let data = json!({"type": "content_block_start", "index": index, "content_block": block});
    ("content_block_start", data)
}

fn block_delta(index: usize, delta: Value) -> Sent {
    let data = json!({"type": "content_block_delta", "index": index, "delta": delta});
    ("content_block_delta", data)
}

fn block_stop(index: usize) -> Sent {
    let data = json!({"type": "content_block_stop", "index": index});
    ("content_block_stop", data)
}

/// The whole message, as Anthropic's API returns it.
#[derive(Serialize)]
struct Whole<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: &'a [Block],
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
    usage: Value,
}

/// One answer being built.
pub(crate) struct Answer {
    id: String,
    model: String,
    reading: Option<Reading>,
    blocks: Blocks,
    /// The request's `max_tokens`: an answer cut shorter at length ran out of context.
    max_tokens: usize,
    /// The prompt's length, for `message_start` (the part of it found cached is known only
    /// at the end, and `message_delta` says it).
    prompt_tokens: usize,
}

impl Answer {
    /// The answer of `model` (as the request named it), its text read by `reading` (if for
    /// more than text).
    pub fn new(
        model: String,
        reading: Option<Reading>,
        max_tokens: usize,
        prompt_tokens: usize,
    ) -> Self {
        Self {
            id: format!("msg_{:024x}", rand::random::<u128>() >> 32),
            model,
            reading,
            blocks: Blocks::default(),
            max_tokens,
            prompt_tokens,
        }
    }

    fn push(&mut self, text: &str, sent: &mut Vec<Sent>) {
        match &mut self.reading {
            None => self.blocks.text(text, sent),
            Some(reading) => {
                for said in reading.push(text) {
                    self.blocks.said(said, sent);
                }
            }
        }
    }

    fn finish(&mut self, sent: &mut Vec<Sent>) {
        if let Some(reading) = self.reading.take() {
            for said in reading.finish() {
                self.blocks.said(said, sent);
            }
        }
        self.blocks.close(sent);
    }

    fn stop_reason(&self, ended: &Finished) -> &'static str {
        match ended.reason {
            StopReason::Stop => "stop_sequence",
            StopReason::Length if ended.completion_tokens < self.max_tokens => {
                "model_context_window_exceeded"
            }
            StopReason::Length => "max_tokens",
            StopReason::Eos if self.blocks.calls() > 0 => "tool_use",
            StopReason::Eos => "end_turn",
        }
    }

    /// Anthropic's usage: `input_tokens` are the prompt's tokens not read from a cache (the
    /// prompt is their sum with `cache_read_input_tokens`, as Anthropic counts); a cache is
    /// kept of every prompt here, none written on request.
    fn usage(ended: &Finished) -> Value {
        json!({
            "input_tokens": ended.prompt_tokens - ended.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": ended.cached_tokens,
            "output_tokens": ended.completion_tokens,
        })
    }

    /// The whole answer as one JSON message.
    pub async fn whole(mut self, mut events: async_mpsc::UnboundedReceiver<Event>) -> Response {
        let mut sent = Vec::new();
        let ended = loop {
            match text_events::next(&mut events).await {
                Read::Text(piece) => self.push(&piece, &mut sent),
                Read::Done(finished) => break finished,
                Read::Failed(failure) => return ended_badly(failure).respond(Protocol::Anthropic),
            }
            // The events are for a stream.
            sent.clear();
        };
        self.finish(&mut sent);
        Json(Whole {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: &self.blocks.done,
            stop_reason: self.stop_reason(&ended),
            stop_sequence: ended.stop_string.as_deref(),
            usage: Self::usage(&ended),
        })
        .into_response()
    }

    /// Server-sent events, each named by its `event:` line. A failure after the stream began
    /// is an `error` event. A request that has to wait for a slot says so in a comment.
    /// The client leaving cancels the request at once, whether or not it runs.
    pub fn stream(
        mut self,
        mut events: async_mpsc::UnboundedReceiver<Event>,
    ) -> Sse<UnboundedReceiverStream<Result<SseEvent, Infallible>>> {
        let (out, stream) = async_mpsc::unbounded_channel();
        tokio::spawn(async move {
            let send = |(name, data): Sent| {
                let event = SseEvent::default().event(name).data(data.to_string());
                out.send(Ok(event)).is_ok()
            };
            let message = json!({
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0, "output_tokens": 0},
            });
            let start = json!({"type": "message_start", "message": message});
            if !send(("message_start", start)) || !send(("ping", json!({"type": "ping"}))) {
                return;
            }
            let mut told_waiting = false;
            let mut ended = false;
            while !ended {
                let Some(read) =
                    text_events::next_streamed(&mut events, &out, &mut told_waiting).await
                else {
                    return;
                };
                let mut sent = Vec::new();
                match read {
                    Read::Text(piece) => self.push(&piece, &mut sent),
                    Read::Done(end) => {
                        self.finish(&mut sent);
                        let delta = json!({"stop_reason": self.stop_reason(&end),
                                           "stop_sequence": end.stop_string});
                        let usage = Self::usage(&end);
                        sent.push((
                            "message_delta",
                            json!({"type": "message_delta", "delta": delta, "usage": usage}),
                        ));
                        sent.push(("message_stop", json!({"type": "message_stop"})));
                        ended = true;
                    }
                    Read::Failed(failure) => {
                        send(("error", ended_badly(failure).anthropic_body()));
                        return;
                    }
                }
                for piece in sent {
                    if !send(piece) {
                        return;
                    }
                }
            }
        });
        Sse::new(UnboundedReceiverStream::new(stream))
    }
}

/// The error of an answer that did not end with `Done`: the engine's failure (or its
/// stopping), or a grammar past its limits (the forced call's, from the tools).
fn ended_badly(failure: Failure) -> ApiError {
    failure
        .error(|message| ApiError::invalid_field("tools", format!("the tools' grammar: {message}")))
}

#[cfg(test)]
mod tests {
    use crate::engine::testing::events;
    use runtime::text::tools::Format;

    use super::*;
    use crate::reply::{Thinking, ToolReading};

    const ANSWER: &str = "<think>\nThe weather, then.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";

    /// An answer reading reasoning and Hermes calls of `get_weather`.
    fn answer() -> Answer {
        let tools = ToolReading {
            format: Format::Hermes,
            names: vec!["get_weather".into()],
            parallel: true,
        };
        Answer::new(
            "m".into(),
            Reading::new(Thinking::Split, Some(&tools)),
            50,
            7,
        )
    }

    fn whole(answer: Answer, events: async_mpsc::UnboundedReceiver<Event>) -> Value {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime.block_on(async {
            let response = answer.whole(events).await;
            axum::body::to_bytes(response.into_body(), 1 << 20).await
        });
        serde_json::from_slice(&bytes.unwrap()).unwrap()
    }

    /// The streamed events (name, data), each data's type its name.
    fn streamed(
        answer: Answer,
        events: async_mpsc::UnboundedReceiver<Event>,
    ) -> Vec<(String, Value)> {
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
        (text.split("\n\n").filter(|e| !e.is_empty()))
            .map(|event| {
                let name = field(event, "event").unwrap();
                let data: Value = serde_json::from_str(&field(event, "data").unwrap()).unwrap();
                assert_eq!(data["type"], name.as_str());
                (name, data)
            })
            .collect()
    }

    /// The blocks the events say: each started, written and stopped at its own index in
    /// turn, a call's input joined from its `input_json_delta`s.
    fn blocks_of(events: &[(String, Value)]) -> Vec<Value> {
        let (mut blocks, mut open) = (Vec::<Value>::new(), false);
        for (name, data) in events {
            let index = data["index"].as_u64().map(|i| i as usize);
            match name.as_str() {
                "content_block_start" => {
                    assert!(!open && index == Some(blocks.len()), "{events:?}");
                    blocks.push(data["content_block"].clone());
                    open = true;
                }
                "content_block_delta" => {
                    assert!(open && index == Some(blocks.len() - 1), "{events:?}");
                    let (block, delta) = (blocks.last_mut().unwrap(), &data["delta"]);
                    let (field, piece) = match delta["type"].as_str().unwrap() {
                        "text_delta" => ("text", &delta["text"]),
                        "thinking_delta" => ("thinking", &delta["thinking"]),
                        _ => ("partial_json", &delta["partial_json"]),
                    };
                    let so_far = block[field].as_str().unwrap_or_default().to_string();
                    block[field] = (so_far + piece.as_str().unwrap()).into();
                }
                "content_block_stop" => {
                    assert!(open && index == Some(blocks.len() - 1), "{events:?}");
                    open = false;
                }
                _ => {}
            }
        }
        for block in &mut blocks {
            if let Some(Value::String(input)) =
                block.as_object_mut().unwrap().remove("partial_json")
            {
                assert_eq!(block["input"], json!({}));
                block["input"] = serde_json::from_str(&input).unwrap();
            }
        }
        blocks
    }

    /// The blocks without the calls' ids, which each answer draws anew.
    fn without_ids(blocks: &[Value]) -> Vec<Value> {
        let mut blocks = blocks.to_vec();
        for block in &mut blocks {
            if let Some(id) = block.as_object_mut().unwrap().remove("id") {
                assert!(id.as_str().unwrap().starts_with("toolu_"), "{id}");
            }
        }
        blocks
    }

    /// Reasoning, prose and two calls: blocks in that order, whole or streamed in pieces of
    /// any size, a call's input as the model wrote it.
    #[test]
    fn streamed_blocks_join_to_the_whole_answer() {
        let expected = json!([
            {"type": "thinking", "thinking": "The weather, then.", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris", "days": 2}},
            {"type": "tool_use", "name": "get_weather", "input": {"city": "Rome"}},
        ]);
        for size in [1, 2, 3, 7, 16, ANSWER.len()] {
            let whole = whole(answer(), events(ANSWER, size, StopReason::Eos, 40));
            let content = whole["content"].as_array().unwrap();
            assert_eq!(
                Value::from(without_ids(content)),
                expected,
                "pieces of {size}"
            );
            assert_ne!(content[2]["id"], content[3]["id"]);
            assert_eq!(whole["stop_reason"], "tool_use");
            let usage = json!({"input_tokens": 4, "cache_creation_input_tokens": 0,
                               "cache_read_input_tokens": 3, "output_tokens": 40});
            assert_eq!(whole["usage"], usage);

            let events = streamed(answer(), events(ANSWER, size, StopReason::Eos, 40));
            let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
            assert_eq!(names[..2], ["message_start", "ping"]);
            assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
            assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 7);
            let end = &events[names.len() - 2].1;
            assert_eq!(
                (&end["delta"]["stop_reason"], &end["usage"]),
                (&json!("tool_use"), &usage)
            );
            let blocks = blocks_of(&events);
            assert_eq!(
                Value::from(without_ids(&blocks)),
                expected,
                "pieces of {size}"
            );
        }
    }

    /// The stop reasons: a stop sequence named; length at `max_tokens`, or short of it when
    /// the context ran out; an end without calls `end_turn`. Whitespace alone is no block;
    /// before text, it is the text's.
    #[test]
    fn stop_reasons_are_anthropics() {
        let plain = || Answer::new("m".into(), None, 50, 7);
        for (reason, tokens, text, expected, sequence) in [
            (
                StopReason::Stop,
                9,
                "Hi there",
                "stop_sequence",
                json!("\n\nUser"),
            ),
            (StopReason::Length, 50, "Hi", "max_tokens", Value::Null),
            (
                StopReason::Length,
                20,
                "Hi",
                "model_context_window_exceeded",
                Value::Null,
            ),
            (StopReason::Eos, 3, "Hi", "end_turn", Value::Null),
        ] {
            let whole = whole(plain(), events(text, 3, reason, tokens));
            assert_eq!(whole["stop_reason"], expected);
            assert_eq!(whole["stop_sequence"], sequence);
            assert_eq!(whole["content"], json!([{"type": "text", "text": text}]));
        }
        let blank = whole(plain(), events(" \n ", 1, StopReason::Eos, 3));
        assert_eq!(blank["content"], json!([]));
        for size in [1, 2, 4] {
            let spaced = whole(plain(), events("  Hi", size, StopReason::Eos, 3));
            assert_eq!(spaced["content"], json!([{"type": "text", "text": "  Hi"}]));
            let blocks = blocks_of(&streamed(plain(), events("  Hi", size, StopReason::Eos, 3)));
            assert_eq!(Value::from(blocks), spaced["content"]);
        }
    }
}
