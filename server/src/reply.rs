//! Responses in OpenAI's shapes: a whole answer as one JSON object, or server-sent events
//! with a chunk per piece of text (each carrying its tokens' log-probabilities), usage, and
//! `[DONE]`; several choices of one request interleaved.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use runtime::generate::StopReason;
use runtime::text::reasoning::{Part, Splitter};
use runtime::text::tools::{Call, Delta, Format, Parser};
use serde_json::{Value, json};
use tokio::sync::mpsc as async_mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

use crate::engine::{Event, Finished, Logprob};
use crate::error::ApiError;

/// What a stream says, in a comment, while its request waits for a slot.
pub(crate) const WAITING: &str = "waiting for a free slot";

/// Which endpoint a reply is for.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// Builds a response's JSON objects in OpenAI's shapes.
pub(crate) struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    /// The served model's name (a request naming another is refused).
    model: String,
    /// Whether the request asked for log-probabilities (else `logprobs` is null).
    logprobs: bool,
    /// The request field a grammar it follows came from, for errors.
    pub grammar_param: &'static str,
    /// How to read a chat's answers for tool calls, if the request offered tools.
    pub tools: Option<ToolReading>,
    /// What becomes of a chat answer's `<think>` section.
    pub thinking: Thinking,
}

/// What becomes of a chat answer's `<think>` section.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Thinking {
    /// Left in the content: a model that does not think, or `--keep-thinking`.
    Kept,
    /// An answer that opens with the section: it goes to `reasoning_content`.
    Split,
    /// The prompt opened the section (DeepSeek-R1's distills): the answer is reasoning
    /// until `</think>`.
    Opened,
}

/// How a request's answers are read for tool calls: the format and the offered tools.
pub(crate) struct ToolReading {
    pub format: Format,
    pub names: Vec<String>,
    /// `parallel_tool_calls`: false keeps an answer's first call only, whatever
    /// `tool_choice` (a forced answer's grammar allows one call already).
    pub parallel: bool,
}

/// What one choice has sent so far, while streaming.
#[derive(Default)]
struct Streamed {
    started: bool,
    text: String,
    pending: Pending,
    offsets: Offsets,
    /// Reads the text for reasoning and tool calls (when the request has either).
    reading: Option<Reading>,
    /// Calls sent so far.
    calls: usize,
    /// Log-probabilities of text the reading holds, sent with the next chunk.
    held: Vec<Logprob>,
}

/// A chat answer read as it streams: its reasoning split off, then its reply read for tool
/// calls. Anthropic's Messages API and OpenAI's Responses API read their answers with it
/// too ([`crate::messages`], [`crate::responses`]).
pub(crate) struct Reading {
    splitter: Option<Splitter>,
    parser: Option<Parser>,
    /// Calls read so far, and how many are kept (`parallel_tool_calls: false`: one).
    calls: usize,
    most_calls: usize,
}

/// What a chat answer says, piece by piece.
pub(crate) enum Said {
    Reasoning(String),
    Delta(Delta),
}

impl Reading {
    /// How a chat answer is read: for its reasoning unless `thinking` keeps it in the text,
    /// for calls if the request offered `tools`; `None` if there is nothing to read for.
    pub(crate) fn new(thinking: Thinking, tools: Option<&ToolReading>) -> Option<Reading> {
        let splitter = match thinking {
            Thinking::Kept => None,
            Thinking::Split => Some(Splitter::default()),
            Thinking::Opened => Some(Splitter::opened()),
        };
        let parser = tools.map(|tools| Parser::new(tools.format, tools.names.clone()));
        let most_calls = match tools {
            Some(tools) if !tools.parallel => 1,
            _ => usize::MAX,
        };
        (splitter.is_some() || parser.is_some()).then_some(Reading {
            splitter,
            parser,
            calls: 0,
            most_calls,
        })
    }

    pub(crate) fn push(&mut self, text: &str) -> Vec<Said> {
        let parts = match &mut self.splitter {
            Some(splitter) => splitter.push(text),
            None => vec![Part::Reply(text.to_string())],
        };
        self.reply(parts)
    }

