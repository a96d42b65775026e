//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) through the
//! real binary on the real artifact: an answer whole and streamed alike at temperature 0, the
//! events in Anthropic's order; `stop_sequences` and `max_tokens` as stop reasons; with the
//! Qwen2.5 template a forced call (`tool_choice: any`) whose input is valid against its
//! schema, streamed as `input_json_delta`, and its `tool_result` answered; with Qwen3's,
//! `thinking` switching the template's `enable_thinking` and earlier reasoning rendered
//! where the template keeps it; with DeepSeek-R1's (whose prompt opens the `<think>`
//! section) the answer as a thinking block; errors in Anthropic's envelope, the guard's
//! included; `count_tokens` equal to the prompt an answer ran; and the official `anthropic`
//! Python client (`anthropic_client.py`).

mod common;

use serde_json::{Value, json};

use common::{
    Server, artifact_dir, has_anthropic_client, named_events, run_anthropic_client, template,
};

const MESSAGES: &str = "/v1/messages";
const COUNT: &str = "/v1/messages/count_tokens";
/// What Anthropic's clients send with every request; any value is accepted.
const VERSION: &str = "anthropic-version: 2023-06-01";

/// A POST with `headers` besides the version: its status and JSON body.
fn post(server: &Server, path: &str, headers: &[&str], body: &Value) -> (u16, Value) {
    let mut all = vec![VERSION];
    all.extend_from_slice(headers);
    let (status, body) = server.request("POST", path, &all, body.to_string().as_bytes());
    let text = String::from_utf8_lossy(&body).to_string();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn post_ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, answer) = post(server, path, &[], body);
    assert_eq!(status, 200, "{answer}");
    answer
}

/// A streamed answer's events: each one's `event:` name and its data, which names the same
/// type. Comments (a wait for a slot) are left out.
fn events(server: &Server, body: &Value) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = true.into();
    let (status, bytes) = server.request("POST", MESSAGES, &[VERSION], body.to_string().as_bytes());
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(status, 200, "{text}");
    named_events(&text)
}

/// What a stream said: its blocks as a whole answer has them (a tool_use block's input the
/// join of its `input_json_delta`s), its stop reason and stop sequence, its usage; checking
/// the events' order as it goes (message_start first, each block started, written and
/// stopped in turn by index, then message_delta and message_stop).
fn streamed(events: &[(String, Value)]) -> (Vec<Value>, Value, Value, Value) {
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]), "{start}");
    assert!(start["id"].as_str().unwrap().starts_with("msg_"), "{start}");
    let (mut blocks, mut json_text, mut open) = (Vec::<Value>::new(), String::new(), false);
    for (name, data) in &events[1..events.len() - 2] {
        match name.as_str() {
            "ping" => {}
            "content_block_start" => {
                assert!(!open, "{names:?}");
                assert_eq!(data["index"], blocks.len(), "{data}");
                blocks.push(data["content_block"].clone());
                (open, json_text) = (true, String::new());
            }
            "content_block_delta" => {
                assert!(open, "{names:?}");
                assert_eq!(data["index"], blocks.len() - 1, "{data}");
                let block = blocks.last_mut().unwrap();
                let delta = &data["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => {
                        let text = block["text"].as_str().unwrap().to_string();
                        block["text"] = (text + delta["text"].as_str().unwrap()).into();
                    }
                    "thinking_delta" => {
                        let text = block["thinking"].as_str().unwrap().to_string();
                        block["thinking"] = (text + delta["thinking"].as_str().unwrap()).into();
                    }
                    "input_json_delta" => {
                        json_text.push_str(delta["partial_json"].as_str().unwrap());
                        block["input"] = serde_json::from_str(&json_text).unwrap_or(Value::Null);
                    }
                    other => panic!("delta of type {other}"),
                }
            }
            "content_block_stop" => {
                assert!(open, "{names:?}");
                assert_eq!(data["index"], blocks.len() - 1, "{data}");
                open = false;
            }
            other => panic!("event {other} inside the message: {names:?}"),
        }
    }
    assert!(!open, "{names:?}");
    let delta = &events[events.len() - 2].1;
    let stop = &delta["delta"];
    (
        blocks,
        stop["stop_reason"].clone(),
        stop["stop_sequence"].clone(),
        delta["usage"].clone(),
    )
}

/// The prompt's tokens by `usage`: those read from a cache and the others.
fn prompt_tokens(usage: &Value) -> u64 {
    usage["input_tokens"].as_u64().unwrap() + usage["cache_read_input_tokens"].as_u64().unwrap()
}

