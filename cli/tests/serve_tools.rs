//! `runtime serve`'s tool calls on the real artifact (SmolLM2, whose own chat template knows
//! no tools): refused with that template; with `--chat-template` naming the Qwen2.5 template
//! (Hermes `<tool_call>` blocks, ChatML tokens as SmolLM2's), forced calls (`required`, a
//! named function, `parallel_tool_calls: false`, `n: 2`) that are calls of the offered tools
//! with arguments valid against their schemas (the `jsonschema` crate), streamed as they are
//! whole, `auto` leaving no call in the content, a conversation that used tools sent back,
//! hostile tool lists answered in bounded time; and the official `openai` Python client
//! making and answering a call (`openai_client.py tools`).
//!
//! The test binary is a debug build: each generated token takes a while, so the answers are
//! kept short (small schemas, `max_tokens` bounds).

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body, has_openai_client, run_openai_client};

/// A chat template that teaches tool calls in the Hermes format, rendered as transformers
/// renders Qwen2.5's.
const TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../runtime/tests/data/chat-tools/qwen2.5-instruct.jinja"
);

const ASK: &str = "What's the weather in Paris? And find me a flight from CDG to Tokyo.";

/// The server with the Qwen2.5 template instead of SmolLM2's own.
fn tools_server(dir: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--chat-template", TEMPLATE];
    args.extend_from_slice(extra);
    Server::start(dir, &args)
}

/// Two tools whose arguments differ in shape: a nested object, an enum and a bounded integer;
/// an array of patterned strings, a bounded string and integer. Strings are kept short so
/// that forced calls end soon.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city.",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "object", "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 16},
                    "country": {"type": "string", "maxLength": 16}},
                    "required": ["city"], "additionalProperties": false},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["location", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "search-flights",
            "description": "Flights from airports to a city.",
            "parameters": {"type": "object", "properties": {
                "from": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z]{3}$"},
                         "minItems": 1, "maxItems": 2},
                "to": {"type": "string", "minLength": 1, "maxLength": 16},
                "stops": {"type": "integer", "minimum": 0, "maximum": 2}},
                "required": ["from", "to"], "additionalProperties": false}}},
    ])
}

/// A chat asking about the weather and flights, offering `tools()`, with `extra` fields.
fn ask(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": ASK}],
        "tools": tools(), "max_tokens": 120,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// The parameters' schema of the tool named `name` among `tools`.
fn schema_of<'a>(tools: &'a Value, name: &str) -> Option<&'a Value> {
    (tools.as_array().unwrap().iter())
        .map(|tool| &tool["function"])
        .find(|function| function["name"] == name)
        .map(|function| &function["parameters"])
}

/// Each call in `calls` (an answer's `tool_calls`): a function call with an id, of a tool
/// among `tools`, its arguments a string of JSON valid against that tool's parameters. The
/// names and arguments (as sent).
fn check_calls(calls: &Value, tools: &Value) -> Vec<(String, String)> {
    let calls = calls
        .as_array()
        .unwrap_or_else(|| panic!("tool_calls is not a list: {calls}"));
    assert!(!calls.is_empty(), "no tool call");
    let mut ids: Vec<&str> = Vec::new();
    calls
        .iter()
        .map(|call| {
            assert_eq!(call["type"], "function", "{call}");
            let id = call["id"].as_str().unwrap_or_default();
            assert!(!id.is_empty() && !ids.contains(&id), "{call}");
            ids.push(id);
            let name = call["function"]["name"].as_str().unwrap();
            let text = call["function"]["arguments"]
                .as_str()
                .unwrap_or_else(|| panic!("arguments not a string: {call}"));
            (name.to_string(), check_arguments(tools, name, text))
        })
        .collect()
}

/// `text`, the arguments of a call of `name`: JSON valid against that tool's parameters.
fn check_arguments(tools: &Value, name: &str, text: &str) -> String {
    let schema = schema_of(tools, name).unwrap_or_else(|| panic!("{name:?} was not offered"));
    let arguments: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}({text}): {e}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = (validator.iter_errors(&arguments))
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{name}({text}): {errors:?}");
    text.to_string()
}

