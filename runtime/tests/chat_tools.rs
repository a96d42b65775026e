//! Chat templates rendered with tools, tool calls and tool results equal transformers'
//! renderings byte for byte: the Qwen2.5, Qwen3 and Llama 3.2 Instruct templates (Qwen3's
//! with `enable_thinking` both ways and thinking in the history), and without tools SmolLM3's
//! (thinking switched by `enable_thinking` and by `/think` and `/no_think` in the system
//! prompt) and Gemma 3's (the system prompt folded into the first user turn) over the cases in
//! runtime/tests/data/chat-tools/renders.json (made by scripts/make_chat_tool_goldens.py;
//! its README says from which versions and sources).

use runtime::text::chat::{ChatRequest, Message};
use serde::Deserialize;
use serde_json::{Map, Value};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/chat-tools");

#[derive(Deserialize)]
struct Case {
    name: String,
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    messages: Vec<Message>,
    tools: Option<Vec<Value>>,
    kwargs: Map<String, Value>,
    text: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Renders {
    cases: Vec<Case>,
}

#[test]
fn renders_with_tools_equal_transformers() {
    let renders: Renders =
        serde_json::from_slice(&std::fs::read(format!("{DATA}/renders.json")).unwrap()).unwrap();
    assert!(renders.cases.len() >= 60, "{} cases", renders.cases.len());
    for case in renders.cases {
        let request = ChatRequest {
            template: std::fs::read_to_string(format!("{DATA}/{}", case.template)).unwrap(),
            bos_token: case.bos_token.unwrap_or_default(),
            eos_token: case.eos_token.unwrap_or_default(),
            messages: case.messages,
            tools: case.tools,
            kwargs: case.kwargs,
        };
        match (request.render(), case.text, case.error) {
            (Ok(ours), Some(theirs), _) => assert_eq!(ours, theirs, "{}", case.name),
            // The template's own errors (`raise_exception`) carry its message; an undefined
            // value's is each engine's own words.
            (Err(ours), _, Some(theirs)) => assert!(
                ours.to_string().contains(&theirs) || theirs.contains("has no attribute"),
                "{}: {ours}",
                case.name
            ),
            (ours, text, error) => panic!("{}: {ours:?}, expected {text:?} / {error:?}", case.name),
        }
    }
}
