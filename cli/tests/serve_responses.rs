//! OpenAI's Responses API (`POST /v1/responses`) through the real binary on the real
//! artifact: greedy text equal to the command line's, whole and streamed alike, the events
//! in OpenAI's order with consecutive `sequence_number`s; `max_output_tokens` making the
//! response `incomplete`; with the Qwen2.5 template a forced call valid against its schema,
//! streamed, and its `function_call_output` answered; `text.format` with a JSON schema; with
//! Qwen3's, `reasoning.effort` switching `enable_thinking` and an earlier reasoning item
//! rendered where the template keeps it; with DeepSeek-R1's (whose prompt opens the
//! `<think>` section) the answer as a reasoning item; errors in OpenAI's envelope naming
//! the field, the API key's guard, the route's metrics; and the official `openai` Python
//! client (`openai_responses.py`).

mod common;

use serde_json::{Value, json};

use common::{
    Server, artifact_dir, cli_answer, has_openai_client, named_events, run_client, template,
};

const RESPONSES: &str = "/v1/responses";

/// A POST with `headers`: its status and JSON body.
fn post(server: &Server, headers: &[&str], body: &Value) -> (u16, Value) {
    let (status, body) = server.request("POST", RESPONSES, headers, body.to_string().as_bytes());
    let text = String::from_utf8_lossy(&body).to_string();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn post_ok(server: &Server, body: &Value) -> Value {
    let (status, answer) = post(server, &[], body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "response", "{answer}");
    assert!(
        answer["id"].as_str().unwrap().starts_with("resp_"),
        "{answer}"
    );
    answer
}

/// A streamed answer's events' data, checking that each names its `event:` type and that
/// they are numbered 0, 1, 2... Comments (a wait for a slot) are left out.
fn events(server: &Server, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = true.into();
    let (status, bytes) = server.request("POST", RESPONSES, &[], body.to_string().as_bytes());
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(status, 200, "{text}");
    let events: Vec<Value> = named_events(&text)
        .into_iter()
        .map(|(_, data)| data)
        .collect();
    for (number, data) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], number, "{data}");
    }
    events
}

/// What a stream said: the output items joined from their events, and the final response;
/// checking the events' order as it goes (`response.created` and `response.in_progress`,
/// each item added at its index, its content part added, its deltas, their `.done`, the
/// part's and the item's, then `response.completed` or `response.incomplete`).
fn streamed(events: &[Value]) -> (Vec<Value>, Value) {
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..2],
        ["response.created", "response.in_progress"],
        "{kinds:?}"
    );
    let id = &events[0]["response"]["id"];
    assert_eq!(events[0]["response"]["output"], json!([]));
    let last = events.last().unwrap();
    assert!(
        ["response.completed", "response.incomplete"].contains(&kinds[kinds.len() - 1]),
        "{kinds:?}"
    );
    assert_eq!(&last["response"]["id"], id);
    let (mut items, mut open) = (Vec::<Value>::new(), false);
    for data in &events[2..events.len() - 1] {
        let kind = data["type"].as_str().unwrap();
        let index = data["output_index"].as_u64().unwrap() as usize;
        if kind == "response.output_item.added" {
            assert!(!open && index == items.len(), "{kinds:?}");
            items.push(data["item"].clone());
            open = true;
            continue;
        }
        assert!(open && index == items.len() - 1, "{kinds:?}");
        let item = items.last_mut().unwrap();
        if kind != "response.output_item.done" {
            assert_eq!(data["item_id"], item["id"], "{data}");
        }
        let append = |field: &mut Value, delta: &Value| {
            *field = (field.as_str().unwrap().to_string() + delta.as_str().unwrap()).into();
        };
        match (kind, item["type"].as_str().unwrap()) {
            ("response.content_part.added", "message" | "reasoning") => {
                assert_eq!(item["content"], json!([]), "{data}");
                item["content"] = json!([data["part"]]);
            }
            ("response.output_text.delta", "message")
            | ("response.reasoning_text.delta", "reasoning") => {
                append(&mut item["content"][0]["text"], &data["delta"]);
            }
            ("response.function_call_arguments.delta", "function_call") => {
                append(&mut item["arguments"], &data["delta"]);
            }
            ("response.output_text.done", "message")
            | ("response.reasoning_text.done", "reasoning") => {
                assert_eq!(data["text"], item["content"][0]["text"], "{data}");
            }
            ("response.function_call_arguments.done", "function_call") => {
                assert_eq!(data["arguments"], item["arguments"], "{data}");
            }
            ("response.content_part.done", _) => {
                assert_eq!(data["part"], item["content"][0], "{data}");
            }
            ("response.output_item.done", _) => {
                item["status"] = data["item"]["status"].clone();
                assert_eq!(&data["item"], item, "{kinds:?}");
                open = false;
            }
            (kind, item) => panic!("{kind} in a {item} item: {kinds:?}"),
        }
    }
    assert!(!open, "{kinds:?}");
    assert_eq!(last["response"]["output"], Value::from(items.clone()));
    (items, last["response"].clone())
}