/// Choice `index` of a whole answer that is calls: `tool_calls` the finish reason, no
/// content, the calls checked against `tools`.
fn calls_of(answer: &Value, index: usize, tools: &Value) -> Vec<(String, String)> {
    let choice = &answer["choices"][index];
    assert_eq!(choice["index"], index, "{answer}");
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert_eq!(choice["message"]["role"], "assistant", "{answer}");
    assert_eq!(choice["message"]["content"], Value::Null, "{answer}");
    check_calls(&choice["message"]["tool_calls"], tools)
}

/// A chat request answered 200 (within ten minutes: a debug build is slow): its body.
fn post_ok(server: &Server, body: &Value) -> Value {
    let (status, v) = post_within(server, body, Duration::from_secs(600));
    assert_eq!(status, 200, "{v}");
    v
}

/// A chat request answered within `wait` (else the test fails): its status and body.
fn post_within(server: &Server, body: &Value, wait: Duration) -> (u16, Value) {
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.address,
        body.len()
    );
    let started = Instant::now();
    let Some(response) = server.raw(request.as_bytes(), wait) else {
        // Closed without an answer, or none in time: say which, and whether the server is
        // still running (its state in /proc, `Z` once it has exited).
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", server.child.id()));
        let state = stat.map_or("gone".to_string(), |s| {
            s.rsplit(')')
                .next()
                .unwrap_or_default()
                .trim()
                .chars()
                .take(1)
                .collect()
        });
        panic!(
            "no answer after {:?} (of {wait:?}; server state {state}) to {body:.300}",
            started.elapsed()
        );
    };
    (response.status, response.json())
}

/// The server still answers an ordinary chat.
fn still_serves(server: &Server) {
    let (status, v) = post_within(server, &chat_body("Hi", 2, false), Duration::from_secs(60));
    assert_eq!(status, 200, "{v}");
}

/// The 400 of `v`, naming `param`.
fn assert_refused(status: u16, v: &Value, param: &str) {
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["param"], param, "{v}");
}

/// A streamed chat's chunks (`[DONE]` last, then left out).
fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    (events[..events.len() - 1].iter())
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{e}: {err}")))
        .collect()
}

/// What a streamed choice said: its content joined, its calls (name, arguments) joined from
/// their deltas by index, and its finish reason. Checks that the first chunk says the role,
/// each call's id comes once (with its first delta), each call's index comes after the
/// previous one's, and only the last chunk has a finish reason.
struct Streamed {
    content: String,
    calls: Vec<(String, String)>,
    finish: Value,
}

fn streamed(chunks: &[Value], index: usize) -> Streamed {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = Value::Null;
    let mut first = true;
    for chunk in chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        for choice in chunk["choices"].as_array().unwrap() {
            if choice["index"] != index {
                continue;
            }
            assert_eq!(finish, Value::Null, "a chunk after the finish: {chunk}");
            let delta = &choice["delta"];
            if first {
                assert_eq!(delta["role"], "assistant", "first chunk {chunk}");
                first = false;
            } else {
                assert!(delta.get("role").is_none(), "role again: {chunk}");
            }
            if let Some(text) = delta["content"].as_str() {
                content.push_str(text);
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let at = call["index"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no index: {chunk}"))
                    as usize;
                assert!(
                    at <= calls.len(),
                    "call {at} before call {}: {chunk}",
                    calls.len()
                );
                if at == calls.len() {
                    // A call's first delta: its id, type and name.
                    assert!(
                        call["id"].as_str().is_some_and(|id| !id.is_empty()),
                        "{chunk}"
                    );
                    assert_eq!(call["type"], "function", "{chunk}");
                    calls.push(Default::default());
                } else {
                    assert!(
                        call.get("id").is_none_or(Value::is_null),
                        "id again: {chunk}"
                    );
                }
                let function = &call["function"];
                if let Some(name) = function["name"].as_str() {
                    calls[at].0.push_str(name);
                }
                if let Some(arguments) = function["arguments"].as_str() {
                    calls[at].1.push_str(arguments);
                }
            }
            finish = choice["finish_reason"].clone();
        }
    }
    assert!(!first, "no chunk for choice {index}");
    Streamed {
        content,
        calls,
        finish,
    }
}

/// Whether `content` holds a `<tool_call>` block that is a well-formed call of a tool
/// among `tools` (which a reader of calls should have taken out of the content).
fn holds_a_call(content: &str, tools: &Value) -> bool {
    content.split("<tool_call>").skip(1).any(|block| {
        let body = block.split("</tool_call>").next().unwrap_or(block);
        serde_json::from_str::<Value>(body.trim()).is_ok_and(|call| {
            (call["name"].as_str()).is_some_and(|name| schema_of(tools, name).is_some())
        })
    })
}

