//! `runtime serve` on the real artifact: answers equal the command line's, alone and eight at
//! once, streamed and not; the malformed-request corpus; API keys; a client that leaves; and
//! SIGTERM finishing the work under way. The official `openai` Python client against it is
//! `openai_client.py` (run here when python3 has the package; CI installs it).
//!
//! HTTP by hand over `TcpStream` (HTTP/1.1, `Connection: close`): the tests need no client
//! library, and see exactly the status and body the server sends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn artifact_dir() -> Option<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../artifacts/smollm2-135m-instruct");
    if dir.join("model.mpk").exists() {
        return Some(dir.to_string_lossy().into_owned());
    }
    assert!(
        std::env::var_os("REQUIRE_MODEL").is_none(),
        "no converted model in {}",
        dir.display()
    );
    None
}

/// A running server, killed when dropped.
struct Server {
    child: Child,
    address: String,
}

impl Server {
    fn start(dir: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_runtime"))
            .args(["serve", "--port", "0", "--artifacts", dir])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        let server = Self { child, address };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.get("/health").0 != 200 {
            assert!(Instant::now() < deadline, "not ready after 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn request(&self, method: &str, path: &str, headers: &[&str], body: &[u8]) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.address,
            body.len()
        );
        for header in headers {
            head.push_str(header);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        // A body over the limit is refused before it is read: the write may then fail.
        let _ = stream.write_all(body);
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let split = (response.windows(4).position(|w| w == b"\r\n\r\n"))
            .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&response)));
        let head = String::from_utf8_lossy(&response[..split]).to_string();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let mut body = response[split + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        (status, body)
    }

    fn get(&self, path: &str) -> (u16, Vec<u8>) {
        self.request("GET", path, &[], b"")
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, body) = self.request("POST", path, &[], body.to_string().as_bytes());
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// A streamed request's `data:` payloads, `[DONE]` included.
    fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let (status, body) = self.request("POST", path, &[], body.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8(body)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[end + 2..end + 2 + size]);
        body = &body[end + 2 + size + 2..];
    }
}

fn chat_body(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": max_tokens, "stream": stream,
    })
}