/// The text of a response's message items.
fn text_of(response: &Value) -> String {
    (response["output"].as_array().unwrap().iter())
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap())
        .map(|part| part["text"].as_str().unwrap())
        .collect()
}

/// A response without what each draws anew (ids, the time) and what a second run of the
/// same prompt changes (the tokens the first one left in a kept cache), to compare two
/// answers.
fn without_ids(response: &Value) -> Value {
    let mut response = response.clone();
    for field in ["id", "created_at"] {
        response.as_object_mut().unwrap().remove(field);
    }
    response["usage"]["input_tokens_details"]["cached_tokens"] = Value::Null;
    for item in response["output"].as_array_mut().unwrap() {
        for id in ["id", "call_id"] {
            item.as_object_mut().unwrap().remove(id);
        }
    }
    response
}

/// Greedy: the text is the command line's chat answer, whole and streamed alike (the final
/// streamed response the whole one); `max_output_tokens` cuts it `incomplete`; what the
/// request set is echoed.
#[test]
fn text_whole_and_streamed_agree_and_stop_as_asked() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let question = "What is the capital of France?";
    let body = json!({"model": "smollm2-135m-instruct", "input": question, "temperature": 0,
                      "max_output_tokens": 24, "metadata": {"run": "test"}, "store": true,
                      "truncation": "disabled", "include": [], "user": "u-1"});
    let answer = post_ok(&server, &body);
    let expected = cli_answer(&dir, question, 24);
    assert_eq!(text_of(&answer), expected, "{answer}");
    let output = answer["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{answer}");
    let message = &output[0];
    assert_eq!(
        (&message["type"], &message["role"]),
        (&json!("message"), &json!("assistant"))
    );
    assert!(
        message["id"].as_str().unwrap().starts_with("msg_"),
        "{message}"
    );
    assert_eq!(message["content"][0]["annotations"], json!([]));
    let usage = &answer["usage"];
    let output_tokens = usage["output_tokens"].as_u64().unwrap();
    let status = if output_tokens == 24 {
        "incomplete"
    } else {
        "completed"
    };
    assert_eq!(
        (&answer["status"], &message["status"]),
        (&json!(status), &json!(status))
    );
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + output_tokens
    );
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    for (field, value) in [
        ("model", json!("smollm2-135m-instruct")),
        ("metadata", json!({"run": "test"})),
        ("store", json!(false)),
        ("user", json!("u-1")),
        ("max_output_tokens", json!(24)),
        ("temperature", json!(0)),
        ("truncation", json!("disabled")),
        ("tools", json!([])),
        ("text", json!({"format": {"type": "text"}})),
        ("previous_response_id", Value::Null),
    ] {
        assert_eq!(answer[field], value, "{field}: {answer}");
    }

    let (items, last) = streamed(&events(&server, &body));
    assert_eq!(items.len(), 1);
    assert_eq!(without_ids(&last), without_ids(&answer));

    let mut short = body.clone();
    short["max_output_tokens"] = 3.into();
    let answer = post_ok(&server, &short);
    assert_eq!(answer["status"], "incomplete", "{answer}");
    assert_eq!(
        answer["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(answer["usage"]["output_tokens"], 3, "{answer}");
    assert!(expected.starts_with(&text_of(&answer)), "{answer}");
    let (_, last) = streamed(&events(&server, &short));
    assert_eq!(without_ids(&last), without_ids(&answer));
}

/// Refusals as 400s in OpenAI's envelope naming the field (an unknown one in the message),
/// the key's guard (401), an unknown model (404); each counted under the route.
#[test]
fn errors_name_the_field() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--api-key", "sesame"]);
    let key = "Authorization: Bearer sesame";
    let body = json!({"input": "Hi", "max_output_tokens": 2});
    for headers in [&[][..], &["Authorization: Bearer wrong"]] {
        let (status, v) = post(&server, headers, &body);
        assert_eq!(
            (status, &v["error"]["code"]),
            (401, &json!("invalid_api_key")),
            "{v}"
        );
    }
    let with = |field: &str, value: Value| {
        let mut body = body.clone();
        body[field] = value;
        body
    };
    for (body, param, expected) in [
        (
            with("colour", json!(1)),
            Value::Null,
            "unknown field \"colour\"",
        ),
        (
            with("previous_response_id", json!("resp_1")),
            json!("previous_response_id"),
            "stateless",
        ),
        (
            with("tool_choice", json!("always")),
            json!("tool_choice"),
            "tool_choice",
        ),
        (
            with("tool_choice", json!("required")),
            json!("tool_choice"),
            "no tools",
        ),
        (
            with("tool_choice", json!({"type": "web_search_preview"})),
            json!("tool_choice"),
            "does not run",
        ),
        (
            with("tools", json!([{"type": "custom", "name": "apply_patch"}])),
            json!("tools"),
            "does not offer",
        ),
        (
            with("reasoning", json!({"effort": "high"})),
            json!("reasoning"),
            "no reasoning",
        ),
        (
            with("include", json!(["message.output_text.logprobs"])),
            json!("include"),
            "logprobs",
        ),
        (
            with(
                "input",
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            ),
            json!("input"),
            "input_image",
        ),
        (
            with("max_output_tokens", json!(1_000_000)),
            json!("max_output_tokens"),
            "at most",
        ),
    ] {
        let (status, v) = post(&server, &[key], &body);
        assert_eq!(status, 400, "{body}: {v}");
        let error = &v["error"];
        assert_eq!(
            (&error["type"], &error["param"]),
            (&json!("invalid_request_error"), &param),
            "{v}"
        );
        assert!(
            error["message"].as_str().unwrap().contains(expected),
            "{expected}: {v}"
        );
    }
    let (status, v) = post(&server, &[key], &with("model", json!("gpt-5")));
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("model_not_found")),
        "{v}"
    );
    let (status, v) = post(&server, &[key], &body);
    assert_eq!((status, &v["object"]), (200, &json!("response")), "{v}");

    let metrics = String::from_utf8(server.get("/metrics").1).unwrap();
    for line in [
        r#"runtime_http_responses_total{route="/v1/responses",status="200"} 1"#,
        r#"runtime_http_responses_total{route="/v1/responses",status="400"} 10"#,
        r#"runtime_http_responses_total{route="/v1/responses",status="404"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

/// A function tool whose arguments have a nested object, an enum and a bounded integer.
fn weather_tool() -> Value {
    json!({
        "type": "function", "name": "get_weather", "description": "The weather forecast for a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "object", "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 16}},
                "required": ["city"], "additionalProperties": false},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["location", "unit"], "additionalProperties": false},
        "strict": true,
    })
}

