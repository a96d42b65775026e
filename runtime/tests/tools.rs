//! Tool-call parsing: model outputs in each family's format read into content and calls,
//! and for every split of each output, the streamed deltas join to the whole message's.
//!
//! The outputs are written by hand in the formats the Qwen2.5 and Llama 3.2 templates
//! teach (runtime/tests/data/chat-tools), as those models write them (whitespace and key
//! order included); no model output could be recorded here (no hub access).

use runtime::text::tools::{Call, Delta, Format, Parser};

fn names() -> Vec<String> {
    ["get_weather", "search", "noop"].map(String::from).to_vec()
}

fn call(name: &str, arguments: &str) -> Call {
    Call {
        name: name.into(),
        arguments: arguments.into(),
    }
}

struct Case {
    format: Format,
    text: &'static str,
    content: Option<&'static str>,
    calls: Vec<Call>,
}

fn cases() -> Vec<Case> {
    use Format::{Hermes, Llama3};
    let weather = || call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#);
    vec![
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            content: None,
            calls: vec![weather()],
        },
        // Two calls, the way Qwen2.5 writes parallel calls.
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"<b>&amp;</b> \\\"quoted\\\"\"}}\n</tool_call>",
            content: None,
            calls: vec![
                weather(),
                call("search", r#"{"q":"<b>&amp;</b> \"quoted\""}"#),
            ],
        },
        // Text before a call is content; empty arguments are kept.
        Case {
            format: Hermes,
            text: "Let me check that for you.\n\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>",
            content: Some("Let me check that for you."),
            calls: vec![call("noop", "{}")],
        },
        // An unknown tool and broken JSON stay content, as written.
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call> and <tool_call>{\"name\": \"search\", \"arguments\": {\"q\": }</tool_call>",
            content: Some(
                "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call> and <tool_call>{\"name\": \"search\", \"arguments\": {\"q\": }</tool_call>",
            ),
            calls: vec![],
        },
        // A message ending inside a block: a call if the block is whole, else content.
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"rust\"}}\n",
            content: None,
            calls: vec![call("search", r#"{"q":"rust"}"#)],
        },
        // A call cut off (max_tokens) is left out, whole blocks before it kept, as is a
        // tag cut off as it began.
        Case {
            format: Hermes,
            text: "Sure <tool_call>\n{\"name\": \"search\", \"argu",
            content: Some("Sure"),
            calls: vec![],
        },
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>\n<tool_",
            content: None,
            calls: vec![call("noop", "{}")],
        },
        // Arguments as the model wrote them, the whitespace between tokens left out:
        // numbers past f64's precision, exponents and escapes unchanged (issue 42).
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a b\", \"n\": 98765432109876543210987654321, \"x\": 1.0e5, \"s\": \"caf\\u00e9 \\\"x\\\"\"}}\n</tool_call>",
            content: None,
            calls: vec![call(
                "search",
                r#"{"q":"a b","n":98765432109876543210987654321,"x":1.0e5,"s":"caf\u00e9 \"x\""}"#,
            )],
        },
        // `</tool_call>` inside an argument's string does not end the block.
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a </tool_call> b\"}}\n</tool_call>",
            content: None,
            calls: vec![call("search", r#"{"q":"a </tool_call> b"}"#)],
        },
        // Plain text, with what looks like the start of a tag in it, and non-ASCII.
        Case {
            format: Hermes,
            text: "  The answer is x < y, <tool and 日本 ✓.\n",
            content: Some("The answer is x < y, <tool and 日本 ✓."),
            calls: vec![],
        },
        // Arguments written as a string of JSON (some fine-tunes do).
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}\n</tool_call>",
            content: None,
            calls: vec![call("search", r#"{"q":"x"}"#)],
        },
        Case {
            format: Llama3,
            text: "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
            content: None,
            calls: vec![weather()],
        },
        // The form with "type" first, and arguments under "arguments".
        Case {
            format: Llama3,
            text: "{\"type\": \"function\", \"name\": \"search\", \"arguments\": {\"q\": \"llama\"}}",
            content: None,
            calls: vec![call("search", r#"{"q":"llama"}"#)],
        },
        // Calls joined by `;`, as Llama 3.2 3B writes several.
        Case {
            format: Llama3,
            text: "{\"name\": \"search\", \"parameters\": {\"q\": \"a\"}}; {\"name\": \"noop\", \"parameters\": {}}",
            content: None,
            calls: vec![call("search", r#"{"q":"a"}"#), call("noop", "{}")],
        },
        // JSON that is not a call of an offered tool is content, whole.
        Case {
            format: Llama3,
            text: "{\"name\": \"Ada\", \"parameters\": {\"born\": 1815}}",
            content: Some("{\"name\": \"Ada\", \"parameters\": {\"born\": 1815}}"),
            calls: vec![],
        },
        Case {
            format: Llama3,
            text: "{\"name\": \"search\", \"parameters\": {\"q\": \"a\"}} and then some prose",
            content: Some(
                "{\"name\": \"search\", \"parameters\": {\"q\": \"a\"}} and then some prose",
            ),
            calls: vec![],
        },
        // Prose mentioning a call is content, streamed as it comes.
        Case {
            format: Llama3,
            text: "\nI would call {\"name\": \"search\"} but I know it: 42.",
            content: Some("I would call {\"name\": \"search\"} but I know it: 42."),
            calls: vec![],
        },
        Case {
            format: Llama3,
            text: "  \n",
            content: None,
            calls: vec![],
        },
    ]
}

fn joined(deltas: Vec<Delta>) -> (Option<String>, Vec<Call>) {
    let (mut content, mut calls) = (String::new(), Vec::new());
    for delta in deltas {
        match delta {
            Delta::Content(text) => {
                assert!(!text.is_empty(), "an empty content delta");
                content.push_str(&text);
            }
            Delta::Call(call) => calls.push(call),
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

#[test]
fn outputs_parse_into_content_and_calls() {
    for case in cases() {
        let parsed = Parser::parse(case.format, names(), case.text);
        let expected = (case.content.map(String::from), case.calls);
        assert_eq!(parsed, expected, "{:?}", case.text);
    }
}

/// Every cut into two pieces at a character boundary, and the text a character at a time:
/// the deltas join to the whole message's content and calls.
#[test]
fn every_split_streams_the_whole_message() {
    for case in cases() {
        let whole = Parser::parse(case.format, names(), case.text);
        let boundaries = (0..=case.text.len()).filter(|&i| case.text.is_char_boundary(i));
        for cut in boundaries {
            let mut parser = Parser::new(case.format, names());
            let mut deltas = parser.push(&case.text[..cut]);
            deltas.extend(parser.push(&case.text[cut..]));
            deltas.extend(parser.finish());
            assert_eq!(joined(deltas), whole, "{:?} cut at {cut}", case.text);
        }
        let mut parser = Parser::new(case.format, names());
        let mut deltas = Vec::new();
        for c in case.text.chars() {
            deltas.extend(parser.push(&c.to_string()));
        }
        deltas.extend(parser.finish());
        assert_eq!(joined(deltas), whole, "{:?} by characters", case.text);
    }
}

/// Content streams before the message ends, except what may still open a call: a Hermes
/// reply's prose is sent while it is written.
#[test]
fn content_streams_before_the_end() {
    let mut parser = Parser::new(Format::Hermes, names());
    assert_eq!(
        parser.push("Hello there <tool"),
        vec![Delta::Content("Hello there".into())]
    );
    assert_eq!(
        parser.push("box> ok"),
        vec![Delta::Content(" <toolbox> ok".into())]
    );
    let mut parser = Parser::new(Format::Llama3, names());
    assert_eq!(parser.push("Hi"), vec![Delta::Content("Hi".into())]);
}