/// The command line's greedy chat answer.
fn cli_answer(dir: &str, prompt: &str, max_tokens: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(["--artifacts", dir, "--chat", "--temperature", "0", "--json"])
        .args([
            "--prompt",
            prompt,
            "--max-new-tokens",
            &max_tokens.to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

const PROMPTS: [&str; 8] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colours.",
    "How many legs does a spider have?",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 12?",
    "Give me a synonym for happy.",
    "Who wrote Romeo and Juliet?",
];

/// Greedy answers equal the command line's: one at a time, then eight at once (each its own
/// sequence, stepped in turn), streamed and not.
#[test]
fn answers_equal_the_command_line_alone_and_eight_at_once() {
    let Some(dir) = artifact_dir() else { return };
    let max_tokens = 24;
    let expected: Vec<String> = PROMPTS
        .iter()
        .map(|p| cli_answer(&dir, p, max_tokens))
        .collect();
    let server = Server::start(&dir, &["--parallel", "8"]);
    let whole = |prompt: &str| {
        let (status, v) = server.post(
            "/v1/chat/completions",
            &chat_body(prompt, max_tokens, false),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= max_tokens as u64);
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let streamed = |prompt: &str| {
        let mut body = chat_body(prompt, max_tokens, true);
        body["stream_options"] = json!({"include_usage": true});
        let events = server.stream("/v1/chat/completions", &body);
        assert_eq!(events.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let usage = chunks.last().unwrap();
        assert!(usage["choices"].as_array().unwrap().is_empty());
        assert!(usage["usage"]["total_tokens"].as_u64().unwrap() > 0);
        let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
        assert!(finish == "stop" || finish == "length", "{finish}");
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect::<String>()
    };
    for (prompt, expected) in PROMPTS.iter().zip(&expected) {
        assert_eq!(&whole(prompt), expected, "{prompt}");
        assert_eq!(&streamed(prompt), expected, "{prompt}, streamed");
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (PROMPTS.iter().zip(&expected))
            .enumerate()
            .map(|(i, (prompt, expected))| {
                s.spawn(move || {
                    let got = if i % 2 == 0 {
                        whole(prompt)
                    } else {
                        streamed(prompt)
                    };
                    assert_eq!(&got, expected, "{prompt}, concurrently");
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
    });
    // A plain completion equals `runtime --prompt` (no chat template).
    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(["--artifacts", &dir, "--temperature", "0", "--json"])
        .args(["--prompt", "Once upon a time", "--max-new-tokens", "16"])
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0});
    let (status, v) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], cli["text"]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// A prompt longer than several prefill pieces, arriving while another answer streams, is
/// prefilled a piece at a time between that answer's tokens (the engine's PREFILL_PIECE is
/// 128 tokens): both answers still equal the command line's.
#[test]
fn a_long_prompt_joins_while_another_streams() {
    let Some(dir) = artifact_dir() else { return };
    let long = format!(
        "{} Summarise the text above in one sentence.",
        "The river runs past the old mill, where the miller grinds the grain every morning. "
            .repeat(24)
    );
    let short = "Write a long story about a dragon who learns to read.";
    let (short_tokens, long_tokens) = (300, 16);
    let expected = [
        cli_answer(&dir, short, short_tokens),
        cli_answer(&dir, &long, long_tokens),
    ];
    let server = Server::start(&dir, &["--parallel", "2"]);
    let (decoding, started) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let address = &server.address;
        let streaming = s.spawn(move || {
            // Read as the events come, to say when the first has.
            let mut stream = TcpStream::connect(address).unwrap();
            let body = chat_body(short, short_tokens, true).to_string();
            write!(
                stream,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut text = String::new();
            for line in BufReader::new(stream).lines() {
                let line = line.unwrap();
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                let _ = decoding.send(());
                if data == "[DONE]" {
                    break;
                }
                let chunk: Value = serde_json::from_str(data).unwrap();
                text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            }
            text
        });
        // The long prompt once the other answer is streaming.
        started.recv().unwrap();
        let (status, v) = server.post(
            "/v1/chat/completions",
            &chat_body(&long, long_tokens, false),
        );
        assert_eq!(status, 200, "{v}");
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(
            prompt_tokens > 3 * 128,
            "{prompt_tokens} prompt tokens: not several pieces"
        );
        assert_eq!(v["choices"][0]["message"]["content"], expected[1].as_str());
        assert_eq!(streaming.join().unwrap(), expected[0]);
    });
}

/// `logprobs`: each generated token's log-probability and the most likely tokens' at its
/// step, in OpenAI's shapes, streamed or not; greedy, each token is its step's most likely,
/// and the tokens spell the answer.
#[test]
fn logprobs_come_with_the_tokens() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let mut body = chat_body(PROMPTS[0], 12, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let mut spelled = String::new();
    for entry in &content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        let logprob = entry["logprob"].as_f64().unwrap();
        assert!(logprob <= 0.0);
        assert_eq!(
            entry["token"], top[0]["token"],
            "greedy takes the most likely"
        );
        assert_eq!(logprob, top[0]["logprob"].as_f64().unwrap());
        assert!(
            top.windows(2)
                .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64())
        );
        let token = entry["token"].as_str().unwrap();
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
        assert_eq!(bytes, token.as_bytes());
        spelled.push_str(token);
    }
    assert_eq!(
        spelled,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // Streamed: the same entries, spread over the chunks.
    body["stream"] = json!(true);
    let events = server.stream("/v1/chat/completions", &body);
    let streamed: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    // The second request reuses the first's cache: its prompt's last position runs through
    // the decoding kernels, not the prompt's gemm, so values agree to rounding, not bits.
    assert_eq!(streamed.len(), content.len());
    for (a, b) in streamed.iter().zip(&content) {
        assert_eq!(a["token"], b["token"]);
        let (a, b) = (
            a["logprob"].as_f64().unwrap(),
            b["logprob"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // Without logprobs, none.
    let (_, plain) = server.post("/v1/chat/completions", &chat_body(PROMPTS[0], 4, false));
    assert!(plain["choices"][0]["logprobs"].is_null());
    // The completions API's parallel lists.
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 2});
    let (status, v) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let logprobs = &v["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6);
    assert_eq!(logprobs["token_logprobs"].as_array().unwrap().len(), 6);
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2);
    let text: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(text, v["choices"][0]["text"].as_str().unwrap());
}

/// Each malformed request gets its status and OpenAI's error envelope, and the server goes
/// on serving.
#[test]
fn malformed_requests_get_status_and_envelope() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--body-limit", "100000"]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut body = json!({"messages": user});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string()
    };
    let chat_path = "/v1/chat/completions";
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", chat_path, "{".into(), 400, "not valid JSON"),
        ("POST", chat_path, "[1, 2]".into(), 400, "JSON object"),
        ("POST", chat_path, "{}".into(), 400, "messages is required"),
        (
            "POST",
            chat_path,
            r#"{"messages": []}"#.into(),
            400,
            "messages is empty",
        ),
        (
            "POST",
            chat_path,
            r#"{"messages": "hi"}"#.into(),
            400,
            "messages",
        ),
        (
            "POST",
            chat_path,
            r#"{"messages": [{"role": "tool", "content": "x"}]}"#.into(),
            400,
            "role \"tool\"",
        ),
        (
            "POST",
            chat_path,
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#.into(),
            400,
            "image_url",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"n": 2})),
            400,
            "n other than 1",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"tools": [{"type": "function"}]})),
            400,
            "tools",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"response_format": {"type": "json_object"}})),
            400,
            "response_format",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"top_logprobs": 2})),
            400,
            "top_logprobs",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            400,
            "top_logprobs",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"frequency_penalty": 0.5})),
            400,
            "frequency_penalty",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"temperature": -1})),
            400,
            "temperature",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"temperature": 3})),
            400,
            "temperature",
        ),
        ("POST", chat_path, chat(json!({"top_p": 0})), 400, "top_p"),
        (
            "POST",
            chat_path,
            chat(json!({"max_tokens": "many"})),
            400,
            "max_tokens",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"max_tokens": -5})),
            400,
            "max_tokens",
        ),
        ("POST", chat_path, chat(json!({"seed": "abc"})), 400, "seed"),
        (
            "POST",
            chat_path,
            chat(json!({"stop": ["a", "b", "c", "d", "e"]})),
            400,
            "stop",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"stream_options": {"include_usage": true}})),
            400,
            "stream_options",
        ),
        (
            "POST",
            chat_path,
            chat(json!({"colour": "blue"})),
            400,
            "unknown field \"colour\"",
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": 42}"#.into(),
            400,
            "prompt must be a string",
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": ["a", "b"]}"#.into(),
            400,
            "prompt must be a string",
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"prompt": ""}"#.into(),
            400,
            "empty",
        ),
        (
            "POST",
            "/v1/completions",
            json!({"prompt": "word ".repeat(9000)}).to_string(),
            400,
            "context holds",
        ),
        (
            "POST",
            "/v1/completions",
            json!({"prompt": "x".repeat(200_000)}).to_string(),
            413,
            "",
        ),
        ("GET", chat_path, String::new(), 405, "method"),
        ("POST", "/v1/nothing", "{}".into(), 404, "no such route"),
        ("GET", "/", String::new(), 404, "no such route"),
    ];
    assert!(cases.len() >= 20);
    for (method, path, body, status, expected) in &cases {
        let (got, response) = server.request(method, path, &[], body.as_bytes());
        let text = String::from_utf8_lossy(&response);
        assert_eq!(got, *status, "{method} {path} {body:.80}: {text}");
        let v: Value =
            serde_json::from_slice(&response).unwrap_or_else(|_| panic!("not JSON: {text}"));
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{text}"));
        assert!(v["error"]["type"].is_string(), "{text}");
        assert!(message.contains(expected), "{body:.80}: {message}");
        // Still serving.
        let (status, v) = server.post(chat_path, &chat_body("Hi", 2, false));
        assert_eq!(status, 200, "after {body:.80}: {v}");
    }
}