fn valid(value: &Value, schema: &Value) {
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{value}: {errors:?}");
}

/// `tool_choice: required` with the Qwen2.5 template: one `function_call` item whose
/// arguments are valid against the schema; streamed, the same call from its deltas; sent
/// back with its `function_call_output`, answered from the kept cache; a named function;
/// `none` gives text.
#[test]
fn a_forced_tool_call_is_valid_streamed_and_answered() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(
        &dir,
        &["--chat-template", &template("qwen2.5-instruct.jinja")],
    );
    let tool = weather_tool();
    let question = json!({"role": "user", "content": "What's the weather in Paris?"});
    let body = json!({"input": [question], "tools": [tool], "tool_choice": "required",
                      "parallel_tool_calls": false, "temperature": 0, "max_output_tokens": 80});
    let answer = post_ok(&server, &body);
    assert_eq!(answer["status"], "completed", "{answer}");
    let output = answer["output"].as_array().unwrap();
    let [call] = &output[..] else {
        panic!("one function_call item: {answer}")
    };
    assert_eq!(
        (&call["type"], &call["name"]),
        (&json!("function_call"), &json!("get_weather"))
    );
    assert!(call["id"].as_str().unwrap().starts_with("fc_"), "{call}");
    assert!(
        call["call_id"].as_str().unwrap().starts_with("call_"),
        "{call}"
    );
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    valid(&arguments, &tool["parameters"]);
    assert_eq!(
        (&answer["tool_choice"], &answer["parallel_tool_calls"]),
        (&json!("required"), &json!(false))
    );
    assert_eq!(answer["tools"], json!([tool]));

    let (items, last) = streamed(&events(&server, &body));
    let [streamed_call] = &items[..] else {
        panic!("one function_call item: {items:?}")
    };
    assert_eq!(streamed_call["arguments"], call["arguments"]);
    assert_eq!(
        last["usage"]["output_tokens"],
        answer["usage"]["output_tokens"]
    );

    // The output sent back as it came, with the call's output.
    let result = json!({"type": "function_call_output", "call_id": call["call_id"],
                        "output": "{\"temperature\": 21, \"sky\": \"sunny\"}"});
    let round = json!({"input": [question, call, result], "tools": [tool],
                       "temperature": 0, "max_output_tokens": 8});
    let answered = post_ok(&server, &round);
    assert!(["completed", "incomplete"].contains(&answered["status"].as_str().unwrap()));
    let first = answer["usage"]["input_tokens"].as_u64().unwrap();
    let second = answered["usage"]["input_tokens"].as_u64().unwrap();
    assert!(second > first + 20, "{first} then {second} input tokens");
    let cached = answered["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 0, "{answered}");

    let mut named = body.clone();
    named["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    let answer = post_ok(&server, &named);
    assert_eq!(answer["output"][0]["name"], "get_weather", "{answer}");
    let mut none = body.clone();
    none["tool_choice"] = "none".into();
    none["max_output_tokens"] = 6.into();
    let answer = post_ok(&server, &none);
    let items = answer["output"].as_array().unwrap();
    assert!(items.iter().all(|i| i["type"] == "message"), "{answer}");
}

/// `text.format` of type `json_schema`: the answer is JSON valid against the schema, whole
/// and streamed alike.
#[test]
fn a_json_schema_format_is_followed() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "capital": {"type": "boolean"}},
        "required": ["city", "country", "capital"], "additionalProperties": false});
    let body = json!({"input": "Describe Paris as JSON.", "temperature": 0, "max_output_tokens": 80,
                      "text": {"format": {"type": "json_schema", "name": "city", "schema": schema,
                                          "strict": true}}});
    let answer = post_ok(&server, &body);
    assert_eq!(answer["status"], "completed", "{answer}");
    let text = text_of(&answer);
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    valid(&value, &schema);
    assert_eq!(answer["text"]["format"]["name"], "city");
    let (_, last) = streamed(&events(&server, &body));
    assert_eq!(text_of(&last), text);
}

