//! A thinking model's answers split into reasoning and reply, whole and for every split of
//! the stream. The answers are written by hand in the shape Qwen3 and SmolLM3 write them
//! (`<think>\n...\n</think>\n\n` then the reply), and DeepSeek-R1's distills after a
//! prompt that opened the section (`...\n</think>\n\n` then the reply); none could be
//! recorded here (no hub).

use runtime::text::reasoning::{Part, Splitter, opens_thinking};

/// (answer, reasoning, reply).
type Case = (&'static str, Option<&'static str>, Option<&'static str>);

const CASES: &[Case] = &[
    (
        "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?",
        Some("The user greets me. I should greet back."),
        Some("Hello! How can I help?"),
    ),
    // Thinking switched off: the template opened and closed the section in the prompt.
    (
        "Hello! How can I help?",
        None,
        Some("Hello! How can I help?"),
    ),
    // An empty section.
    ("<think>\n\n</think>\n\n4", None, Some("4")),
    // Cut off while thinking (max_tokens): all reasoning.
    (
        "<think>\nFirst, 17 × 3 = 51. Then",
        Some("First, 17 × 3 = 51. Then"),
        None,
    ),
    // Markup in the reply or the reasoning is text; only the opening section is thinking.
    (
        "<think>x < y and </thin is not the end</think>The tags <think></think> are literal.",
        Some("x < y and </thin is not the end"),
        Some("The tags <think></think> are literal."),
    ),
    // Text before `<think>`: not a thinking answer.
    (
        "Sure. <think>hmm</think> done",
        None,
        Some("Sure. <think>hmm</think> done"),
    ),
    ("  \n", None, None),
    ("<thin", None, Some("<thin")),
    (
        "\n<think>日本語で考える。</think>\n\n答え：はい。\n",
        Some("日本語で考える。"),
        Some("答え：はい。"),
    ),
    // A reply that is a tool call (Qwen3 thinks, then calls).
    (
        "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        Some("I need the weather."),
        Some(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ),
    ),
];

/// Answers to a prompt that opened the section itself (DeepSeek-R1's distills' templates
/// end with `<think>\n`): (answer, reasoning, reply).
const OPENED: &[Case] = &[
    (
        "Okay, the user says hello.\n</think>\n\nHello! How can I help?",
        Some("Okay, the user says hello."),
        Some("Hello! How can I help?"),
    ),
    // Cut off while thinking, or never closed: all reasoning (as vLLM's DeepSeek-R1 parser).
    ("Let me count: 1, 2", Some("Let me count: 1, 2"), None),
    // The model writes the opening tag again: it is not reasoning's text.
    (
        "<think>\nHmm.\n</think>\n\nYes.",
        Some("Hmm."),
        Some("Yes."),
    ),
    ("\n\n</think>\n\n4", None, Some("4")),
    ("<thin", Some("<thin"), None),
    ("a </think> b </think> c", Some("a"), Some("b </think> c")),
];

fn split(splitter: fn() -> Splitter, answer: &str) -> (Option<String>, Option<String>) {
    Splitter::split(splitter(), answer)
}

fn joined(parts: Vec<Part>) -> (Option<String>, Option<String>) {
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

/// A list of cases and the splitter it is read by.
type Cases = (&'static [Case], fn() -> Splitter);

fn all_cases() -> [Cases; 2] {
    [(CASES, Splitter::default), (OPENED, Splitter::opened)]
}

#[test]
fn answers_split_into_reasoning_and_reply() {
    for (cases, splitter) in all_cases() {
        for &(answer, reasoning, reply) in cases {
            let expected = (reasoning.map(String::from), reply.map(String::from));
            assert_eq!(split(splitter, answer), expected, "{answer:?}");
        }
    }
}

#[test]
fn every_split_of_the_stream_gives_the_whole_answers_parts() {
    for (cases, splitter) in all_cases() {
        for &(answer, ..) in cases {
            every_split(splitter, answer);
        }
    }
}

fn every_split(new: fn() -> Splitter, answer: &str) {
    let whole = split(new, answer);
    for cut in (0..=answer.len()).filter(|&i| answer.is_char_boundary(i)) {
        let mut splitter = new();
        let mut parts = splitter.push(&answer[..cut]);
        parts.extend(splitter.push(&answer[cut..]));
        parts.extend(splitter.finish());
        assert_eq!(joined(parts), whole, "{answer:?} cut at {cut}");
    }
    let mut splitter = new();
    let mut parts = Vec::new();
    for c in answer.chars() {
        parts.extend(splitter.push(&c.to_string()));
    }
    parts.extend(splitter.finish());
    assert_eq!(joined(parts), whole, "{answer:?} by characters");
}

/// Reasoning streams while it is written, not at its end.
#[test]
fn reasoning_streams_as_it_comes() {
    let mut splitter = Splitter::default();
    assert_eq!(
        splitter.push("<think>\nLet me see"),
        [Part::Reasoning("Let me see".into())]
    );
    assert_eq!(
        splitter.push(". Yes.</th"),
        [Part::Reasoning(". Yes.".into())]
    );
    assert_eq!(splitter.push("ink>\n\nOk"), [Part::Reply("Ok".into())]);
}

/// A prompt opens the section when it ends with `<think>` (whitespace after it aside), as
/// DeepSeek-R1's distills' templates render it; Qwen3's with thinking off closes it again.
#[test]
fn prompts_that_open_the_section_are_told_apart() {
    assert!(opens_thinking("<｜User｜>Hi<｜Assistant｜><think>\n"));
    assert!(opens_thinking("<|im_start|>assistant\n<think>"));
    assert!(!opens_thinking(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ));
    assert!(!opens_thinking("<|im_start|>assistant\n"));
    assert!(!opens_thinking("Say <think> <|im_start|>assistant\n"));
}
