//! A thinking model's answer split into its reasoning and its reply: Qwen3, SmolLM3 and
//! DeepSeek-R1's distillations open an answer with `<think>...</think>`, and servers hand
//! that section to clients apart (`reasoning_content`, as vLLM and llama-server do).
//!
//! An answer that does not open with `<think>` (after whitespace) is all reply: thinking
//! switched off, or a model that does not think. One cut off inside its `<think>` section
//! is all reasoning. Each part has the whitespace at its ends left out, as the templates
//! strip it when they put an answer back into the history.
//!
//! Some templates open the section themselves: DeepSeek-R1's distills end the prompt with
//! `<think>\n`, so the answer starts inside it and only closes it
//! ([`Splitter::opened`], [`opens_thinking`]; llama.cpp calls this "thinking forced open").

/// A piece of an answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Reply(String),
}

use crate::text::trim::{Trimmed, partial_suffix};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Splits an answer as it streams. The parts of any split of a text join to the whole
/// text's.
#[derive(Debug, Default)]
pub struct Splitter {
    state: State,
    /// Text not yet told apart: the answer's start (is it `<think>`?), or a tail that may
    /// be the start of `</think>`.
    held: String,
    reasoning: Trimmed,
    reply: Trimmed,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Start,
    /// Inside a section the prompt opened: the model may still write `<think>` first.
    Opened,
    Thinking,
    Reply,
}

/// Whether a rendered prompt leaves its answer inside a `<think>` section it opened.
pub fn opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

impl Splitter {
    /// A splitter for the answer to a prompt that opened the `<think>` section itself
    /// ([`opens_thinking`]): the answer is reasoning until `</think>`.
    pub fn opened() -> Self {
        Self {
            state: State::Opened,
            ..Self::default()
        }
    }

    /// The parts the text so far tells.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        self.parts(false)
    }

    /// The rest, at the end of the answer.
    pub fn finish(mut self) -> Vec<Part> {
        self.parts(true)
    }

    /// A whole answer, split by `splitter`: its reasoning and its reply (`None` where
    /// empty).
    pub fn split(mut splitter: Splitter, text: &str) -> (Option<String>, Option<String>) {
        let mut parts = splitter.push(text);
        parts.extend(splitter.finish());
        let (mut reasoning, mut reply) = (String::new(), String::new());
        for part in parts {
            match part {
                Part::Reasoning(text) => reasoning.push_str(&text),
                Part::Reply(text) => reply.push_str(&text),
            }
        }
        let some = |text: String| (!text.is_empty()).then_some(text);
        (some(reasoning), some(reply))
    }

    fn parts(&mut self, end: bool) -> Vec<Part> {
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start | State::Opened => {
                    let start = self.held.trim_start();
                    if let Some(rest) = start.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking;
                    } else if !end && OPEN.starts_with(start) {
                        return out;
                    } else if self.state == State::Opened {
                        self.state = State::Thinking;
                    } else {
                        self.state = State::Reply;
                    }
                }
                State::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        let reasoning: String = self.held.drain(..at + CLOSE.len()).collect();
                        let reasoning = &reasoning[..at];
                        out.extend(self.reasoning.push(reasoning).map(Part::Reasoning));
                        self.state = State::Reply;
                    }
                    None => {
                        let keep = if end {
                            0
                        } else {
                            partial_suffix(&self.held, CLOSE)
                        };
                        let text: String = self.held.drain(..self.held.len() - keep).collect();
                        out.extend(self.reasoning.push(&text).map(Part::Reasoning));
                        return out;
                    }
                },
                State::Reply => {
                    let text = std::mem::take(&mut self.held);
                    out.extend(self.reply.push(&text).map(Part::Reply));
                    return out;
                }
            }
        }
    }
}