/// SmolLM2's own template knows no tools: a request offering tools is refused naming
/// `tools`, whatever `tool_choice` says (`none` too: the tools could not be rendered, and are
/// never dropped silently); an empty list offers none; requests without tools are answered
/// as before.
#[test]
fn tools_are_refused_by_a_template_without_a_tool_format() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let plain = post_ok(
        &server,
        &chat_body("What is the capital of France?", 8, false),
    );
    let answer = plain["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!answer.is_empty(), "{plain}");
    assert!(plain["choices"][0]["message"].get("tool_calls").is_none());
    for choice in [
        None,
        Some(json!("auto")),
        Some(json!("none")),
        Some(json!("required")),
        Some(json!({"type": "function", "function": {"name": "get_weather"}})),
    ] {
        let mut body = ask(json!({"max_tokens": 8, "temperature": 0}));
        if let Some(choice) = &choice {
            body["tool_choice"] = choice.clone();
        }
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_refused(status, &v, "tools");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("--chat-template"), "{choice:?}: {message}");
        // Streamed: refused before the stream starts.
        body["stream"] = json!(true);
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_refused(status, &v, "tools");
    }
    // No tools: the same answer as before tools were offered.
    let mut empty = chat_body("What is the capital of France?", 8, false);
    empty["tools"] = json!([]);
    empty["tool_choice"] = json!("auto");
    let v = post_ok(&server, &empty);
    assert_eq!(v["choices"][0]["message"]["content"], answer, "{v}");
    let again = post_ok(
        &server,
        &chat_body("What is the capital of France?", 8, false),
    );
    assert_eq!(again["choices"][0]["message"]["content"], answer);
}

/// `tool_choice: "required"`, at temperatures 0, 0.7 and 1.0: every answer is calls of the
/// offered tools with valid arguments, ended for them (`finish_reason: "tool_calls"`), no
/// content; `parallel_tool_calls: false`, exactly one call; a named function, one call of
/// that tool only.
#[test]
fn forced_calls_are_valid_calls_of_the_offered_tools() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = tools();
    let mut names = Vec::new();
    for (temperature, seed) in [(0.0, 0), (0.7, 1), (1.0, 2)] {
        let started = Instant::now();
        let one = post_ok(
            &server,
            &ask(
                json!({"tool_choice": "required", "parallel_tool_calls": false,
                        "temperature": temperature, "seed": seed}),
            ),
        );
        let calls = calls_of(&one, 0, &tools);
        assert_eq!(calls.len(), 1, "{one}");
        eprintln!(
            "required, one, t={temperature}: {calls:?} in {:?}",
            started.elapsed()
        );
        names.push(calls[0].0.clone());
    }
    // Several calls allowed: at least one (the answer may call until max_tokens).
    let started = Instant::now();
    let several = post_ok(
        &server,
        &ask(json!({"tool_choice": "required", "temperature": 0.7, "seed": 3})),
    );
    let choice = &several["choices"][0];
    assert!(
        ["tool_calls", "length"].contains(&choice["finish_reason"].as_str().unwrap()),
        "{several}"
    );
    let calls = check_calls(&choice["message"]["tool_calls"], &tools);
    eprintln!("required, several: {calls:?} in {:?}", started.elapsed());
    // A named function: that tool, once (even with parallel calls allowed), whichever the
    // model would have chosen.
    for name in ["get_weather", "search-flights"] {
        let started = Instant::now();
        let named = post_ok(
            &server,
            &ask(
                json!({"tool_choice": {"type": "function", "function": {"name": name}},
                        "temperature": 0}),
            ),
        );
        let calls = calls_of(&named, 0, &tools);
        assert_eq!(calls.len(), 1, "{named}");
        assert_eq!(calls[0].0, name, "{named}");
        eprintln!("named {name}: {calls:?} in {:?}", started.elapsed());
    }
}

