//! `runtime serve`'s queue, through the real binary and sockets: a request whose client
//! leaves while it waits for a slot is dropped at once, never run, and counted as
//! cancelled; past `--max-queue` waiting requests a new one gets 429 with `Retry-After`; a
//! queued stream is told it waits for a free slot.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body, metric, read_response, request_to};

const CHAT: &str = "/v1/chat/completions";
/// A prompt the model continues greedily for thousands of tokens without stopping.
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";

/// Sends `body` to `path` on a new connection and returns the connection, unread.
fn send(server: &Server, path: &str, body: &Value) -> TcpStream {
    let body = body.to_string();
    let mut stream = TcpStream::connect(&server.address).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.address,
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// Reads `stream` until what came holds `text` (at most 60 s).
fn read_until(stream: &mut TcpStream, text: &str) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(text) {
        let n = stream.read(&mut buffer).unwrap();
        assert!(
            n > 0,
            "closed before {text:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A long streamed completion (4000 tokens of counting), once its text flows (what came so
/// far with it): it holds a slot for a minute or more.
fn long_stream(server: &Server) -> (TcpStream, String) {
    let body = json!({"prompt": COUNTING, "max_tokens": 4000, "temperature": 0, "stream": true});
    let mut stream = send(server, "/v1/completions", &body);
    let seen = read_until(&mut stream, "\"text\"");
    (stream, seen)
}

/// Waits until every `(metric, value)` holds at once (at most `within`).
fn wait_for(server: &Server, wanted: &[(&str, u64)], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now: Vec<u64> = (wanted.iter())
            .map(|&(name, _)| metric(&server.address, name))
            .collect();
        if wanted
            .iter()
            .zip(&now)
            .all(|(&(_, value), &got)| got == value)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {within:?}: {now:?}, waiting for {wanted:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A user message of some 600 tokens, so that prefilling it would show in the metrics.
fn long_question() -> String {
    "Tell me about the quick brown fox that jumps over the lazy dog. ".repeat(40)
}

/// With the only slot taken, a request (streamed or not) whose client leaves while it
/// waits is dropped from the queue at once and counted as cancelled, and its prompt is
/// never run. It stayed queued until the slot freed; a stream's (whose relay still held its
/// events) was then prefilled whole and, with one token to make, counted as completed.
#[test]
fn a_request_cancelled_while_queued_is_dropped_unrun() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "1"]);
    let (long, _) = long_stream(&server);
    for stream in [false, true] {
        let cancelled = metric(&server.address, "runtime_requests_cancelled_total");
        let body = json!({"messages": [{"role": "user", "content": long_question()}],
                          "max_tokens": 1, "stream": stream});
        let queued = send(&server, CHAT, &body);
        wait_for(
            &server,
            &[("runtime_requests_queued", 1)],
            Duration::from_secs(30),
        );
        drop(queued);
        wait_for(
            &server,
            &[
                ("runtime_requests_queued", 0),
                ("runtime_requests_cancelled_total", cancelled + 1),
                ("runtime_requests_running", 1),
            ],
            Duration::from_secs(10),
        );
    }
    drop(long);
    wait_for(
        &server,
        &[("runtime_requests_running", 0)],
        Duration::from_secs(10),
    );
    // The long completion's prompt is all that was prefilled: the same prompt once more
    // makes the total twice its length.
    let again = json!({"prompt": COUNTING, "max_tokens": 1});
    let (status, answer) = server.post("/v1/completions", &again);
    assert_eq!(status, 200, "{answer}");
    let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        metric(&server.address, "runtime_prompt_tokens_total"),
        2 * prompt
    );
}

/// Past `--max-queue` requests waiting for a slot, a new one (streamed or not) gets 429 in
/// OpenAI's envelope with `Retry-After`, before anything is streamed; once a place frees, a
/// request is queued again and answered when the slot frees. `--max-queue 0` is refused.
#[test]
fn past_max_queue_requests_get_429_with_retry_after() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "1", "--max-queue", "1"]);
    let (long, _) = long_stream(&server);
    let waiting = send(&server, CHAT, &chat_body("Hi", 2, false));
    wait_for(
        &server,
        &[("runtime_requests_queued", 1)],
        Duration::from_secs(30),
    );
    for stream in [false, true] {
        let body = chat_body("Hello", 2, stream).to_string();
        let refused = request_to(
            &server.address,
            "POST",
            CHAT,
            &[],
            body.as_bytes(),
            Duration::from_secs(10),
        )
        .expect("no answer past the queue limit");
        let text = String::from_utf8_lossy(&refused.body);
        assert_eq!(refused.status, 429, "{}\n{text}", refused.head);
        assert!(refused.head.contains("retry-after: 1"), "{}", refused.head);
        let error = &refused.json()["error"];
        assert_eq!(error["code"], "rate_limit_exceeded", "{text}");
        assert!(
            error["message"].as_str().unwrap().contains("--max-queue 1"),
            "{text}"
        );
    }
    drop(waiting);
    wait_for(
        &server,
        &[("runtime_requests_queued", 0)],
        Duration::from_secs(10),
    );
    let mut next = send(&server, CHAT, &chat_body("Hi", 2, false));
    wait_for(
        &server,
        &[("runtime_requests_queued", 1)],
        Duration::from_secs(30),
    );
    drop(long);
    let answer = read_response(&mut next, Duration::from_secs(60)).expect("no answer");
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );

    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args([
            "serve",
            "--port",
            "0",
            "--max-queue",
            "0",
            "--artifacts",
            &dir,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--max-queue"), "{stderr}");
}

/// A stream that has to wait for a slot is told so at once, in a server-sent events comment
/// (which OpenAI's clients skip), before its first chunk; one that starts at once is not.
#[test]
fn a_queued_stream_is_told_it_waits_for_a_free_slot() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "1"]);
    let (long, started) = long_stream(&server);
    assert!(!started.contains("waiting"), "{started}");
    let mut queued = send(&server, CHAT, &chat_body("Hi", 2, true));
    let said = read_until(&mut queued, ": waiting for a free slot\n\n");
    assert!(!said.contains("data:"), "{said}");
    drop(long);
    let rest = read_until(&mut queued, "[DONE]");
    assert!(rest.contains("\"content\""), "{rest}");
}
