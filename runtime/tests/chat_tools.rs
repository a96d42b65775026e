//! Chat templates rendered with tools, tool calls and tool results equal transformers'
//! renderings byte for byte: the Qwen2.5, Qwen3 and Llama 3.2 Instruct templates (Qwen3's
//! with `enable_thinking` both ways and thinking in the history), and without tools SmolLM3's
//! (thinking switched by `enable_thinking` and by `/think` and `/no_think` in the system
//! prompt) and Gemma 3's (the system prompt folded into the first user turn) over the cases in
//! runtime/tests/data/chat-tools/renders.json (made by scripts/make_chat_tool_goldens.py;
//! its README says from which versions and sources), and conversations that used a tool sent
//! back as OpenAI's clients send them (round_trips.json).

use runtime::text::chat::{Arguments, ChatRequest, FunctionCall, Message, ToolCall};
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
            // jinja2 names the missing attribute, minijinja the undefined value it became.
            (Err(ours), _, Some(theirs)) if theirs.contains("has no attribute") => assert!(
                ours.to_string().contains("undefined"),
                "{}: {ours}",
                case.name
            ),
            (Err(ours), _, Some(theirs)) => {
                assert!(ours.to_string().contains(&theirs), "{}: {ours}", case.name)
            }
            (ours, text, error) => panic!("{}: {ours:?}, expected {text:?} / {error:?}", case.name),
        }
    }
}

#[derive(Deserialize)]
struct RoundTrip {
    name: String,
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    kwargs: Map<String, Value>,
    /// As an OpenAI client sends them: each call's arguments a string of JSON.
    messages: Vec<Value>,
    tools: Vec<Value>,
    text: String,
}

/// An OpenAI message as a chat [`Message`]: a call's arguments read from their string
/// (empty: none), a null content none.
fn from_openai(message: &Value) -> Message {
    let text = |value: &Value| value.as_str().map(String::from);
    let call = |call: &Value| {
        let arguments = call["function"]["arguments"].as_str().unwrap();
        ToolCall {
            id: text(&call["id"]).unwrap(),
            kind: "function".into(),
            function: FunctionCall {
                name: text(&call["function"]["name"]).unwrap(),
                arguments: match arguments {
                    "" => Arguments::empty(),
                    json => Arguments::from_json(json).unwrap(),
                },
            },
        }
    };
    Message {
        role: text(&message["role"]).unwrap(),
        content: text(&message["content"]),
        tool_calls: (message["tool_calls"].as_array())
            .map(|calls| calls.iter().map(call).collect()),
        tool_call_id: text(&message["tool_call_id"]),
    }
}

/// A conversation that used a tool, its call's arguments sent back as the string OpenAI's
/// clients send, renders as transformers renders it once the string is read as vLLM reads
/// it (`json.loads`): integers past 64 and 128 bits exact, `-0` an integer, `1E400`
/// infinite, a repeated key's last value, escapes; also after the request crosses to the
/// child that renders it, as JSON (runtime/tests/data/chat-tools/round_trips.json, made by
/// scripts/make_tool_round_trip_goldens.py with transformers; issue 42).
#[test]
fn tool_round_trips_render_as_transformers_does() {
    #[derive(Deserialize)]
    struct RoundTrips {
        cases: Vec<RoundTrip>,
    }
    let file = std::fs::read(format!("{DATA}/round_trips.json")).unwrap();
    let round_trips: RoundTrips = serde_json::from_slice(&file).unwrap();
    assert!(round_trips.cases.len() >= 24);
    for case in round_trips.cases {
        let request = ChatRequest {
            template: std::fs::read_to_string(format!("{DATA}/{}", case.template)).unwrap(),
            bos_token: case.bos_token.unwrap_or_default(),
            eos_token: case.eos_token.unwrap_or_default(),
            messages: case.messages.iter().map(from_openai).collect(),
            tools: Some(case.tools),
            kwargs: case.kwargs,
        };
        assert_eq!(request.render().unwrap(), case.text, "{}", case.name);
        let sent: ChatRequest =
            serde_json::from_str(&serde_json::to_string(&request).unwrap()).unwrap();
        assert_eq!(sent.render().unwrap(), case.text, "{} (sent)", case.name);
    }
}