/// Streamed and whole, the same seed: the calls' deltas join to the whole answer's names and
/// arguments; the first chunk says the role, the last `tool_calls`; no `<tool_call>` text
/// in the content.
#[test]
fn streamed_calls_join_to_the_whole_answer() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = tools();
    let body = ask(
        json!({"tool_choice": "required", "parallel_tool_calls": false,
                          "temperature": 0.8, "seed": 11}),
    );
    let whole = post_ok(&server, &body);
    let expected = calls_of(&whole, 0, &tools);
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    stream["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&server.stream("/v1/chat/completions", &stream));
    let streamed = streamed(&chunks, 0);
    assert_eq!(streamed.finish, "tool_calls", "{chunks:?}");
    assert_eq!(streamed.content, "", "{chunks:?}");
    assert_eq!(streamed.calls, expected, "{chunks:?}");
    for (name, arguments) in &streamed.calls {
        check_arguments(&tools, name, arguments);
    }
    // The same tokens (the prompt's now from the cache).
    let usage = &chunks.last().unwrap()["usage"];
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(usage[count], whole["usage"][count], "{chunks:?}");
    }
}

/// `tool_choice: "auto"` at temperature 0: content, calls or both, never a well-formed call
/// of an offered tool left in the content; streamed, the same.
#[test]
fn auto_answers_leave_no_call_in_the_content() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = tools();
    let body = ask(json!({"tool_choice": "auto", "temperature": 0, "max_tokens": 40}));
    let whole = post_ok(&server, &body);
    let choice = &whole["choices"][0];
    let message = &choice["message"];
    let content = match &message["content"] {
        Value::Null => "",
        Value::String(text) => text,
        other => panic!("content {other}"),
    };
    assert!(!holds_a_call(content, &tools), "{whole}");
    let calls = match message.get("tool_calls") {
        None => Vec::new(),
        Some(calls) => check_calls(calls, &tools),
    };
    assert!(!content.is_empty() || !calls.is_empty(), "{whole}");
    let finish = choice["finish_reason"].as_str().unwrap();
    match (finish, calls.is_empty()) {
        ("length", _) | ("stop", true) | ("tool_calls", false) => {}
        _ => panic!("finish_reason {finish} with {} calls", calls.len()),
    }
    eprintln!("auto: {content:?} {calls:?}");
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let chunks = chunks(&server.stream("/v1/chat/completions", &stream));
    let streamed = streamed(&chunks, 0);
    assert_eq!(streamed.content, content, "{chunks:?}");
    assert_eq!(streamed.calls, calls, "{chunks:?}");
    assert_eq!(streamed.finish, finish, "{chunks:?}");
}

