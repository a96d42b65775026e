//! A thinking model's answers split into reasoning and reply, whole and for every split of
//! the stream. The answers are written by hand in the shape Qwen3 and SmolLM3 write them
//! (`<think>\n...\n</think>\n\n` then the reply); none could be recorded here (no hub).

use runtime::text::reasoning::{Part, Splitter};

/// (answer, reasoning, reply).
const CASES: &[(&str, Option<&str>, Option<&str>)] = &[
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

#[test]
fn answers_split_into_reasoning_and_reply() {
    for &(answer, reasoning, reply) in CASES {
        let expected = (reasoning.map(String::from), reply.map(String::from));
        assert_eq!(Splitter::split(answer), expected, "{answer:?}");
    }
}

#[test]
fn every_split_of_the_stream_gives_the_whole_answers_parts() {
    for &(answer, ..) in CASES {
        let whole = Splitter::split(answer);
        for cut in (0..=answer.len()).filter(|&i| answer.is_char_boundary(i)) {
            let mut splitter = Splitter::default();
            let mut parts = splitter.push(&answer[..cut]);
            parts.extend(splitter.push(&answer[cut..]));
            parts.extend(splitter.finish());
            assert_eq!(joined(parts), whole, "{answer:?} cut at {cut}");
        }
        let mut splitter = Splitter::default();
        let mut parts = Vec::new();
        for c in answer.chars() {
            parts.extend(splitter.push(&c.to_string()));
        }
        parts.extend(splitter.finish());
        assert_eq!(joined(parts), whole, "{answer:?} by characters");
    }
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
