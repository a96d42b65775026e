//! Tool-call parsing: model outputs in each family's format read into content and calls,
//! and for every split of each output, the streamed deltas join to the whole message's.
//!
//! The outputs are written by hand in the formats the Qwen2.5 and Llama 3.2 templates
//! teach (runtime/tests/data/chat-tools), as those models write them (whitespace and key
//! order included); no model output could be recorded here (no hub access).
//!
//! The grammars that force calls are checked over a tiny vocabulary without a model: which
//! texts they allow, and calls drawn at random under them validate against their tools.

mod tiny_vocabulary;

use runtime::text::grammar::Grammar;
use runtime::text::tools::{Call, Delta, Format, Parser, Tool};
use serde_json::{Value, json};
use tiny_vocabulary::Tiny;

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
        // A call cut off (max_tokens) is left out, whole blocks before it kept.
        Case {
            format: Hermes,
            text: "Sure <tool_call>\n{\"name\": \"search\", \"argu",
            content: Some("Sure"),
            calls: vec![],
        },
        // Text the message ended in that only began like a call is content: the start of
        // a tag, the tag itself, the tag before text that is no call (issue 42).
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>\n<tool_",
            content: Some("<tool_"),
            calls: vec![call("noop", "{}")],
        },
        Case {
            format: Hermes,
            text: "I put <tool_call> in my notes.",
            content: Some("I put <tool_call> in my notes."),
            calls: vec![],
        },
        Case {
            format: Hermes,
            text: "The tag is <tool_call>\n",
            content: Some("The tag is <tool_call>"),
            calls: vec![],
        },
        Case {
            format: Hermes,
            text: "Use the <tool",
            content: Some("Use the <tool"),
            calls: vec![],
        },
        Case {
            format: Hermes,
            text: "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call> I used <tool_call> [1, 2]",
            content: Some("I used <tool_call> [1, 2]"),
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

/// `openai.pydantic_function_tool(Order, name="place_order")` (openai 3.57.0, pydantic
/// 2.14.4) for `Order(address: Address, size: Size, count: int)`, `Address(street: str,
/// city: str)`, `Size` an enum of "small" and "large": the nested model and the enum are
/// in `$defs`.
fn place_order() -> Tool {
    let parameters = json!({"$defs": {"Address": {"properties": {"street": {"title": "Street", "type": "string"}, "city": {"title": "City", "type": "string"}}, "required": ["street", "city"], "title": "Address", "type": "object", "additionalProperties": false}, "Size": {"enum": ["small", "large"], "title": "Size", "type": "string"}}, "properties": {"address": {"$ref": "#/$defs/Address"}, "size": {"$ref": "#/$defs/Size"}, "count": {"title": "Count", "type": "integer"}}, "required": ["address", "size", "count"], "title": "Order", "type": "object", "additionalProperties": false});
    Tool {
        name: "place_order".into(),
        parameters,
    }
}

/// A tree: its children are trees (`{"$ref": "#"}`, the tool's own schema).
fn tree() -> Tool {
    Tool {
        name: "tree".into(),
        parameters: json!({"type": "object", "properties": {
            "value": {"type": "integer", "minimum": 0, "maximum": 9},
            "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
            "required": ["value"], "additionalProperties": false}),
    }
}

/// A schema with an `$id` of its own, its references inside it, and a pointer into its
/// properties.
fn with_id() -> Tool {
    Tool {
        name: "with-id".into(),
        parameters: json!({"$id": "https://example.com/point.json", "type": "object",
            "properties": {"x": {"$ref": "#/definitions/coordinate"}, "y": {"$ref": "#/properties/x"}},
            "required": ["x", "y"], "additionalProperties": false,
            "definitions": {"coordinate": {"type": "integer", "minimum": -5, "maximum": 5}}}),
    }
}

fn all_tools() -> Vec<Tool> {
    vec![place_order(), tree(), with_id()]
}

/// `arguments` as a whole answer calling `name` in `format`.
fn answer(format: Format, name: &str, arguments: &str) -> String {
    match format {
        Format::Hermes => {
            format!(
                "<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call>"
            )
        }
        Format::Llama3 => format!("{{\"name\": \"{name}\", \"parameters\": {arguments}}}"),
    }
}

/// Tool parameters with references (`$defs` from a Pydantic model, `#`, a pointer into
/// the properties, a schema with its own `$id`) compile in every format, under `required`
/// (all tools) and a named tool, and mean what they mean in the tool's own schema: their
/// arguments are allowed, others refused (issue 42: `$defs` failed to compile, `#` meant
/// the call).
#[test]
fn references_in_tool_parameters_resolve_in_the_tool() {
    let tiny = Tiny::new();
    let order =
        r#"{"address": {"street": "1 Main St", "city": "Oslo"}, "size": "large", "count": 2}"#;
    let tree = r#"{"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]}"#;
    for format in [Format::Hermes, Format::Llama3] {
        let required = format.grammar(&all_tools(), false);
        for (name, arguments, allowed) in [
            ("place_order", order, true),
            ("place_order", &order.replace("large", "medium"), false),
            (
                "place_order",
                &order.replace(r#", "city": "Oslo""#, ""),
                false,
            ),
            ("tree", tree, true),
            (
                "tree",
                r#"{"value": 4, "children": [{"value": 10}]}"#,
                false,
            ),
            // What `#` meant pasted into the call's schema: a call as a child.
            (
                "tree",
                r#"{"value": 1, "children": [{"name": "tree", "arguments": {"value": 2}}]}"#,
                false,
            ),
            ("with-id", r#"{"x": 5, "y": -5}"#, true),
            ("with-id", r#"{"x": 6, "y": 0}"#, false),
        ] {
            let text = answer(format, name, arguments);
            assert_eq!(tiny.allows(&required, &text), allowed, "{format:?}: {text}");
            let named = format.grammar(
                &[all_tools().into_iter().find(|t| t.name == name).unwrap()],
                false,
            );
            assert_eq!(
                tiny.allows(&named, &text),
                allowed,
                "{format:?} named: {text}"
            );
        }
    }
}

/// Calls drawn at random under the forced grammars, in both formats, are read back as
/// calls whose arguments validate against their tool's schema (the `jsonschema` crate).
#[test]
fn calls_drawn_under_the_grammar_validate_against_their_tool() {
    let tiny = Tiny::new();
    let tools = all_tools();
    let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
    let mut validated = 0;
    for format in [Format::Hermes, Format::Llama3] {
        for seed in 0..40 {
            let grammar = format.grammar(&tools, true);
            let Some(text) = tiny.walk(&grammar, seed, 600) else {
                continue;
            };
            let (content, calls) = Parser::parse(format, names.clone(), &text);
            assert_eq!(content, None, "{text}");
            assert!(!calls.is_empty(), "{text}");
            for call in calls {
                let tool = tools.iter().find(|t| t.name == call.name).unwrap();
                let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
                let validator = jsonschema::validator_for(&tool.parameters).unwrap();
                let errors: Vec<String> = validator
                    .iter_errors(&arguments)
                    .map(|e| e.to_string())
                    .collect();
                assert!(
                    errors.is_empty(),
                    "{}({}): {errors:?}",
                    call.name,
                    call.arguments
                );
                validated += 1;
            }
        }
    }
    eprintln!("{validated} calls drawn and validated");
    assert!(validated >= 20, "{validated} calls");
}

/// A reference to nothing still fails to compile (a 400 for the server), named.
#[test]
fn a_reference_to_nothing_is_refused() {
    let tiny = Tiny::new();
    let broken = Tool {
        name: "f".into(),
        parameters: json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}, "required": ["x"]}),
    };
    for format in [Format::Hermes, Format::Llama3] {
        let grammar: Grammar = format.grammar(std::slice::from_ref(&broken), false);
        let error = tiny.grammars.constraint(&grammar).err().expect("refused").0;
        assert!(error.contains("missing"), "{error}");
    }
}