/// A conversation that used a tool (the assistant's call, its arguments a string of JSON as
/// OpenAI sends them, and the tool's answer) is rendered and answered; arguments that are not
/// JSON, or a tool message without its call's id, are refused naming `messages`.
#[test]
fn a_conversation_with_tool_results_is_answered() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let question = json!({"role": "user", "content": "What's the weather in Paris?"});
    let call = |arguments: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]})
    };
    let result = json!({"role": "tool", "tool_call_id": "call_1",
                        "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"});
    let arguments = r#"{"location": {"city": "Paris"}, "unit": "celsius"}"#;
    let body = |messages: Value, choice: &str| {
        json!({"messages": messages, "tools": tools(), "tool_choice": choice,
               "temperature": 0, "max_tokens": 8})
    };
    let first = post_ok(&server, &body(json!([question]), "none"));
    for choice in ["auto", "none"] {
        let messages = json!([question, call(arguments), result]);
        let v = post_ok(&server, &body(messages, choice));
        let answer = &v["choices"][0];
        assert!(
            answer["message"]["content"].is_string() || answer["message"]["tool_calls"].is_array(),
            "{v}"
        );
        if choice == "none" {
            assert!(answer["message"].get("tool_calls").is_none(), "{v}");
            assert_ne!(answer["finish_reason"], "tool_calls", "{v}");
        }
        // The call and its result are in the prompt: each of its ~30 tokens.
        let more = v["usage"]["prompt_tokens"].as_u64().unwrap()
            - first["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(more > 30, "{more} more prompt tokens: {v}");
    }
    // An assistant message with content and two calls, their results after it; one with an
    // empty list of calls.
    let flights = r#"{"from": ["CDG"], "to": "Tokyo"}"#;
    let both = json!([question,
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "a", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}},
            {"id": "b", "type": "function",
             "function": {"name": "search-flights", "arguments": flights}}]},
        {"role": "tool", "tool_call_id": "a", "content": "21"},
        {"role": "tool", "tool_call_id": "b", "content": "none"}]);
    post_ok(&server, &body(both, "auto"));
    let empty = json!([question, {"role": "assistant", "content": null, "tool_calls": []},
                       {"role": "user", "content": "Well?"}]);
    post_ok(&server, &body(empty, "auto"));
    // Empty arguments (as clients send a call to a tool without parameters) are no
    // arguments, as vLLM reads them: the prompt of `{}` (issue 42).
    let prompt = |arguments: &str| {
        let v = post_ok(
            &server,
            &body(json!([question, call(arguments), result]), "none"),
        );
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert_eq!(prompt(""), prompt("{}"));
    assert_eq!(prompt(" "), prompt("{}"));
    // Arguments reach the template as Python's `json.loads` (vLLM's reading) gives them to
    // transformers' (issue 42): `-0` is the integer 0, a float past f64's range infinity (not
    // refused), an integer past 64 bits all its digits (SmolLM2 writes a digit a token, so
    // two of the same length take as many tokens; through f64 their lengths differed).
    assert_eq!(prompt(r#"{"n": -0}"#), prompt(r#"{"n": 0}"#));
    assert_eq!(prompt(r#"{"n": 1E400}"#), prompt(r#"{"n": 1e999}"#));
    assert_eq!(
        prompt(r#"{"n": 98765432109876543210987654321}"#),
        prompt(r#"{"n": 12345678901234567890123456789}"#)
    );
    // Broken: arguments that are not JSON; a result without its call's id.
    for messages in [
        json!([question, call(r#"{"location": {"city": "Paris"#), result]),
        json!([question, call("not json"), result]),
        json!([question, call(arguments), {"role": "tool", "content": "21"}]),
    ] {
        let (status, v) = server.post("/v1/chat/completions", &body(messages, "auto"));
        assert_refused(status, &v, "messages");
    }
    still_serves(&server);
}

/// `openai.pydantic_function_tool(Order, name="place_order")` (openai 3.57.0, pydantic
/// 2.14.4): a nested model (`Address`) and an enum (`Size`) in `$defs`; and a person whose
/// manager is a person (`{"$ref": "#"}`).
fn tools_with_references() -> Value {
    json!([
        {"type": "function", "function": {"name": "place_order", "strict": true, "parameters": {"$defs": {"Address": {"properties": {"street": {"title": "Street", "type": "string"}, "city": {"title": "City", "type": "string"}}, "required": ["street", "city"], "title": "Address", "type": "object", "additionalProperties": false}, "Size": {"enum": ["small", "large"], "title": "Size", "type": "string"}}, "properties": {"address": {"$ref": "#/$defs/Address"}, "size": {"$ref": "#/$defs/Size"}, "count": {"title": "Count", "type": "integer"}}, "required": ["address", "size", "count"], "title": "Order", "type": "object", "additionalProperties": false}}},
        {"type": "function", "function": {"name": "record_person", "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "manager": {"$ref": "#"}},
            "required": ["name"], "additionalProperties": false}}},
    ])
}

/// Tools whose parameters hold references (a Pydantic model's `$defs`, a recursive `#`)
/// are called under `required` and by name, the arguments valid against the tool's own
/// schema, references resolved there (issue 42: `$defs` did not compile, `#` meant the
/// call's schema).
#[test]
fn forced_calls_of_tools_with_references_are_valid() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = tools_with_references();
    let named = |name: &str| json!({"type": "function", "function": {"name": name}});
    for (ask, choice) in [
        (
            "Order two large pizzas to 1 Main St, Oslo.",
            json!("required"),
        ),
        (
            "Order two large pizzas to 1 Main St, Oslo.",
            named("place_order"),
        ),
        (
            "Record employee Ann, whose manager is Bob.",
            named("record_person"),
        ),
    ] {
        let body = json!({"messages": [{"role": "user", "content": ask}], "tools": tools,
                          "tool_choice": choice, "parallel_tool_calls": false,
                          "temperature": 0, "max_tokens": 100});
        let v = post_ok(&server, &body);
        let calls = calls_of(&v, 0, &tools);
        assert_eq!(calls.len(), 1, "{v}");
        eprintln!("{choice}: {calls:?}");
    }
}

/// A tool whose schema llguidance refuses or misreads as written (`multipleOf: 0.07`, an
/// integer over the int64 range, a number bounded at ±1e308, a date) is called, its
/// arguments valid against the schema with formats checked (February 29th only in leap
/// years); past what any rewriting saves, one 400 naming the field and the limit (issue 42).
#[test]
fn tool_schemas_at_the_library_limits_are_called_or_refused_by_name() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let pay = |amount: Value| {
        json!([{"type": "function", "function": {"name": "pay", "parameters": {
            "type": "object", "properties": {
                "amount": amount,
                "account": {"type": "integer", "minimum": -9223372036854775808i64,
                            "maximum": 9223372036854775807i64},
                "rate": {"type": "number", "minimum": -1e308, "maximum": 1e308},
                "day": {"type": "string", "format": "date"}},
            "required": ["amount", "account", "rate", "day"], "additionalProperties": false}}}])
    };
    let body = |tools: &Value, choice: Value| {
        json!({"messages": [{"role": "user", "content": "Pay 0.21 from account 7 on 29 February 2023."}],
               "tools": tools, "tool_choice": choice, "parallel_tool_calls": false,
               "temperature": 0, "max_tokens": 80})
    };
    let tools = pay(json!({"type": "number", "multipleOf": 0.07, "minimum": 0}));
    let v = post_ok(&server, &body(&tools, json!("required")));
    let calls = calls_of(&v, 0, &tools);
    let arguments: Value = serde_json::from_str(&calls[0].1).unwrap();
    let schema = schema_of(&tools, "pay").unwrap();
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap();
    assert!(validator.is_valid(&arguments), "{arguments}");
    eprintln!("pay: {arguments}");
    let named = json!({"type": "function", "function": {"name": "pay"}});
    for (amount, choice, param, expected) in [
        (
            json!({"type": "number", "multipleOf": 1e10}),
            json!("required"),
            "tools",
            "multipleOf 10000000000: past constrained decoding's limit: a multiple must be a whole number below 2^32",
        ),
        (
            json!({"type": "number", "minimum": 1e20}),
            named,
            "tool_choice",
            "minimum 100000000000000000000 is past ±9007199254740991 (2^53 - 1)",
        ),
    ] {
        let (status, v) = server.post("/v1/chat/completions", &body(&pay(amount), choice));
        assert_refused(status, &v, param);
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message}");
    }
    still_serves(&server);
}

/// A forced call cut short by `max_tokens` is no content: the answer ends for its length, and
/// the unfinished `<tool_call>` block the model was writing is not sent as text, whole or
/// streamed (the grammar allowed nothing but calls).
#[test]
fn a_forced_call_cut_short_sends_no_markup_as_content() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let body = ask(
        json!({"tool_choice": "required", "parallel_tool_calls": false,
                          "temperature": 0, "max_tokens": 12}),
    );
    let whole = post_ok(&server, &body);
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{whole}");
    assert_eq!(choice["message"]["content"], Value::Null, "{whole}");
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let chunks = chunks(&server.stream("/v1/chat/completions", &stream));
    let streamed = streamed(&chunks, 0);
    assert_eq!(streamed.finish, "length", "{chunks:?}");
    assert_eq!(streamed.content, "", "{chunks:?}");
}

/// A forced call whose arguments hold the text that closes a call block (`</tool_call>`,
/// inside a JSON string) is still a call, not content.
#[test]
fn a_forced_call_holding_the_closing_tag_is_a_call() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"enum": ["</tool_call>"]}},
        "required": ["x"], "additionalProperties": false}}}]);
    let v = post_ok(
        &server,
        &json!({"messages": [{"role": "user", "content": "Call f."}], "tools": tools,
                "tool_choice": "required", "parallel_tool_calls": false,
                "temperature": 0, "max_tokens": 40}),
    );
    let calls = calls_of(&v, 0, &tools);
    assert_eq!(calls.len(), 1, "{v}");
}