/// The text of an answer's blocks (all text blocks).
fn text_of(answer: &Value) -> String {
    (answer["content"].as_array().unwrap().iter())
        .filter(|block| block["type"] == "text")
        .map(|block| block["text"].as_str().unwrap())
        .collect()
}

fn ask(question: &str, max_tokens: usize) -> Value {
    json!({
        "model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0,
        "system": [{"type": "text", "text": "You are a helpful assistant.",
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": question}],
        "metadata": {"user_id": "u-1"},
    })
}

/// Greedy: the streamed blocks are the whole answer's, with its stop reason and usage; a
/// stop sequence taken from that answer cuts it there with `stop_sequence`; a smaller
/// `max_tokens` stops at it; `count_tokens` says the prompt's length.
#[test]
fn text_whole_and_streamed_agree_and_stop_as_asked() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let body = ask("What is the capital of France?", 24);
    let answer = post_ok(&server, MESSAGES, &body);
    assert!(
        answer["id"].as_str().unwrap().starts_with("msg_"),
        "{answer}"
    );
    assert_eq!(
        (&answer["type"], &answer["role"], &answer["model"]),
        (&json!("message"), &json!("assistant"), &body["model"]),
        "{answer}"
    );
    let reason = answer["stop_reason"].as_str().unwrap();
    assert!(["end_turn", "max_tokens"].contains(&reason), "{answer}");
    assert_eq!(answer["stop_sequence"], Value::Null);
    let text = text_of(&answer);
    assert!(text.contains("Paris"), "{answer}");
    let usage = &answer["usage"];
    assert!(usage["output_tokens"].as_u64().unwrap() <= 24, "{answer}");
    assert_eq!(usage["cache_creation_input_tokens"], 0, "{answer}");

    let (blocks, stop_reason, stop_sequence, streamed_usage) = streamed(&events(&server, &body));
    assert_eq!(blocks, answer["content"].as_array().unwrap()[..]);
    assert_eq!(
        (stop_reason.as_str(), stop_sequence),
        (Some(reason), Value::Null)
    );
    assert_eq!(streamed_usage["output_tokens"], usage["output_tokens"]);
    assert_eq!(prompt_tokens(&streamed_usage), prompt_tokens(usage));

    // The prompt's length, with the fields an answer needs left out.
    let mut counted = body.clone();
    for field in ["max_tokens", "temperature", "metadata"] {
        counted.as_object_mut().unwrap().remove(field);
    }
    let count = post_ok(&server, COUNT, &counted);
    assert_eq!(count, json!({"input_tokens": prompt_tokens(usage)}));

    // Cut where the answer's third word begins (or after its first few characters).
    let second_space = (text.match_indices(' ').nth(1)).map_or(3, |(at, _)| at);
    let word: String = text[second_space..].chars().take(4).collect();
    let cut = text.find(&word).unwrap();
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!(["never written here", word]);
    let answer = post_ok(&server, MESSAGES, &stopped);
    assert_eq!(answer["stop_reason"], "stop_sequence", "{answer}");
    assert_eq!(answer["stop_sequence"], word.as_str(), "{answer}");
    assert_eq!(text_of(&answer), text[..cut], "{answer}");
    let (blocks, stop_reason, stop_sequence, _) = streamed(&events(&server, &stopped));
    assert_eq!(blocks, answer["content"].as_array().unwrap()[..]);
    assert_eq!(
        (stop_reason, stop_sequence),
        (json!("stop_sequence"), json!(word))
    );

    let mut short = body.clone();
    short["max_tokens"] = 3.into();
    let answer = post_ok(&server, MESSAGES, &short);
    assert_eq!(answer["stop_reason"], "max_tokens", "{answer}");
    assert_eq!(answer["usage"]["output_tokens"], 3, "{answer}");
}

/// Errors in Anthropic's envelope with its types and the statuses its clients map: the key
/// as `x-api-key` (401 without it or wrong), a missing `max_tokens`, an unknown model (404),
/// an unknown field, a body that is not JSON (415) or too large (413), a wrong method (405);
/// OpenAI's routes keep OpenAI's envelope and take `x-api-key` too. Each counted by route.
#[test]
fn errors_come_in_anthropics_envelope() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--api-key", "sesame", "--body-limit", "4000"]);
    let key = "x-api-key: sesame";
    let body = ask("Hi", 2);
    let envelope = |status: u16, v: &Value, expected: (u16, &str)| {
        assert_eq!(
            (status, v["type"].as_str()),
            (expected.0, Some("error")),
            "{v}"
        );
        assert_eq!(v["error"]["type"], expected.1, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
        v["error"]["message"].as_str().unwrap().to_string()
    };
    for headers in [
        &[][..],
        &["x-api-key: wrong"],
        &["Authorization: Bearer wrong"],
    ] {
        let (status, v) = post(&server, MESSAGES, headers, &body);
        envelope(status, &v, (401, "authentication_error"));
    }
    let (status, v) = post(&server, COUNT, &[], &body);
    envelope(status, &v, (401, "authentication_error"));

    let without = |field: &str| {
        let mut body = body.clone();
        body.as_object_mut().unwrap().remove(field);
        body
    };
    let with = |field: &str, value: Value| {
        let mut body = body.clone();
        body[field] = value;
        body
    };
    let last_assistant = json!([{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello"}]);
    for (body, expected) in [
        (without("max_tokens"), "max_tokens"),
        (without("model"), "model"),
        (with("colour", json!(1)), "colour"),
        (with("temperature", json!(1.5)), "temperature"),
        (with("messages", json!([])), "at least one message"),
        (with("messages", last_assistant), "prefill"),
        (
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image"}]}]),
            ),
            "image",
        ),
        (with("tool_choice", json!({"type": "any"})), "no tools"),
        (
            with("thinking", json!({"type": "enabled"})),
            "budget_tokens",
        ),
        (
            with(
                "tools",
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
            ),
            "runs none",
        ),
    ] {
        let (status, v) = post(&server, MESSAGES, &[key], &body);
        let message = envelope(status, &v, (400, "invalid_request_error"));
        assert!(message.contains(expected), "{expected}: {message}");
    }
    let (status, v) = post(
        &server,
        MESSAGES,
        &[key],
        &with("model", json!("claude-sonnet-4-5")),
    );
    envelope(status, &v, (404, "not_found_error"));
    let unknown = json!({"model": "claude-sonnet-4-5", "messages": body["messages"]});
    let (status, v) = post(&server, COUNT, &[key], &unknown);
    envelope(status, &v, (404, "not_found_error"));

    let (status, bytes) =
        server.request("POST", MESSAGES, &[key, "Content-Type: text/plain"], b"{}");
    envelope(
        status,
        &serde_json::from_slice(&bytes).unwrap(),
        (415, "invalid_request_error"),
    );
    let large = with("system", json!("word ".repeat(1000)));
    let (status, v) = post(&server, MESSAGES, &[key], &large);
    envelope(status, &v, (413, "request_too_large"));
    let (status, bytes) = server.request("GET", MESSAGES, &[key], b"");
    envelope(
        status,
        &serde_json::from_slice(&bytes).unwrap(),
        (405, "invalid_request_error"),
    );

    // The key as either client sends it, on either protocol's routes.
    let answer = post_ok_with(&server, MESSAGES, "Authorization: Bearer sesame", &body);
    assert_eq!(answer["type"], "message", "{answer}");
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
    let answer = post_ok_with(&server, "/v1/chat/completions", key, &chat);
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        &["x-api-key: wrong"],
        &chat,
    );
    assert_eq!(
        (status, &v["error"]["code"]),
        (401, &json!("invalid_api_key")),
        "{v}"
    );

    let metrics = String::from_utf8(server.get("/metrics").1).unwrap();
    for line in [
        r#"runtime_http_responses_total{route="/v1/messages",status="200"} 1"#,
        r#"runtime_http_responses_total{route="/v1/messages",status="400"} 10"#,
        r#"runtime_http_responses_total{route="/v1/messages/count_tokens",status="404"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

fn post_ok_with(server: &Server, path: &str, header: &str, body: &Value) -> Value {
    let (status, answer) = post(server, path, &[header], body);
    assert_eq!(status, 200, "{answer}");
    answer
}

/// A tool whose input has a nested object, an enum and a bounded integer.
fn weather_tool() -> Value {
    json!({
        "name": "get_weather", "description": "The weather forecast for a city.",
        "input_schema": {"type": "object", "properties": {
            "location": {"type": "object", "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 16}},
                "required": ["city"], "additionalProperties": false},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["location", "unit"], "additionalProperties": false},
        "cache_control": {"type": "ephemeral"},
    })
}

/// `tool_choice: any` with the Qwen2.5 template: a `tool_use` block of the tool, its input
/// valid against the schema, `stop_reason: tool_use`; streamed, the same block from its
/// `input_json_delta`s; sent back with a `tool_result`, answered; counted as answered.
#[test]
fn a_forced_tool_call_is_valid_streamed_and_answered() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(
        &dir,
        &["--chat-template", &template("qwen2.5-instruct.jinja")],
    );
    let tool = weather_tool();
    let question = json!({"role": "user", "content": "What's the weather in Paris?"});
    let body = json!({
        "model": "smollm2-135m-instruct", "max_tokens": 80, "temperature": 0,
        "messages": [question], "tools": [tool],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    });
    let answer = post_ok(&server, MESSAGES, &body);
    assert_eq!(answer["stop_reason"], "tool_use", "{answer}");
    let content = answer["content"].as_array().unwrap();
    let [call] = &content[..] else {
        panic!("one tool_use block: {answer}")
    };
    assert_eq!(
        (&call["type"], &call["name"]),
        (&json!("tool_use"), &json!("get_weather"))
    );
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    let validator = jsonschema::validator_for(&tool["input_schema"]).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&call["input"])
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{call}: {errors:?}");

    let (blocks, stop_reason, _, usage) = streamed(&events(&server, &body));
    assert_eq!(stop_reason, "tool_use");
    let [streamed_call] = &blocks[..] else {
        panic!("one tool_use block: {blocks:?}")
    };
    assert_eq!(streamed_call["input"], call["input"]);
    assert_eq!(streamed_call["name"], call["name"]);
    assert_eq!(usage["output_tokens"], answer["usage"]["output_tokens"]);

    // The call sent back with its result (and the answer's blocks as the client has them).
    let result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
        "content": [{"type": "text", "text": "{\"temperature\": 21, \"sky\": \"sunny\"}"}]}]});
    let mut round = body.clone();
    round["messages"] = json!([question, {"role": "assistant", "content": content}, result]);
    round["tool_choice"] = json!({"type": "auto"});
    round["max_tokens"] = 8.into();
    let answered = post_ok(&server, MESSAGES, &round);
    let reason = answered["stop_reason"].as_str().unwrap();
    assert!(
        ["end_turn", "max_tokens", "tool_use"].contains(&reason),
        "{answered}"
    );
    let first = prompt_tokens(&answer["usage"]);
    let second = prompt_tokens(&answered["usage"]);
    assert!(second > first + 20, "{first} then {second} prompt tokens");
    // The conversation so far came from the first answer's kept cache.
    assert!(
        answered["usage"]["cache_read_input_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{answered}"
    );
    let mut counted = round.clone();
    for field in ["max_tokens", "temperature"] {
        counted.as_object_mut().unwrap().remove(field);
    }
    assert_eq!(post_ok(&server, COUNT, &counted)["input_tokens"], second);

    // A named tool, and `none`: text, with the tools still in the prompt.
    let mut named = body.clone();
    named["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    let answer = post_ok(&server, MESSAGES, &named);
    assert_eq!(answer["content"][0]["name"], "get_weather", "{answer}");
    let mut none = body.clone();
    none["tool_choice"] = json!({"type": "none"});
    none["max_tokens"] = 6.into();
    let answer = post_ok(&server, MESSAGES, &none);
    assert!(
        answer["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] == "text"),
        "{answer}"
    );
    assert_ne!(answer["stop_reason"], "tool_use", "{answer}");
}

/// Qwen3's template: `thinking` disabled writes an empty `<think>` section into the prompt
/// (a few tokens more than enabled); an earlier turn's thinking is rendered only where the
/// template keeps it (the turn of a tool loop under way), as `<think>` in its content.
#[test]
fn thinking_switches_the_templates_enable_thinking() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--chat-template", &template("qwen3.jinja")]);
    let count = |messages: Value, thinking: Value| {
        let mut body = json!({"model": "smollm2-135m-instruct", "messages": messages,
                              "tools": [weather_tool()]});
        if !thinking.is_null() {
            body["thinking"] = thinking;
        }
        post_ok(&server, COUNT, &body)["input_tokens"]
            .as_u64()
            .unwrap()
    };
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let enabled = count(
        hi.clone(),
        json!({"type": "enabled", "budget_tokens": 1024}),
    );
    let disabled = count(hi.clone(), json!({"type": "disabled"}));
    let adaptive = count(hi.clone(), json!({"type": "adaptive"}));
    assert!(
        enabled < disabled,
        "{enabled} tokens with thinking, {disabled} without"
    );
    assert_eq!(adaptive, enabled, "the template's default thinks");

    // And in an answer's usage.
    let answer = |thinking: Value| {
        let body = json!({"model": "smollm2-135m-instruct", "max_tokens": 1, "messages": hi,
                          "thinking": thinking});
        prompt_tokens(&post_ok(&server, MESSAGES, &body)["usage"])
    };
    let on = answer(json!({"type": "enabled", "budget_tokens": 2048}));
    let off = answer(json!({"type": "disabled"}));
    assert!(on < off, "{on} prompt tokens with thinking, {off} without");

    let thought = json!({"type": "thinking", "thinking": "The user wants the weather.",
                         "signature": ""});
    let call = json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                      "input": {"location": {"city": "Paris"}, "unit": "celsius"}});
    let result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                        "content": "21 C", "is_error": false}]});
    let loop_with =
        |blocks: Value| json!([hi[0], {"role": "assistant", "content": blocks}, result]);
    let with = count(loop_with(json!([thought, call])), Value::Null);
    let without = count(loop_with(json!([call])), Value::Null);
    assert!(
        with > without + 4,
        "the tool loop's reasoning: {with} against {without}"
    );
    // Before the last question, the template drops it.
    let earlier = |blocks: Value| json!([hi[0], {"role": "assistant", "content": blocks}, {"role": "user", "content": "And Rome?"}]);
    let text = json!({"type": "text", "text": "Sunny."});
    assert_eq!(
        count(earlier(json!([thought, text])), Value::Null),
        count(earlier(json!([text])), Value::Null)
    );
}