    pub(crate) fn finish(mut self) -> Vec<Said> {
        let parts = (self.splitter.take()).map_or(Vec::new(), Splitter::finish);
        let mut said = self.reply(parts);
        if let Some(parser) = self.parser.take() {
            let deltas = parser.finish();
            said.extend(self.kept(deltas));
        }
        said
    }

    /// `deltas` as said, calls past the most kept left out.
    fn kept(&mut self, deltas: Vec<Delta>) -> Vec<Said> {
        let mut said = Vec::with_capacity(deltas.len());
        for delta in deltas {
            if let Delta::Call(_) = delta {
                self.calls += 1;
                if self.calls > self.most_calls {
                    continue;
                }
            }
            said.push(Said::Delta(delta));
        }
        said
    }

    fn reply(&mut self, parts: Vec<Part>) -> Vec<Said> {
        let mut said = Vec::new();
        for part in parts {
            match (part, &mut self.parser) {
                (Part::Reasoning(text), _) => said.push(Said::Reasoning(text)),
                (Part::Reply(text), Some(parser)) => {
                    let deltas = parser.push(&text);
                    said.extend(self.kept(deltas));
                }
                (Part::Reply(text), None) => said.push(Said::Delta(Delta::Content(text))),
            }
        }
        said
    }
}

