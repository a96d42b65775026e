//! `runtime serve`'s reasoning wiring on the real artifact, through the binary: a chat
//! template that opens the answer's `<think>` section itself (DeepSeek-R1's distills) gets
//! the answer as `reasoning_content`, whole and streamed, unless `--keep-thinking` leaves
//! it in the content; a request's `chat_template_kwargs` override the server's
//! `--chat-template-kwargs` (Qwen3's `enable_thinking`, either way).
//!
//! SmolLM2 never writes `</think>`, so its answers after such a prompt are all reasoning
//! (as if cut off while thinking); the cut at `</think>` is tested where the reply is read
//! (`server/src/reply.rs`) and split (`runtime/tests/reasoning.rs`).

mod common;

use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body, template};

const CHAT: &str = "/v1/chat/completions";

fn post_ok(server: &Server, body: &Value) -> Value {
    let (status, answer) = server.post(CHAT, body);
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The streamed chunks' `reasoning_content` and `content`, joined.
fn streamed(server: &Server, body: &Value) -> (String, String) {
    let (mut reasoning, mut content) = (String::new(), String::new());
    for event in server.stream(CHAT, body) {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    (reasoning, content)
}

#[test]
fn a_template_that_opens_the_section_gets_the_answer_as_reasoning() {
    let Some(dir) = artifact_dir() else { return };
    let deepseek = template("deepseek-r1-distill.jinja");
    let ask = "What is the capital of France?";

    let kept = Server::start(&dir, &["--chat-template", &deepseek, "--keep-thinking"]);
    let answer = post_ok(&kept, &chat_body(ask, 12, false));
    let message = &answer["choices"][0]["message"];
    let written = message["content"].as_str().unwrap().to_string();
    assert!(!written.trim().is_empty(), "{answer}");
    assert!(message.get("reasoning_content").is_none(), "{answer}");
    drop(kept);

    let server = Server::start(&dir, &["--chat-template", &deepseek]);
    let answer = post_ok(&server, &chat_body(ask, 12, false));
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], written.trim(), "{answer}");
    assert_eq!(message["content"], Value::Null, "{answer}");

    let (reasoning, content) = streamed(&server, &chat_body(ask, 12, true));
    assert_eq!(reasoning, written.trim());
    assert_eq!(content, "");
}

#[test]
fn a_requests_template_kwargs_override_the_servers() {
    let Some(dir) = artifact_dir() else { return };
    let qwen3 = template("qwen3.jinja");
    // Thinking off for every chat unless a request says otherwise: Qwen3's template then
    // writes an empty `<think>\n\n</think>\n\n` into the prompt, a few tokens more.
    let server = Server::start(
        &dir,
        &[
            "--chat-template",
            &qwen3,
            "--chat-template-kwargs",
            r#"{"enable_thinking": false}"#,
        ],
    );
    let prompt_tokens = |kwargs: Option<Value>| {
        let mut body = chat_body("Hi", 1, false);
        if let Some(kwargs) = kwargs {
            body["chat_template_kwargs"] = kwargs;
        }
        let answer = post_ok(&server, &body);
        answer["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let servers = prompt_tokens(None);
    let thinking = prompt_tokens(Some(json!({"enable_thinking": true})));
    let not_thinking = prompt_tokens(Some(json!({"enable_thinking": false})));
    assert!(
        thinking < servers,
        "{thinking} tokens with thinking on, {servers} without"
    );
    assert_eq!(not_thinking, servers);
}