/// DeepSeek-R1's template opens the answer's `<think>` section in the prompt: SmolLM2 never
/// closes it, so the answer is one thinking block (unsigned), streamed as `thinking_delta`s.
#[test]
fn reasoning_comes_as_a_thinking_block() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(
        &dir,
        &["--chat-template", &template("deepseek-r1-distill.jinja")],
    );
    let mut body = ask("What is the capital of France?", 12);
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let answer = post_ok(&server, MESSAGES, &body);
    let content = answer["content"].as_array().unwrap();
    let [thinking] = &content[..] else {
        panic!("one thinking block: {answer}")
    };
    assert_eq!(
        (&thinking["type"], &thinking["signature"]),
        (&json!("thinking"), &json!(""))
    );
    assert!(
        !thinking["thinking"].as_str().unwrap().trim().is_empty(),
        "{answer}"
    );
    let (blocks, _, _, _) = streamed(&events(&server, &body));
    assert_eq!(blocks, content[..]);
}

/// The official `anthropic` Python client, through its types: `messages.create` with a
/// system prompt, stop sequences, a forced tool call and its result, thinking;
/// `messages.stream` (text as the whole answer's, a call's input joined from its
/// `input_json_delta`s); `count_tokens`; errors as the client's exceptions.
#[test]
fn anthropic_python_client() {
    let Some(dir) = artifact_dir() else { return };
    if !has_anthropic_client() {
        return;
    }
    let tools = template("qwen2.5-instruct.jinja");
    let server = Server::start(&dir, &["--chat-template", &tools, "--api-key", "sesame"]);
    run_anthropic_client(&server, &[]);
    drop(server);
    let thinking = template("deepseek-r1-distill.jinja");
    let server = Server::start(&dir, &["--chat-template", &thinking, "--api-key", "sesame"]);
    run_anthropic_client(&server, &["thinking"]);
}