/// With `--api-key`, the /v1 routes need it (401 in the envelope otherwise); health does not.
#[test]
fn api_key_is_required() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--api-key", "sesame"]);
    let body = chat_body("Hi", 2, false).to_string();
    for headers in [&[][..], &["Authorization: Bearer wrong"][..]] {
        let (status, response) =
            server.request("POST", "/v1/chat/completions", headers, body.as_bytes());
        assert_eq!(status, 401);
        let v: Value = serde_json::from_slice(&response).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    let ok = ["Authorization: Bearer sesame"];
    assert_eq!(
        server
            .request("POST", "/v1/chat/completions", &ok, body.as_bytes())
            .0,
        200
    );
    assert_eq!(server.request("GET", "/v1/models", &ok, b"").0, 200);
}

/// A client that disconnects mid-stream is cancelled: the engine has nothing running soon
/// after, and the next request is served.
#[test]
fn a_client_that_leaves_is_cancelled() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4000, "stream": true, "temperature": 0.8});
    let running = || {
        let (_, metrics) = server.get("/metrics");
        let metrics = String::from_utf8(metrics).unwrap();
        let line = metrics
            .lines()
            .find(|l| l.starts_with("runtime_requests_running "))
            .unwrap()
            .to_string();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    let body = body.to_string();
    {
        let mut stream = TcpStream::connect(&server.address).unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        // Leave once text is flowing: the request is running, not just queued.
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("\"text\"") {
            let n = stream.read(&mut buffer).unwrap();
            assert!(n > 0, "the stream ended early");
            seen.extend_from_slice(&buffer[..n]);
        }
        assert_eq!(running(), 1);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while running() != 0 {
        assert!(
            Instant::now() < deadline,
            "still generating for a client that left"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        server
            .post("/v1/chat/completions", &chat_body("Hi", 2, false))
            .0,
        200
    );
}

/// SIGTERM: the request under way is answered in full, then the server exits 0.
#[test]
fn sigterm_finishes_the_work_under_way() {
    let Some(dir) = artifact_dir() else { return };
    let mut server = Server::start(&dir, &[]);
    std::thread::scope(|s| {
        let answer = s.spawn(|| {
            server.post(
                "/v1/completions",
                &json!({"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0}),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        let killed = Command::new("kill")
            .args(["-TERM", &server.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let (status, v) = answer.join().unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 150);
    });
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// The official `openai` Python client against the server (`openai_client.py`), when
/// python3 has it; `REQUIRE_OPENAI=1` (CI) makes its absence a failure.
#[test]
fn openai_python_client() {
    let Some(dir) = artifact_dir() else { return };
    let has_client = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_client {
        assert!(
            std::env::var_os("REQUIRE_OPENAI").is_none(),
            "python3 has no openai package"
        );
        return;
    }
    let server = Server::start(&dir, &["--api-key", "sesame"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let out = Command::new("python3")
        .args([script, &format!("http://{}/v1", server.address), "sesame"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The next turn of a conversation starts from the kept cache: `cached_tokens` covers the
/// history, and the answer is the one a fresh server gives.
#[test]
fn the_next_turn_reuses_the_cache() {
    let Some(dir) = artifact_dir() else { return };
    let history = "The quick brown fox jumps over the lazy dog. ".repeat(100);
    let first_turn = json!([
        {"role": "system", "content": history},
        {"role": "user", "content": "Summarize the text in five words."},
    ]);
    let ask = |server: &Server, messages: &Value| {
        let body = json!({"messages": messages, "temperature": 0, "max_tokens": 12});
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        v
    };
    let server = Server::start(&dir, &["--parallel", "2"]);
    let first = ask(&server, &first_turn);
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 900, "{prompt_tokens}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let answer = first["choices"][0]["message"]["content"].clone();
    let mut second_turn = first_turn.as_array().unwrap().clone();
    second_turn.push(json!({"role": "assistant", "content": answer}));
    second_turn.push(json!({"role": "user", "content": "Now in three words."}));
    let second_turn = Value::Array(second_turn);
    let second = ask(&server, &second_turn);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= prompt_tokens,
        "{cached} of {prompt_tokens} cached"
    );
    let fresh = ask(&Server::start(&dir, &[]), &second_turn);
    assert_eq!(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        second["choices"][0]["message"],
        fresh["choices"][0]["message"]
    );
}