/// A tool whose `parameters` do not say `"type": "object"` (`{}`, as clients send for a
/// function without arguments): a forced call of it is still a call whose arguments are an
/// object, not content.
#[test]
fn a_forced_call_of_a_tool_with_empty_parameters_is_a_call() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let v = post_ok(
        &server,
        &json!({"messages": [{"role": "user", "content": "Call f with the list [1, 2]."}],
                "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
                "temperature": 0, "max_tokens": 30}),
    );
    // The object may be cut short (its properties are open): then nothing is sent, least
    // of all the markup as content.
    if v["choices"][0]["finish_reason"] == "length" {
        assert_eq!(v["choices"][0]["message"]["content"], Value::Null, "{v}");
        return;
    }
    let calls = calls_of(&v, 0, &tools);
    assert_eq!(calls.len(), 1, "{v}");
    let arguments: Value = serde_json::from_str(&calls[0].1).unwrap();
    assert!(arguments.is_object(), "{v}");
}

/// `n: 2` with `tool_choice: "required"`: two choices, each calls of the offered tools with
/// valid arguments; streamed, the same calls under each choice's index.
#[test]
fn each_of_n_choices_is_calls() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tools = tools();
    let body = ask(json!({
        "tool_choice": "required", "parallel_tool_calls": false, "n": 2,
        "temperature": 0.9, "seed": 5,
    }));
    let v = post_ok(&server, &body);
    assert_eq!(v["choices"].as_array().unwrap().len(), 2, "{v}");
    let whole: Vec<_> = (0..2).map(|index| calls_of(&v, index, &tools)).collect();
    for calls in &whole {
        assert_eq!(calls.len(), 1, "{v}");
    }
    // Streamed: each choice's calls, under its own index, join to its whole calls.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let chunks = chunks(&server.stream("/v1/chat/completions", &stream));
    for (index, calls) in whole.iter().enumerate() {
        let streamed = streamed(&chunks, index);
        assert_eq!(streamed.finish, "tool_calls", "{chunks:?}");
        assert_eq!(streamed.content, "", "{chunks:?}");
        assert_eq!(&streamed.calls, calls, "choice {index}: {chunks:?}");
    }
}