/// Qwen3's template: `reasoning.effort` none writes an empty `<think>` section into the
/// prompt (more tokens than high); an earlier answer's reasoning item is rendered only
/// where the template keeps it (the turn of a tool loop under way).
#[test]
fn effort_switches_the_templates_enable_thinking() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--chat-template", &template("qwen3.jinja")]);
    let input_tokens = |input: Value, effort: Value| {
        let mut body = json!({"input": input, "tools": [weather_tool()], "max_output_tokens": 1});
        if !effort.is_null() {
            body["reasoning"] = json!({"effort": effort});
        }
        let answer = post_ok(&server, &body);
        answer["usage"]["input_tokens"].as_u64().unwrap()
    };
    let high = input_tokens("Hi".into(), "high".into());
    let none = input_tokens("Hi".into(), "none".into());
    let default = input_tokens("Hi".into(), Value::Null);
    assert!(high < none, "{high} tokens with reasoning, {none} without");
    assert_eq!(default, high, "the template's default reasons");

    let hi = json!({"role": "user", "content": "Hi"});
    let thought = json!({"type": "reasoning", "id": "rs_1", "summary": [],
                         "content": [{"type": "reasoning_text", "text": "The user wants the weather."}]});
    let call = json!({"type": "function_call", "call_id": "call_1", "name": "get_weather",
                      "arguments": "{\"location\": {\"city\": \"Paris\"}, \"unit\": \"celsius\"}"});
    let result = json!({"type": "function_call_output", "call_id": "call_1", "output": "21 C"});
    let with = input_tokens(json!([hi, thought, call, result]), Value::Null);
    let without = input_tokens(json!([hi, call, result]), Value::Null);
    assert!(
        with > without + 4,
        "the tool loop's reasoning: {with} against {without}"
    );
    // Before the last question, the template drops it.
    let text = json!({"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]});
    let again = json!({"role": "user", "content": "And Rome?"});
    assert_eq!(
        input_tokens(json!([hi, thought, text, again]), Value::Null),
        input_tokens(json!([hi, text, again]), Value::Null)
    );
}

/// DeepSeek-R1's template opens the answer's `<think>` section in the prompt: SmolLM2 never
/// closes it, so the answer is one reasoning item, cut at its length, streamed as
/// `reasoning_text` deltas; its tokens counted as reasoning.
#[test]
fn reasoning_comes_as_a_reasoning_item() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(
        &dir,
        &["--chat-template", &template("deepseek-r1-distill.jinja")],
    );
    let body = json!({"input": "What is the capital of France?", "temperature": 0,
                      "max_output_tokens": 12, "reasoning": {"effort": "medium"}});
    let answer = post_ok(&server, &body);
    let output = answer["output"].as_array().unwrap();
    let [reasoning] = &output[..] else {
        panic!("one reasoning item: {answer}")
    };
    assert_eq!(reasoning["type"], "reasoning");
    assert!(
        reasoning["id"].as_str().unwrap().starts_with("rs_"),
        "{reasoning}"
    );
    assert_eq!(reasoning["summary"], json!([]));
    let [part] = &reasoning["content"].as_array().unwrap()[..] else {
        panic!("one part: {reasoning}")
    };
    assert_eq!(part["type"], "reasoning_text");
    assert!(
        !part["text"].as_str().unwrap().trim().is_empty(),
        "{answer}"
    );
    assert_eq!(
        (&answer["status"], &reasoning["status"]),
        (&json!("incomplete"), &json!("incomplete"))
    );
    let usage = &answer["usage"];
    let reasoning_tokens = usage["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!((1..=12).contains(&reasoning_tokens), "{usage}");
    let (items, last) = streamed(&events(&server, &body));
    assert_eq!(without_ids(&last), without_ids(&answer));
    assert_eq!(items.len(), 1);
    // Effort none cannot be honoured: the template has no switch.
    let mut off = body.clone();
    off["reasoning"] = json!({"effort": "none"});
    let (status, v) = post(&server, &[], &off);
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("reasoning")),
        "{v}"
    );
}

/// Runs cli/tests/openai_responses.py (the official `openai` Python client) against
/// `server` with the key `sesame` and `mode`; fails with its output if it fails.
fn run_responses_client(server: &Server, mode: &str) {
    let base_url = format!("http://{}/v1", server.address);
    run_client("openai_responses.py", &base_url, &[mode]);
}

/// The official `openai` Python client through its types: `responses.create` (text, a
/// forced call and its output, reasoning), `responses.parse` with a Pydantic model,
/// `responses.stream`; when python3 has it (`REQUIRE_OPENAI=1`, CI, makes its absence a
/// failure).
#[test]
fn openai_python_client_responses() {
    let Some(dir) = artifact_dir() else { return };
    if !has_openai_client() {
        return;
    }
    let tools = template("qwen2.5-instruct.jinja");
    let server = Server::start(&dir, &["--chat-template", &tools, "--api-key", "sesame"]);
    run_responses_client(&server, "tools");
    drop(server);
    let thinking = template("deepseek-r1-distill.jinja");
    let server = Server::start(&dir, &["--chat-template", &thinking, "--api-key", "sesame"]);
    run_responses_client(&server, "reasoning");
}
