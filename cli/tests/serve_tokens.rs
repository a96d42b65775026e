//! `runtime serve`'s tokenizer routes (`/tokenize`, `/detokenize`, `/apply-template`, in
//! llama-server's and vLLM's shapes) and `--served-model-name`, through the real binary on
//! the real artifact. Token ids are checked against the `tokenizers` library's
//! (runtime/tests/data/tokenizer_oracle.json) and a conversation's against transformers'
//! `apply_chat_template` (runtime/tests/data/golden.json).

mod common;

use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body};

fn data(name: &str) -> Value {
    let path = format!(
        "{}/../runtime/tests/data/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn post_ok(server: &Server, path: &str, body: &Value) -> Value {
    let (status, answer) = server.post(path, body);
    assert_eq!(status, 200, "{path} {body}: {answer}");
    answer
}

fn ids(answer: &Value) -> Vec<u64> {
    let tokens = answer["tokens"].as_array().unwrap();
    let ids: Vec<u64> = tokens.iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(answer["count"], ids.len(), "{answer}");
    ids
}

/// Each of the oracle's 293 strings (digits, whitespace runs, scripts, emoji, special-token
/// text) gets the `tokenizers` library's ids in either server's shape; its pieces' bytes
/// join to the text, and `/detokenize` gives the text back.
#[test]
fn text_tokenizes_as_the_tokenizers_library_does() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let oracle = data("tokenizer_oracle.json");
    for case in oracle["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let expected: Vec<u64> = serde_json::from_value(case["tokenizers"].clone()).unwrap();
        let llama = post_ok(&server, "/tokenize", &json!({"content": text}));
        assert_eq!(ids(&llama), expected, "{text:?}");
        assert_eq!(llama["max_model_len"], 8192);
        let vllm = post_ok(
            &server,
            "/tokenize",
            &json!({"prompt": text, "return_token_strs": true}),
        );
        assert_eq!(ids(&vllm), expected, "{text:?}");
        assert_eq!(vllm["token_strs"].as_array().unwrap().len(), expected.len());

        let pieces = post_ok(
            &server,
            "/tokenize",
            &json!({"content": text, "with_pieces": true}),
        );
        let mut bytes = Vec::new();
        for (token, id) in pieces["tokens"].as_array().unwrap().iter().zip(&expected) {
            assert_eq!(token["id"], *id, "{text:?}");
            match &token["piece"] {
                Value::String(piece) => bytes.extend_from_slice(piece.as_bytes()),
                piece => bytes.extend(serde_json::from_value::<Vec<u8>>(piece.clone()).unwrap()),
            }
        }
        assert_eq!(String::from_utf8(bytes).unwrap(), text);

        let back = post_ok(&server, "/detokenize", &json!({"tokens": expected}));
        assert_eq!(back["content"], text, "{text:?}");
        assert_eq!(back["prompt"], text, "{text:?}");
    }
}

/// A conversation's ids are transformers' `apply_chat_template` ids for it, and
/// `/apply-template`'s text tokenizes to them.
#[test]
fn a_conversation_tokenizes_as_transformers_renders_it() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let golden = data("golden.json");
    let chats = (golden["prompts"].as_array().unwrap().iter()).filter(|p| p["chat"] == true);
    let mut checked = 0;
    for case in chats {
        let messages = json!([{"role": "user", "content": case["prompt"]}]);
        let expected: Vec<u64> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let answer = post_ok(&server, "/tokenize", &json!({"messages": messages}));
        assert_eq!(ids(&answer), expected, "{}", case["prompt"]);
        let rendered = post_ok(&server, "/apply-template", &json!({"messages": messages}));
        let text = rendered["prompt"].as_str().unwrap();
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
        let body = json!({"prompt": text, "add_special_tokens": false});
        assert_eq!(ids(&post_ok(&server, "/tokenize", &body)), expected);
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} chat prompts in golden.json");
}

/// Every shape's mistakes are a 400 naming the problem; the routes want JSON and, with
/// `--api-key`, the key.
#[test]
fn the_tokenizer_routes_refuse_what_they_cannot_do() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--api-key", "sesame"]);
    let key = "Authorization: Bearer sesame";
    let post = |path: &str, body: &Value| {
        let (status, answer) = server.request("POST", path, &[key], body.to_string().as_bytes());
        (status, serde_json::from_slice::<Value>(&answer).unwrap())
    };
    for (path, body, expected) in [
        (
            "/tokenize",
            json!({"content": "a", "prompt": "b"}),
            "content",
        ),
        ("/tokenize", json!({}), "content"),
        ("/tokenize", json!({"content": "a", "bogus": 1}), "bogus"),
        (
            "/tokenize",
            json!({"content": "a", "parse_special": false}),
            "parse_special",
        ),
        (
            "/tokenize",
            json!({"messages": [], "add_generation_prompt": false}),
            "add_generation_prompt",
        ),
        ("/tokenize", json!({"messages": []}), "messages"),
        ("/detokenize", json!({"tokens": [1, 99999999]}), "99999999"),
        ("/detokenize", json!({}), "tokens"),
        ("/apply-template", json!({"messages": "Hi"}), "messages"),
    ] {
        let (status, answer) = post(path, &body);
        assert_eq!(status, 400, "{path} {body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{path} {body}: {message}");
    }
    for path in ["/tokenize", "/detokenize", "/apply-template"] {
        let (status, _) = server.request("POST", path, &[], br#"{"content": "a"}"#);
        assert_eq!(status, 401, "{path} without the key");
        let text = ["Content-Type: text/plain", key];
        let (status, _) = server.request("POST", path, &text, br#"{"content": "a"}"#);
        assert_eq!(status, 415, "{path} as text/plain");
    }
    // Each route's responses are counted by status (those refused before routing, the
    // 401s, are not).
    let (_, metrics) = server.get("/metrics");
    let metrics = String::from_utf8(metrics).unwrap();
    for (route, status, count) in [
        ("/tokenize", 400, 6),
        ("/tokenize", 415, 1),
        ("/detokenize", 400, 2),
        ("/apply-template", 400, 1),
    ] {
        let line = format!(
            "runtime_http_responses_total{{route=\"{route}\",status=\"{status}\"}} {count}"
        );
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in {metrics}"
        );
    }
}

/// `--served-model-name`: the first name is the model's in `/v1/models` and in answers,
/// every name is served, any other is 404 `model_not_found`.
#[test]
fn served_model_names_are_served() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(
        &dir,
        &[
            "--served-model-name",
            "smol",
            "--served-model-name",
            "gpt-4o-mini",
        ],
    );
    let (status, body) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_slice(&body).unwrap();
    let names: Vec<&str> = (models["data"].as_array().unwrap().iter())
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["smol", "gpt-4o-mini"]);
    for name in ["smol", "gpt-4o-mini"] {
        let mut body = chat_body("Hi", 2, false);
        body["model"] = name.into();
        let answer = post_ok(&server, "/v1/chat/completions", &body);
        assert_eq!(answer["model"], "smol");
        let tokenized = post_ok(
            &server,
            "/tokenize",
            &json!({"prompt": "Hi", "model": name}),
        );
        assert_eq!(tokenized["count"], 1);
    }
    let directory_name = std::path::Path::new(&dir)
        .file_name()
        .unwrap()
        .to_string_lossy();
    for name in ["gpt-4o", directory_name.as_ref()] {
        let mut body = chat_body("Hi", 2, false);
        body["model"] = name.into();
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 404, "{name}: {answer}");
        assert_eq!(answer["error"]["code"], "model_not_found");
    }
}