/// `output_config.format` constrains the answer to its JSON Schema (checked by an
/// independent validator), sampled at Anthropic's default temperature and streamed alike;
/// with what Claude Code sends beside it (`effort`, a `clear_thinking` edit).
#[test]
fn output_config_format_constrains_the_answer_to_its_schema() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30},
                       "population": {"type": "integer", "minimum": 0, "maximum": 100_000_000_000_i64}},
        "required": ["city", "population"],
        "additionalProperties": false,
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    // Bounded (30 characters, 12 digits), so an answer ends well within 200 tokens.
    let mut body = ask("Name a big city and its population.", 200);
    body["temperature"] = 1.0.into();
    body["output_config"] = json!({"effort": "high",
                                   "format": {"type": "json_schema", "schema": schema}});
    body["context_management"] =
        json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
    for _ in 0..3 {
        let answer = post_ok(&server, MESSAGES, &body);
        assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
        let value: Value = serde_json::from_str(&text_of(&answer)).unwrap();
        assert!(validator.is_valid(&value), "{answer}");
        let (blocks, ..) = streamed(&events(&server, &body));
        let [block] = &blocks[..] else {
            panic!("{blocks:?}")
        };
        let value: Value = serde_json::from_str(block["text"].as_str().unwrap()).unwrap();
        assert!(validator.is_valid(&value), "{block}");
    }
}