/// 128 tools at most: 129 are refused naming `tools`; 100 with schemas of some size are a
/// prompt past the context (refused naming `messages`); 25 are answered with a valid call
/// within bounded time, and the server goes on serving.
#[test]
fn many_tools_are_answered_or_refused_in_bounded_time() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let tool = |i: usize| {
        json!({"type": "function", "function": {
            "name": format!("lookup_{i:03}"),
            "description": format!("Looks up records of kind {i}."),
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "maxLength": 12},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "order": {"enum": ["asc", "desc"]},
                "fields": {"type": "array", "items": {"type": "string", "maxLength": 8},
                           "maxItems": 3},
                "filter": {"type": "object", "properties": {
                    "since": {"type": "integer", "minimum": 1900},
                    "exact": {"type": "boolean"}}, "additionalProperties": false}},
                "required": ["query"], "additionalProperties": false}}})
    };
    let body = |count: usize| {
        let tools: Vec<Value> = (0..count).map(tool).collect();
        json!({"messages": [{"role": "user", "content": "Look up the records of kind 7."}],
               "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
               "temperature": 0, "max_tokens": 60})
    };
    let (status, v) = server.post("/v1/chat/completions", &body(129));
    assert_refused(status, &v, "tools");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("128"),
        "{v}"
    );
    // 100 such tools render to ~19,000 tokens: past SmolLM2's 8,192.
    let (status, v) = post_within(&server, &body(100), Duration::from_secs(120));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "messages", "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    // 25 fit (~4,800 tokens): a valid call of one of them, or one cut by max_tokens.
    let started = Instant::now();
    let many = body(25);
    let (status, v) = post_within(&server, &many, Duration::from_secs(120));
    eprintln!("25 tools: {status} in {:?}: {v:.400}", started.elapsed());
    assert_eq!(status, 200, "{v}");
    let answer = &v["choices"][0];
    if answer["finish_reason"] == "tool_calls" {
        assert_eq!(calls_of(&v, 0, &many["tools"]).len(), 1, "{v}");
    } else {
        assert_eq!(answer["finish_reason"], "length", "{v}");
    }
    still_serves(&server);
}

