//! What the server tests share: the real binary started on a free port, requests over plain
//! `TcpStream` (HTTP/1.1, `Connection: close`) so that a test sees exactly the status and body
//! the server sends, and the command line's answer to compare with.
#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub fn artifact_dir() -> Option<String> {
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
pub struct Server {
    pub child: Child,
    pub address: String,
}

impl Server {
    pub fn start(dir: &str, extra: &[&str]) -> Self {
        Self::spawn(Command::new(env!("CARGO_BIN_EXE_runtime")), dir, 0, extra)
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[&str],
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.address,
            body.len()
        );
        let typed = (headers.iter()).any(|h| h.to_ascii_lowercase().starts_with("content-type:"));
        if !typed {
            head.push_str("Content-Type: application/json\r\n");
        }
        for header in headers {
            head.push_str(header);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        // A body over the limit is refused before it is read: the write may then fail.
        let _ = stream.write_all(body);
        // A hung server fails the test instead of hanging the suite.
        stream.set_read_timeout(Some(SILENCE_LIMIT)).unwrap();
        let mut response = Vec::new();
        if let Err(e) = stream.read_to_end(&mut response)
            && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
        {
            panic!(
                "{method} {path}: {} said nothing for {SILENCE_LIMIT:?}",
                self.address
            );
        }
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

    pub fn get(&self, path: &str) -> (u16, Vec<u8>) {
        self.request("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, body) = self.request("POST", path, &[], body.to_string().as_bytes());
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// A streamed request's `data:` payloads, `[DONE]` included.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let (status, body) = self.request("POST", path, &[], body.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8(body)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

/// Longest a test's request may wait with nothing arriving: far past any answer's slowest
/// prefill on a busy machine, short of hanging CI.
const SILENCE_LIMIT: Duration = Duration::from_secs(120);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs cli/tests/openai_client.py (the official `openai` Python client) against `server`
/// with the API key `sesame` and `mode`'s extra arguments, and fails with its output if it
/// fails. Skipped when python3 has no `openai` package, unless `REQUIRE_OPENAI` is set (CI),
/// which makes its absence a failure.
pub fn run_openai_client(server: &Server, mode: &[&str]) {
    run_client(
        "openai_client.py",
        &format!("http://{}/v1", server.address),
        mode,
    );
}

/// Whether python3 has the `openai` package; its absence fails under `REQUIRE_OPENAI`.
pub fn has_openai_client() -> bool {
    has_package("openai", "REQUIRE_OPENAI")
}

/// Runs cli/tests/anthropic_client.py (the official `anthropic` Python client) as
/// [`run_openai_client`] runs OpenAI's; `REQUIRE_ANTHROPIC` makes its absence a failure.
pub fn run_anthropic_client(server: &Server, mode: &[&str]) {
    run_client(
        "anthropic_client.py",
        &format!("http://{}", server.address),
        mode,
    );
}

/// Whether python3 has the `anthropic` package; its absence fails under `REQUIRE_ANTHROPIC`.
pub fn has_anthropic_client() -> bool {
    has_package("anthropic", "REQUIRE_ANTHROPIC")
}

/// Runs cli/tests/`script` with the server's `base_url`, the API key `sesame` and `mode`,
/// and fails with its output if it fails.
pub fn run_client(script: &str, base_url: &str, mode: &[&str]) {
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .args([&script, base_url, "sesame"])
        .args(mode)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether python3 can import `package`; with the environment variable `required` set (CI),
/// its absence is a failure instead of a skip.
pub fn has_package(package: &str, required: &str) -> bool {
    let has_package = Command::new("python3")
        .args(["-c", &format!("import {package}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_package || std::env::var_os(required).is_none(),
        "python3 has no {package} package"
    );
    has_package
}

pub fn dechunk(mut body: &[u8]) -> Vec<u8> {
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

/// The path of one of runtime's test chat templates (runtime/tests/data/chat-tools).
pub fn template(name: &str) -> String {
    format!(
        "{}/../runtime/tests/data/chat-tools/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A stream's server-sent events as the Messages and Responses APIs name them: each one's
/// `event:` name and its JSON data, checked to name the same `type`. Comments (a wait for a
/// slot) are left out.
pub fn named_events(text: &str) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            (block.lines()).find_map(|l| l.strip_prefix(name)?.strip_prefix(": ").map(String::from))
        };
        let (Some(name), Some(data)) = (field("event"), field("data")) else {
            assert!(block.starts_with(':'), "not an event: {block:?}");
            continue;
        };
        let data: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(data["type"], name.as_str(), "{block}");
        events.push((name, data));
    }
    events
}

pub fn chat_body(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": max_tokens, "stream": stream,
    })
}

/// The command line's greedy chat answer.
pub fn cli_answer(dir: &str, prompt: &str, max_tokens: usize) -> String {
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

impl Server {
    /// `runtime serve` with its open-file limit (soft and hard) set to `open_files`.
    pub fn start_with_open_files(dir: &str, extra: &[&str], open_files: u32) -> Self {
        let mut shell = Command::new("sh");
        shell
            .args([
                "-c",
                &format!("ulimit -n {open_files} && exec \"$@\""),
                "sh",
            ])
            .arg(env!("CARGO_BIN_EXE_runtime"));
        Self::spawn(shell, dir, 0, extra)
    }

    /// Runs `program serve` on `port` (0: a free one) with `extra` options, then waits for
    /// its address line and for `/health` to answer 200.
    fn spawn(mut program: Command, dir: &str, port: u16, extra: &[&str]) -> Self {
        // One thread unless a test asks for more: the suite runs servers side by side, and
        // a server's decoding threads spin between regions (`kernels::team`), so two servers
        // of two threads on two cores would slow each other far past their timeouts.
        let threads: &[&str] = match extra.contains(&"--threads") {
            true => &[],
            false => &["--threads", "1"],
        };
        let mut child = program
            .args(["serve", "--port", &port.to_string(), "--artifacts", dir])
            .args(threads)
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

    /// Sends `bytes` as they are and reads the answer until the server closes (at most
    /// `wait`): `None` if it neither answered nor closed by then.
    pub fn raw(&self, bytes: &[u8], wait: Duration) -> Option<RawResponse> {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        let _ = stream.write_all(bytes);
        read_response(&mut stream, wait)
    }

    /// SIGTERM.
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Waits at most `wait` for the server to exit; its status, or `None` if still running.
    pub fn wait_exit(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A response as sent: status, head (lowercased), body (de-chunked).
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The body as JSON (`Value::Null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads until the server closes the connection or `wait` passes; parses what came if it
/// holds a whole head. `None` if nothing parseable arrived.
pub fn read_response(stream: &mut TcpStream, wait: Duration) -> Option<RawResponse> {
    let deadline = Instant::now() + wait;
    let mut received = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(_) => break,
        }
    }
    parse_response(&received)
}

/// The first response in `bytes`, if a whole head is there.
pub fn parse_response(bytes: &[u8]) -> Option<RawResponse> {
    let split = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&bytes[..split]).to_ascii_lowercase();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let mut body = bytes[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Some(RawResponse { status, head, body })
}

impl Server {
    /// `runtime serve` on `port` (a replica restarted at the address a load balancer has for
    /// it), then waits for its address line and for `/health` to answer 200.
    pub fn start_on_port(dir: &str, port: u16, extra: &[&str]) -> Self {
        Self::spawn(
            Command::new(env!("CARGO_BIN_EXE_runtime")),
            dir,
            port,
            extra,
        )
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        let port = self.address.rsplit(':').next().unwrap();
        port.parse().unwrap()
    }
}

/// One request over a new connection to `address` (`Connection: close`), with `Host:
/// address` unless `headers` give a `Host`; `None` if no whole response came within `wait`.
pub fn request_to(
    address: &str,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &[u8],
    wait: Duration,
) -> Option<RawResponse> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("host:"))
    {
        head.push_str(&format!("Host: {address}\r\n"));
    }
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(address).ok()?;
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    read_response(&mut stream, wait)
}

/// A counter or gauge from `runtime serve`'s `/metrics` at `address`.
/// Waits until the server at `address` runs `n` requests (its `runtime_requests_running`,
/// which counts a request from its admission, prefill included): what a test that needs a
/// request under way waits for, instead of sleeping and hoping. Panics after a minute.
pub fn wait_until_running(address: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(address, "runtime_requests_running") != n {
        assert!(
            Instant::now() < deadline,
            "{address} never ran {n} requests"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn metric(address: &str, name: &str) -> u64 {
    let response = request_to(
        address,
        "GET",
        "/metrics",
        &[],
        b"",
        Duration::from_secs(10),
    )
    .unwrap_or_else(|| panic!("no /metrics from {address}"));
    let text = String::from_utf8_lossy(&response.body);
    let line = (text.lines())
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line.trim().parse().unwrap()
}