/// What a chat choice's chunk carries.
enum Piece<'a> {
    Text(Option<&'a str>),
    Reasoning(&'a str),
    /// The `index`th call of the choice.
    Call(usize, &'a Call),
}

impl Reply {
    /// The reply to request number `n` of its kind, from `model`.
    pub fn new(kind: Kind, n: u64, model: String, logprobs: bool) -> Self {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        Self {
            kind,
            id: format!("{prefix}-{n}"),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model,
            logprobs,
            grammar_param: "response_format",
            tools: None,
            thinking: Thinking::Kept,
        }
    }

    /// How a choice's text is read, if it is read for more than its text.
    fn reading(&self) -> Option<Reading> {
        match self.kind {
            Kind::Chat => Reading::new(self.thinking, self.tools.as_ref()),
            Kind::Completion => None,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// Choice `index`: the whole text, or a streamed delta, with `logprobs` (the value of
    /// its `logprobs` field). `called`: the choice made tool calls, which is what ended it
    /// unless it ran out of tokens.
    fn choice(
        &self,
        index: usize,
        piece: Piece,
        first: bool,
        finish: Option<(StopReason, bool)>,
        chunk: bool,
        logprobs: Value,
    ) -> Value {
        let finish_reason = finish.map(|(reason, called)| match reason {
            StopReason::Length => "length",
            StopReason::Eos | StopReason::Stop if called => "tool_calls",
            StopReason::Eos | StopReason::Stop => "stop",
        });
        let text = match piece {
            Piece::Text(text) => text,
            Piece::Reasoning(_) | Piece::Call(..) => None,
        };
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": index, "logprobs": logprobs, "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": text.unwrap_or_default()},
            }),
            (Kind::Chat, true) => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(text) = text {
                    delta.insert("content".into(), text.into());
                }
                if let Piece::Reasoning(text) = piece {
                    delta.insert("reasoning_content".into(), text.into());
                }
                if let Piece::Call(at, call) = piece {
                    delta.insert("tool_calls".into(), json!([call_value(Some(at), call)]));
                }
                json!({"index": index, "logprobs": logprobs, "finish_reason": finish_reason, "delta": delta})
            }
            (Kind::Completion, _) => json!({
                "index": index, "logprobs": logprobs, "finish_reason": finish_reason,
                "text": text.unwrap_or_default(),
            }),
        }
    }

    /// OpenAI's `logprobs` object: chat's `content` list (token, logprob, bytes,
    /// top_logprobs), or the completions API's parallel lists, whose `text_offset`s are
    /// `offsets`. Null if not asked for.
    fn logprobs_value(&self, logprobs: &[Logprob], offsets: &[usize]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entry = |l: &Logprob| json!({"token": l.token, "logprob": l.logprob, "bytes": l.bytes});
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = logprobs
                    .iter()
                    .map(|l| {
                        let mut value = entry(l);
                        value["top_logprobs"] = l.top.iter().map(entry).collect();
                        value
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Completion => json!({
                "tokens": logprobs.iter().map(|l| l.token.as_str()).collect::<Vec<_>>(),
                "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": logprobs.iter().map(|l| {
                    l.top.iter().map(|t| (t.token.clone(), json!(t.logprob))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            }),
        }
    }

    fn envelope(&self, choices: Vec<Value>, usage: Option<Value>, chunk: bool) -> Value {
        let mut body = json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(usage) = usage {
            body["usage"] = usage;
        }
        body
    }

    /// The whole answer as one JSON response: every choice, in order.
    pub async fn whole(self, events: Vec<async_mpsc::UnboundedReceiver<Event>>) -> Response {
        let mut choices = Vec::with_capacity(events.len());
        let mut usage = Usage::default();
        for (index, mut events) in events.into_iter().enumerate() {
            let mut text = String::new();
            let mut logprobs = Vec::new();
            let reason = loop {
                match events.recv().await {
                    Some(Event::Waiting) => {}
                    Some(Event::Text(piece)) => text.push_str(&piece),
                    Some(Event::Logprobs(more)) => logprobs.extend(more),
                    Some(Event::Done(finished)) => {
                        usage.add(&finished);
                        break finished.reason;
                    }
                    Some(Event::Failed(message)) => return failed(message).into_response(),
                    Some(Event::Refused(message)) => {
                        return self.refused(message).into_response();
                    }
                    None => return failed("the engine stopped".into()).into_response(),
                }
            };
            let offsets = Offsets::default().next(&text, &logprobs);
            let logprobs = self.logprobs_value(&logprobs, &offsets);
            let Some(mut reading) = self.reading() else {
                let piece = Piece::Text(Some(&text));
                let choice =
                    self.choice(index, piece, false, Some((reason, false)), false, logprobs);
                choices.push(choice);
                continue;
            };
            let mut said = reading.push(&text);
            said.extend(reading.finish());
            let (mut reasoning, mut content, mut calls) =
                (String::new(), String::new(), Vec::new());
            for said in said {
                match said {
                    Said::Reasoning(text) => reasoning.push_str(&text),
                    Said::Delta(Delta::Content(text)) => content.push_str(&text),
                    Said::Delta(Delta::Call(call)) => calls.push(call),
                }
            }
            let finish = Some((reason, !calls.is_empty()));
            let mut choice = self.choice(index, Piece::Text(None), false, finish, false, logprobs);
            let message = &mut choice["message"];
            message["content"] = (!content.is_empty()).then_some(content).into();
            if !reasoning.is_empty() {
                message["reasoning_content"] = reasoning.into();
            }
            if !calls.is_empty() {
                let calls = calls.iter().map(|call| call_value(None, call));
                message["tool_calls"] = calls.collect();
            }
            choices.push(choice);
        }
        Json(self.envelope(choices, Some(usage.value()), false)).into_response()
    }

    /// Server-sent events: a chunk per piece of a choice's text, with the log-probabilities
    /// of the tokens it completes; one per choice with its finish reason (and the
    /// log-probabilities of tokens whose text never came: a stop string's); usage if asked
    /// for, then `[DONE]`. A failure after the stream began is an `error` chunk. A request
    /// that has to wait for a slot says so first, in a comment (`: waiting for a free
    /// slot`). The client leaving cancels the request at once, whether or not it runs.
    pub fn stream(
        self,
        events: Vec<async_mpsc::UnboundedReceiver<Event>>,
        include_usage: bool,
    ) -> Sse<UnboundedReceiverStream<Result<SseEvent, Infallible>>> {
        let (out, stream) = async_mpsc::unbounded_channel();
        tokio::spawn(async move {
            let send = |value: Value| out.send(Ok(SseEvent::default().data(value.to_string())));
            let mut choices: Vec<Streamed> = (events.iter())
                .map(|_| Streamed {
                    reading: self.reading(),
                    ..Streamed::default()
                })
                .collect();
            let mut events: StreamMap<usize, UnboundedReceiverStream<Event>> =
                (events.into_iter().map(UnboundedReceiverStream::new))
                    .enumerate()
                    .collect();
            let mut usage = Usage::default();
            let mut running = choices.len();
            // Whether the stream has said it waits for a slot (once, for all its choices).
            let mut told_waiting = false;
            loop {
                let next = tokio::select! {
                    next = events.next() => next,
                    // The client is gone (the response body dropped): dropping `events` now
                    // cancels the request, also while it is queued and nothing is sent.
                    () = out.closed() => return,
                };
                let Some((index, event)) = next else { break };
                let choice = &mut choices[index];
                let values = match event {
                    Event::Waiting if told_waiting => continue,
                    Event::Waiting => {
                        told_waiting = true;
                        // A comment, which OpenAI's clients skip; the chat page shows it.
                        let waiting = SseEvent::default().comment(WAITING);
                        if out.send(Ok(waiting)).is_err() {
                            return;
                        }
                        continue;
                    }
                    Event::Logprobs(logprobs) => {
                        choice.pending.push(logprobs);
                        continue;
                    }
                    Event::Text(piece) => {
                        choice.text.push_str(&piece);
                        let logprobs = choice.pending.release(&piece);
                        match choice.reading.as_mut().map(|reading| reading.push(&piece)) {
                            None => vec![self.chunk(
                                index,
                                choice,
                                Piece::Text(Some(&piece)),
                                None,
                                &logprobs,
                            )],
                            Some(deltas) => {
                                choice.held.extend(logprobs);
                                self.deltas(index, choice, deltas)
                            }
                        }
                    }
                    Event::Done(finished) => {
                        usage.add(&finished);
                        let reason = finished.reason;
                        running -= 1;
                        let mut values = match choice.reading.take() {
                            Some(reading) => self.deltas(index, choice, reading.finish()),
                            None => Vec::new(),
                        };
                        let mut logprobs = std::mem::take(&mut choice.held);
                        logprobs.extend(choice.pending.rest());
                        let finish = Some((reason, choice.calls > 0));
                        values.push(self.chunk(
                            index,
                            choice,
                            Piece::Text(None),
                            finish,
                            &logprobs,
                        ));
                        values
                    }
                    Event::Failed(message) => {
                        let _ = send(failed(message).body());
                        return;
                    }
                    Event::Refused(message) => {
                        let _ = send(self.refused(message).body());
                        return;
                    }
                };
                for value in values {
                    if send(self.envelope(vec![value], None, true)).is_err() {
                        // The client is gone: dropping `events` cancels the request.
                        return;
                    }
                }
                if running == 0 {
                    break;
                }
            }
            if running > 0 {
                let _ = send(failed("the engine stopped".into()).body());
                return;
            }
            if include_usage {
                let _ = send(self.envelope(vec![], Some(usage.value()), true));
            }
            let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
        });
        Sse::new(UnboundedReceiverStream::new(stream))
    }

    /// The chunks of what the reading of a choice said, the log-probabilities of the text
    /// it held with the first.
    fn deltas(&self, index: usize, choice: &mut Streamed, said: Vec<Said>) -> Vec<Value> {
        let mut values = Vec::with_capacity(said.len());
        for said in said {
            let logprobs = std::mem::take(&mut choice.held);
            let value = match &said {
                Said::Reasoning(text) => {
                    self.chunk(index, choice, Piece::Reasoning(text), None, &logprobs)
                }
                Said::Delta(Delta::Content(text)) => {
                    self.chunk(index, choice, Piece::Text(Some(text)), None, &logprobs)
                }
                Said::Delta(Delta::Call(call)) => {
                    choice.calls += 1;
                    let piece = Piece::Call(choice.calls - 1, call);
                    self.chunk(index, choice, piece, None, &logprobs)
                }
            };
            values.push(value);
        }
        values
    }

    /// A request whose grammar could not be followed (see [`Event::Refused`]).
    fn refused(&self, message: String) -> ApiError {
        let param = self.grammar_param;
        ApiError::invalid_field(param, format!("{param}: {message}"))
    }

    /// A streamed chunk's choice: `piece` and the `logprobs` of the tokens it completes.
    fn chunk(
        &self,
        index: usize,
        choice: &mut Streamed,
        piece: Piece,
        finish: Option<(StopReason, bool)>,
        logprobs: &[Logprob],
    ) -> Value {
        let offsets = choice.offsets.next(&choice.text, logprobs);
        let first = !std::mem::replace(&mut choice.started, true);
        // A chunk carrying no token says so with null, as OpenAI's last chunk does.
        let logprobs = match logprobs {
            [] => Value::Null,
            _ => self.logprobs_value(logprobs, &offsets),
        };
        self.choice(index, piece, first, finish, true, logprobs)
    }
}

/// Pairs each token's log-probability with the text that carries it. The engine reports a
/// token when it is generated, but its text may come later (a character split over tokens
/// is released once whole, a possible start of a stop string once it is known not to be
/// one) or never (a stop string's own tokens). A token goes with the piece of text that
/// completes its bytes; the rest go with the choice's last chunk.
#[derive(Default)]
struct Pending {
    logprobs: VecDeque<Logprob>,
    /// Bytes of text released and not yet matched to a token.
    released: usize,
}

impl Pending {
    fn push(&mut self, logprobs: Vec<Logprob>) {
        self.logprobs.extend(logprobs);
    }

    /// The tokens whose bytes `text`, the next piece of text, completes.
    fn release(&mut self, text: &str) -> Vec<Logprob> {
        self.released += text.len();
        let mut done = Vec::new();
        while let Some(next) = self.logprobs.front()
            && next.bytes.len() <= self.released
        {
            self.released -= next.bytes.len();
            done.extend(self.logprobs.pop_front());
        }
        done
    }

    /// Every token not yet released.
    fn rest(&mut self) -> Vec<Logprob> {
        self.released = 0;
        self.logprobs.drain(..).collect()
    }
}

/// The completions API's `text_offset`: where each token begins in its choice's text, in
/// characters (as Python, OpenAI's main client, indexes a string), counted from the bytes of
/// the tokens before it. A token that begins inside a character points at that character;
/// one whose text was cut (a stop string) at the text's end.
#[derive(Default)]
struct Offsets {
    /// Bytes of the tokens so far.
    tokens: usize,
    /// The first `counted` bytes of the text hold `chars` whole characters.
    counted: usize,
    chars: usize,
}

impl Offsets {
    /// The offsets of the next `logprobs` in `text` (the choice's text so far).
    fn next(&mut self, text: &str, logprobs: &[Logprob]) -> Vec<usize> {
        logprobs
            .iter()
            .map(|l| {
                for c in text.get(self.counted..).unwrap_or_default().chars() {
                    if self.counted + c.len_utf8() > self.tokens {
                        break;
                    }
                    self.counted += c.len_utf8();
                    self.chars += 1;
                }
                self.tokens += l.bytes.len();
                self.chars
            })
            .collect()
    }
}

/// OpenAI's usage object, summed over a request's choices; `cached_tokens` are the prompt
/// tokens taken from a kept cache.
#[derive(Default)]
struct Usage {
    prompt_tokens: usize,
    cached_tokens: usize,
    completion_tokens: usize,
}

impl Usage {
    /// Adds one choice's counts.
    fn add(&mut self, finished: &Finished) {
        self.prompt_tokens += finished.prompt_tokens;
        self.cached_tokens += finished.cached_tokens;
        self.completion_tokens += finished.completion_tokens;
    }

    fn value(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

fn failed(message: String) -> ApiError {
    ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, message)
}

/// A call in OpenAI's shape: with its place among the choice's calls when streamed.
fn call_value(index: Option<usize>, call: &Call) -> Value {
    let mut value = json!({
        "id": format!("call_{:016x}", rand::random::<u64>()),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(index) = index {
        value["index"] = index.into();
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str, bytes: &[u8]) -> Logprob {
        Logprob {
            token: text.into(),
            bytes: bytes.to_vec(),
            logprob: -1.0,
            top: Vec::new(),
        }
    }

    /// "日" is E6 97 A5: split over two tokens, it is released whole with the second.
    fn split_character() -> [Logprob; 3] {
        [
            token("a", b"a"),
            token("\u{FFFD}", &[0xE6, 0x97]),
            token("\u{FFFD}b", &[0xA5, b'b']),
        ]
    }

    #[test]
    fn a_token_travels_with_the_text_that_completes_it() {
        let mut pending = Pending::default();
        let [a, head, tail] = split_character();
        pending.push(vec![a.clone()]);
        assert_eq!(pending.release("a"), [a]);
        pending.push(vec![head.clone()]);
        pending.push(vec![tail.clone()]);
        assert_eq!(pending.release("日b"), [head, tail]);
        // A held-back " (" whose space alone is released stays until its text comes, or
        // goes with the last chunk if it never does (a stop string cut it).
        pending.push(vec![token(" (", b" (")]);
        assert!(pending.release(" ").is_empty());
        assert_eq!(pending.rest(), [token(" (", b" (")]);
        assert!(pending.rest().is_empty());
    }

    #[test]
    fn text_offsets_count_characters_from_the_tokens_bytes() {
        let tokens = split_character();
        assert_eq!(Offsets::default().next("a日b", &tokens), [0, 1, 1]);
        // Streamed in two pieces: the same offsets.
        let mut offsets = Offsets::default();
        assert_eq!(offsets.next("a", &tokens[..1]), [0]);
        assert_eq!(offsets.next("a日b", &tokens[1..]), [1, 1]);
        // Tokens past the text (cut by a stop string) point at its end.
        let cut = [token("x", b"x"), token("yz", b"yz"), token("w", b"w")];
        assert_eq!(Offsets::default().next("x", &cut), [0, 1, 1]);
    }
}

#[cfg(test)]
mod reading_tests {
    use super::*;

    const ANSWER: &str = "<think>\nThe weather, then.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    /// A reply reading for reasoning and for Hermes calls of `get_weather`.
    fn reply(thinking: Thinking) -> Reply {
        let mut reply = Reply::new(Kind::Chat, 1, "m".into(), false);
        reply.thinking = thinking;
        reply.tools = Some(ToolReading {
            format: Format::Hermes,
            names: vec!["get_weather".into()],
            parallel: true,
        });
        reply
    }

    /// The engine's events for `answer` sent in pieces of `size` bytes (ASCII).
    fn events(answer: &str, size: usize) -> Vec<async_mpsc::UnboundedReceiver<Event>> {
        let (sender, receiver) = async_mpsc::unbounded_channel();
        let mut at = 0;
        while at < answer.len() {
            let end = (at + size).min(answer.len());
            sender.send(Event::Text(answer[at..end].into())).unwrap();
            at = end;
        }
        let done = Event::Done(Finished {
            reason: StopReason::Eos,
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 9,
            stop_string: None,
        });
        sender.send(done).unwrap();
        vec![receiver]
    }

    fn body(response: Response) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime
            .block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn whole(reply: Reply, answer: &str, size: usize) -> Value {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let response = runtime.block_on(reply.whole(events(answer, size)));
        serde_json::from_str(&body(response)).unwrap()
    }

    /// The streamed chunks' reasoning, content, calls and finish reason, joined.
    fn streamed(reply: Reply, answer: &str, size: usize) -> (String, String, Vec<Value>, Value) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let text = runtime.block_on(async {
            let response = reply.stream(events(answer, size), false).into_response();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await;
            String::from_utf8(bytes.unwrap().to_vec()).unwrap()
        });
        let (mut reasoning, mut content, mut calls, mut finish) =
            (String::new(), String::new(), Vec::new(), Value::Null);
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(line).unwrap();
            let choice = &chunk["choices"][0];
            let delta = &choice["delta"];
            reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
            content.push_str(delta["content"].as_str().unwrap_or_default());
            calls.extend(delta["tool_calls"].as_array().cloned().unwrap_or_default());
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
        (reasoning, content, calls, finish)
    }

    /// A thinking answer that calls a tool: its reasoning in `reasoning_content`, the call
    /// in `tool_calls`, no content; streamed in pieces of any size, the same.
    #[test]
    fn reasoning_and_calls_are_read_whole_and_streamed() {
        for size in [1, 2, 3, 7, 16, ANSWER.len()] {
            let answer = whole(reply(Thinking::Split), ANSWER, size);
            let message = &answer["choices"][0]["message"];
            assert_eq!(message["reasoning_content"], "The weather, then.");
            assert_eq!(message["content"], Value::Null);
            assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
            assert_eq!(
                message["tool_calls"][0]["function"]["arguments"],
                r#"{"city":"Paris"}"#
            );
            assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");

            let (reasoning, content, calls, finish) =
                streamed(reply(Thinking::Split), ANSWER, size);
            assert_eq!(reasoning, "The weather, then.", "pieces of {size}");
            assert_eq!(content, "");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0]["index"], 0);
            assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Paris"}"#);
            assert_eq!(finish, "tool_calls");
        }
        // Kept in the content (--keep-thinking): the call is still read, after the section.
        let answer = whole(reply(Thinking::Kept), ANSWER, 5);
        let message = &answer["choices"][0]["message"];
        assert_eq!(message["content"], "<think>\nThe weather, then.\n</think>");
        assert!(message.get("reasoning_content").is_none());
        assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);
    }

    /// After a prompt that opened the section (DeepSeek-R1's distills), the answer is
    /// reasoning up to `</think>`, which never reaches the content; the call after it is
    /// read. Kept (`--keep-thinking`), the content is the answer as written.
    #[test]
    fn an_answer_to_a_prompt_that_opened_the_section_is_reasoning_until_it_closes() {
        let answer = ANSWER.strip_prefix("<think>").unwrap();
        for size in [1, 2, 5, answer.len()] {
            let whole = whole(reply(Thinking::Opened), answer, size);
            let message = &whole["choices"][0]["message"];
            assert_eq!(message["reasoning_content"], "The weather, then.");
            assert_eq!(message["content"], Value::Null);
            assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");

            let (reasoning, content, calls, _) = streamed(reply(Thinking::Opened), answer, size);
            assert_eq!(reasoning, "The weather, then.", "pieces of {size}");
            assert_eq!(content, "");
            assert_eq!(calls.len(), 1);
        }
        let kept = whole(reply(Thinking::Kept), answer, 3);
        let message = &kept["choices"][0]["message"];
        assert_eq!(message["content"], "The weather, then.\n</think>");
        assert!(message.get("reasoning_content").is_none());
    }

    /// `parallel_tool_calls: false` under `auto`: an answer calling twice keeps its first
    /// call, whole and streamed; with it true, both.
    #[test]
    fn one_call_kept_without_parallel_calls() {
        let call = |city: &str| {
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>"
            )
        };
        let answer = format!("{}\n{}", call("Paris"), call("Rome"));
        for (parallel, expected) in [(false, 1), (true, 2)] {
            let single = || {
                let mut reply = reply(Thinking::Kept);
                reply.tools.as_mut().unwrap().parallel = parallel;
                reply
            };
            for size in [1, 4, answer.len()] {
                let whole = whole(single(), &answer, size);
                let calls = whole["choices"][0]["message"]["tool_calls"]
                    .as_array()
                    .unwrap();
                assert_eq!(calls.len(), expected, "{whole}");
                assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Paris"}"#);
                let (_, content, calls, finish) = streamed(single(), &answer, size);
                assert_eq!(
                    (calls.len(), finish.as_str()),
                    (expected, Some("tool_calls"))
                );
                assert_eq!(content.trim(), "", "pieces of {size}");
            }
        }
    }
}