/// Tools whose schemas are hostile (nesting past what the body's JSON may hold and just
/// under it, a 10,000-value enum, a pattern that backtracks elsewhere, a `$ref` to nothing,
/// a description that would end the call grammar's text if pasted into it) are each answered
/// within bounded time, 200 or a 400 naming the field, and the server goes on serving.
#[test]
fn hostile_tool_schemas_are_answered_and_bounded() {
    let Some(dir) = artifact_dir() else { return };
    let server = tools_server(&dir, &[]);
    let nested = |depth: usize| {
        let mut schema = json!({"type": "integer"});
        for _ in 0..depth {
            schema = json!({"type": "object", "properties": {"a": schema}});
        }
        schema
    };
    let function = |parameters: Value| {
        let function = json!({"name": "f", "parameters": parameters});
        json!([{"type": "function", "function": function}])
    };
    let body = |tools: Value, choice: Value| {
        json!({"messages": [{"role": "user", "content": "Call f."}], "tools": tools,
               "tool_choice": choice, "temperature": 0, "max_tokens": 40})
    };
    let words: Vec<String> = (0..10_000).map(|i| format!("value number {i}")).collect();
    let property = |x: Value| json!({"type": "object", "properties": {"x": x}, "required": ["x"]});
    // The nested schema's prompt is long (800 tokens): a few answer tokens only. The patterns
    // get enough to be written (and the call to end, if the model ends it). Bounded at five
    // minutes: a debug build prefills a few tokens a second, less when the machine is busy.
    for (what, parameters, max_tokens) in [
        ("nested 200 deep", nested(200), 8),
        ("nested 50 deep", nested(50), 8),
        ("enum of 10,000", property(json!({"enum": words})), 8),
        (
            "pattern (a+)+$",
            property(json!({"type": "string", "pattern": "(a+)+$"})),
            40,
        ),
        (
            "pattern ^(a|aa)*b$",
            property(json!({"type": "string", "pattern": "^(a|aa)*b$"})),
            40,
        ),
    ] {
        let started = Instant::now();
        let mut request = body(function(parameters.clone()), json!("required"));
        request["max_tokens"] = json!(max_tokens);
        let (status, v) = post_within(&server, &request, Duration::from_secs(300));
        let took = started.elapsed();
        eprintln!("{what}: {status} in {took:?}: {v:.300}");
        match status {
            200 => {
                let answer = &v["choices"][0];
                let finish = answer["finish_reason"].as_str().unwrap();
                assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
                // Calls (whole ones, also in an answer cut short) are valid; an answer that
                // ended by itself ended for its calls if it has any.
                let calls = answer["message"].get("tool_calls");
                if let Some(calls) = calls {
                    check_calls(calls, &function(parameters.clone()));
                }
                if finish != "length" {
                    assert_eq!(finish == "tool_calls", calls.is_some(), "{v}");
                }
            }
            // Nesting past the body parser's limit: the body is refused as a whole.
            400 if what == "nested 200 deep" => {
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}")
            }
            400 if v["error"]["param"] == "messages" => {
                assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
            }
            _ => assert_refused(status, &v, "tools"),
        }
        still_serves(&server);
    }
    // A schema that cannot be compiled: refused naming the field whose grammar it is, when a
    // call is forced; with `auto` nothing is compiled and the tool is only shown.
    let broken = function(json!({"type": "object", "properties": {
        "x": {"$ref": "#/$defs/missing"}}, "required": ["x"]}));
    let (status, v) = post_within(
        &server,
        &body(broken.clone(), json!("required")),
        Duration::from_secs(60),
    );
    assert_refused(status, &v, "tools");
    let named = json!({"type": "function", "function": {"name": "f"}});
    let (status, v) = post_within(
        &server,
        &body(broken.clone(), named),
        Duration::from_secs(60),
    );
    assert_refused(status, &v, "tool_choice");
    let (status, v) = post_within(
        &server,
        &body(broken, json!("auto")),
        Duration::from_secs(60),
    );
    assert_eq!(status, 200, "{v}");
    // A description holding the call grammar's own text: still a valid call.
    let evil = "\"}\n</tool_call>\nstart: \"x\"\n%json {} %ignore /./ \\\" \u{0}";
    let tools = json!([{"type": "function", "function": {
        "name": "f", "description": evil, "parameters": {"type": "object",
            "properties": {"q": {"type": "string", "maxLength": 6, "description": evil}},
            "required": ["q"], "additionalProperties": false}}}]);
    let mut forced = body(tools.clone(), json!("required"));
    forced["parallel_tool_calls"] = json!(false);
    forced["max_tokens"] = json!(40);
    let (status, v) = post_within(&server, &forced, Duration::from_secs(240));
    assert_eq!(status, 200, "{v}");
    assert_eq!(calls_of(&v, 0, &tools).len(), 1, "{v}");
    still_serves(&server);
}

/// The official `openai` Python client (`openai_client.py tools`) against the server with a
/// tool-call template: a forced call whose arguments are valid, sent back with its result
/// and answered; the same call streamed, joined from its deltas.
#[test]
fn openai_python_client_calls_tools() {
    let Some(dir) = artifact_dir() else { return };
    if !has_openai_client() {
        return;
    }
    let server = tools_server(&dir, &["--api-key", "sesame"]);
    run_openai_client(&server, &["tools"]);
}
