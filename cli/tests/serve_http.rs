//! `runtime serve`'s HTTP transport under slow, idle, hostile and browser clients, through
//! real sockets: deadlines on heads, bodies and idle connections (and none on responses); a
//! cap on connections that keeps `/health` answering through a flood; shutdown within its
//! deadline; JSON-only bodies; `Origin` and `Host` checks with CORS for allowed origins; the
//! body limit from `Content-Length`; the error envelope on hyper's own errors; an empty API
//! key refused at start.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use common::{RawResponse, Server, artifact_dir, chat_body, parse_response, read_response};

const CHAT: &str = "/v1/chat/completions";
/// A prompt the model continues greedily for thousands of tokens without stopping.
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";

/// A request's bytes: `headers` after `Host`, then `Content-Length` if there is a body.
fn request_bytes(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        server.address
    );
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

fn send(server: &Server, method: &str, path: &str, headers: &[&str], body: &str) -> RawResponse {
    let bytes = request_bytes(server, method, path, headers, body);
    server
        .raw(&bytes, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no answer to {method} {path} {headers:?}"))
}

/// Asserts an error response in OpenAI's envelope, and returns its message.
fn assert_envelope(response: &RawResponse, status: u16) -> String {
    let text = String::from_utf8_lossy(&response.body);
    assert_eq!(response.status, status, "{}\n{text}", response.head);
    assert!(
        response.head.contains("content-type: application/json"),
        "{}",
        response.head
    );
    let v = response.json();
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no envelope: {text}"));
    assert!(
        v["error"]["type"].is_string() && !message.is_empty(),
        "{text}"
    );
    message.to_string()
}

/// How long until the server closes `stream` (reads EOF or an error), at most `wait`.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buffer = [0u8; 1024];
    stream.set_read_timeout(Some(wait)).unwrap();
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(_) => return Some(start.elapsed()),
        }
        if start.elapsed() > wait {
            return None;
        }
    }
}

/// A connection that says nothing, and one kept alive after a response, are closed at the
/// read timeout.
#[test]
fn silent_and_idle_connections_are_closed_at_the_read_timeout() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--read-timeout", "1"]);
    let mut silent = TcpStream::connect(&server.address).unwrap();
    let after = closed_within(&mut silent, Duration::from_secs(5))
        .expect("a silent connection stayed open");
    assert!(
        after >= Duration::from_millis(800),
        "closed after {after:?}, before the timeout"
    );

    let mut kept = TcpStream::connect(&server.address).unwrap();
    let head = format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", server.address);
    kept.write_all(head.as_bytes()).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 1024];
    while !String::from_utf8_lossy(&received).contains("\"ok\"") {
        let n = kept.read(&mut buffer).unwrap();
        assert!(n > 0, "closed before answering");
        received.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(parse_response(&received).unwrap().status, 200);
    let after = closed_within(&mut kept, Duration::from_secs(5))
        .expect("an idle kept-alive connection stayed open");
    assert!(
        after >= Duration::from_millis(800),
        "closed after {after:?}"
    );
}

/// A head or a body sent a few bytes at a time, never finishing, is cut at the read timeout
/// however often bytes arrive: the head by closing, the body with 408.
#[test]
fn dribbled_heads_and_bodies_are_cut_at_the_read_timeout() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--read-timeout", "1"]);
    let dribble = |start: String, piece: &str| {
        let mut stream = TcpStream::connect(&server.address).unwrap();
        stream.write_all(start.as_bytes()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        let began = Instant::now();
        let mut received = Vec::new();
        let mut buffer = [0u8; 1024];
        while began.elapsed() < Duration::from_secs(10) {
            if stream.write_all(piece.as_bytes()).is_err() {
                break;
            }
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        (began.elapsed(), received)
    };
    let head = format!("GET /health HTTP/1.1\r\nHost: {}\r\n", server.address);
    // Cut near the 1 s timeout; 5 s leaves room for a busy machine, and a dribbler never
    // cut is held for the whole 10 s.
    let (after, received) = dribble(head, "X-Slow: 1\r\n");
    assert!(
        after < Duration::from_secs(5),
        "a dribbled head was held {after:?}"
    );
    assert!(
        received.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&received)
    );

    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{",
        server.address
    );
    let (after, received) = dribble(head, " ");
    assert!(
        after < Duration::from_secs(5),
        "a dribbled body was held {after:?}"
    );
    let response = parse_response(&received).expect("no response to a dribbled body");
    let message = assert_envelope(&response, 408);
    assert!(message.contains("did not arrive"), "{message}");
}

/// The read timeout bounds what the client sends, not what the server sends: a response
/// streamed for longer than it is delivered in full.
#[test]
fn a_stream_longer_than_the_read_timeout_is_not_cut() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--read-timeout", "1"]);
    let started = Instant::now();
    let body = json!({"prompt": COUNTING, "max_tokens": 300, "temperature": 0, "stream": true});
    let events = server.stream("/v1/completions", &body);
    let took = started.elapsed();
    assert!(
        took > Duration::from_millis(1500),
        "the stream took only {took:?}: no test of the timeout"
    );
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
}

/// Opens connections that send nothing or dribble a head, forever; returns when `stop`.
fn flood(address: &str, stop: &AtomicBool, per_round: usize) -> usize {
    let mut open: Vec<TcpStream> = Vec::new();
    let mut opened = 0;
    let mut round = 0;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..per_round {
            let Ok(mut stream) = TcpStream::connect(address) else {
                continue;
            };
            if i % 2 == 1 {
                let _ = stream
                    .write_all(format!("POST {CHAT} HTTP/1.1\r\nHost: {address}\r\n").as_bytes());
            }
            open.push(stream);
            opened += 1;
        }
        // The dribblers' next byte.
        for stream in open.iter_mut().skip(round % 2).step_by(2) {
            let _ = stream.write_all(b"X");
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    opened
}

/// `/health` answered in full within `within`, on a fresh connection.
fn health_within(address: &str, within: Duration) -> Result<(), String> {
    let started = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&address.parse().unwrap(), within).map_err(|e| e.to_string())?;
    let head = format!("GET /health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(|e| e.to_string())?;
    let left = within.saturating_sub(started.elapsed());
    match read_response(&mut stream, left) {
        Some(response) if response.status == 200 => Ok(()),
        other => Err(format!("{other:?} after {:?}", started.elapsed())),
    }
}

/// With the server's file descriptors nearly all taken by idle and dribbling connections,
/// and more arriving all the time, `/health` is answered throughout: at the cap (from the
/// open-file limit, 200 here) a new connection closes the longest-waiting one that has no
/// request under way. Without that, a probe waits for a flood connection's read timeout
/// (30 s); each must be answered within 5 s (well under a second on an idle machine; the
/// rest is room for a busy one).
#[test]
fn health_answers_through_a_flood_of_idle_and_dribbling_connections() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start_with_open_files(&dir, &[], 200);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let flooding = s.spawn(|| flood(&server.address, &stop, 40));
        std::thread::sleep(Duration::from_millis(700));
        let mut probes = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            probes.push(health_within(&server.address, Duration::from_secs(5)));
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
        let failed: Vec<_> = probes.iter().filter_map(|p| p.as_ref().err()).collect();
        let probed = probes.len();
        assert!(
            failed.is_empty(),
            "{} of {probed} probes failed: {failed:?}",
            failed.len()
        );
        let opened = flooding.join().unwrap();
        assert!(opened >= 400, "only {opened} flood connections: no flood");
    });
    // A generation is still served afterwards.
    assert_eq!(server.post(CHAT, &chat_body("Hi", 2, false)).0, 200);
}

/// A connection asking for a long streamed completion (8000 tokens of counting: longer than
/// any of the tests' waits, at any speed).
fn long_stream(server: &Server) -> TcpStream {
    let body = json!({"prompt": COUNTING, "max_tokens": 8000, "temperature": 0, "stream": true})
        .to_string();
    let mut stream = TcpStream::connect(&server.address).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.address,
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// SIGTERM with idle and dribbling connections open and a long stream under way: the stream
/// goes on until the shutdown deadline, then everything is closed and the server exits 0.
#[test]
fn sigterm_exits_within_the_shutdown_deadline() {
    let Some(dir) = artifact_dir() else { return };
    let mut server = Server::start(&dir, &["--shutdown-timeout", "2"]);
    let mut held: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut stream = TcpStream::connect(&server.address).unwrap();
            if i % 3 == 1 {
                let _ = stream.write_all(b"GET /health HTTP/1.1\r\nX-Slow: ");
            } else if i % 3 == 2 {
                let head = format!("POST {CHAT} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{", server.address);
                let _ = stream.write_all(head.as_bytes());
            }
            stream
        })
        .collect();
    let mut streamed = long_stream(&server);
    let mut buffer = [0u8; 65536];
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains("\"text\"") {
        let n = streamed.read(&mut buffer).unwrap();
        assert!(n > 0, "the stream ended early");
        received.extend_from_slice(&buffer[..n]);
    }

    server.terminate();
    let signalled = Instant::now();
    for stream in held.iter_mut().step_by(3) {
        let _ = stream.write_all(b"x");
    }
    // The stream goes on after the signal.
    let before = received.len();
    streamed
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    while received.len() == before || signalled.elapsed() < Duration::from_millis(500) {
        match streamed.read(&mut buffer) {
            Ok(n) if n > 0 => received.extend_from_slice(&buffer[..n]),
            _ => break,
        }
    }
    assert!(received.len() > before, "the stream stopped at the signal");
    // At the 2 s deadline: the 8000-token stream would go on far longer. 10 s leaves room
    // for a busy machine to close 300 connections and exit.
    let status = server.wait_exit(Duration::from_secs(10));
    let took = signalled.elapsed();
    let status = status
        .unwrap_or_else(|| panic!("still running {took:?} after SIGTERM with a 2 s deadline"));
    assert!(status.success(), "{status}");
    assert!(
        took >= Duration::from_millis(1800),
        "exited after {took:?}, before the deadline"
    );
    assert!(
        !String::from_utf8_lossy(&received).contains("[DONE]"),
        "the 8000-token stream finished"
    );
}

/// A second SIGTERM while requests under way are given their time stops the server at once.
#[test]
fn a_second_sigterm_exits_at_once() {
    let Some(dir) = artifact_dir() else { return };
    let mut server = Server::start(&dir, &["--shutdown-timeout", "60"]);
    let mut streamed = long_stream(&server);
    let mut buffer = [0u8; 4096];
    assert!(streamed.read(&mut buffer).unwrap() > 0);
    server.terminate();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        server.wait_exit(Duration::ZERO).is_none(),
        "exited at the first signal with a stream under way"
    );
    server.terminate();
    // Not the 60 s given to requests under way: at once, with room for a busy machine.
    let status = server.wait_exit(Duration::from_secs(10));
    let status = status.expect("still running 10 s after a second SIGTERM");
    assert!(status.success(), "{status}");
}

/// POST bodies must be declared JSON (charset and other parameters allowed): 415 otherwise,
/// so that a browser's form or `text/plain` POST (no CORS preflight) runs nothing.
#[test]
fn only_json_bodies_are_accepted() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let body = chat_body("Hi", 2, false).to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        None,
    ] {
        let headers: Vec<String> = content_type
            .iter()
            .map(|t| format!("Content-Type: {t}"))
            .collect();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        let response = send(&server, "POST", CHAT, &headers, &body);
        let message = assert_envelope(&response, 415);
        assert!(message.contains("application/json"), "{message}");
    }
    for content_type in ["application/json; charset=utf-8", "Application/JSON"] {
        let header = format!("Content-Type: {content_type}");
        let response = send(&server, "POST", CHAT, &[&header], &body);
        assert_eq!(
            response.status,
            200,
            "{content_type}: {:?}",
            response.json()
        );
    }
}

/// A request from a browser page of another origin is refused (403), on every route; the
/// server's own origin and `--allowed-origin`s are served, those with CORS headers and
/// their preflight answered; `*` allows any origin.
#[test]
fn foreign_origins_are_refused_unless_allowed() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--allowed-origin", "http://app.example:3000"]);
    let body = chat_body("Hi", 2, false).to_string();
    let json = "Content-Type: application/json";
    for (method, path, body) in [
        ("POST", CHAT, body.as_str()),
        ("GET", "/health", ""),
        ("GET", "/v1/models", ""),
    ] {
        let response = send(
            &server,
            method,
            path,
            &["Origin: http://evil.example", json],
            body,
        );
        let message = assert_envelope(&response, 403);
        assert!(message.contains("evil.example"), "{message}");
        assert!(
            !response.head.contains("access-control-allow-origin"),
            "{}",
            response.head
        );
    }
    let preflight = [
        "Origin: http://evil.example",
        "Access-Control-Request-Method: POST",
        "Access-Control-Request-Headers: authorization, content-type",
    ];
    assert_envelope(&send(&server, "OPTIONS", CHAT, &preflight, ""), 403);

    let own = format!("Origin: http://{}", server.address);
    let response = send(&server, "POST", CHAT, &[&own, json], &body);
    assert_eq!(response.status, 200, "{:?}", response.json());

    let allowed = "Origin: http://app.example:3000";
    let response = send(&server, "POST", CHAT, &[allowed, json], &body);
    assert_eq!(response.status, 200, "{:?}", response.json());
    assert!(
        response
            .head
            .contains("access-control-allow-origin: http://app.example:3000"),
        "{}",
        response.head
    );
    let preflight = [allowed, preflight[1], preflight[2]];
    let response = send(&server, "OPTIONS", CHAT, &preflight, "");
    assert_eq!(response.status, 204, "{}", response.head);
    for expected in [
        "access-control-allow-origin: http://app.example:3000",
        "access-control-allow-methods: get, post, options",
        "access-control-allow-headers: authorization, content-type",
    ] {
        assert!(
            response.head.contains(expected),
            "{expected} not in {}",
            response.head
        );
    }
    drop(server);

    let any = Server::start(&dir, &["--allowed-origin", "*"]);
    let response = send(
        &any,
        "POST",
        CHAT,
        &["Origin: http://evil.example", json],
        &body,
    );
    assert_eq!(response.status, 200, "{:?}", response.json());
    assert!(
        response
            .head
            .contains("access-control-allow-origin: http://evil.example"),
        "{}",
        response.head
    );
}

/// Behind a proxy that ends TLS, a page's origin is `https://` + Host: its own when the
/// proxy is a `--trusted-proxy` and says `X-Forwarded-Proto: https`; the header from any
/// other peer is ignored (a client could claim any scheme), and a trusted proxy saying
/// `http` makes only `http://` the server's own.
#[test]
fn a_trusted_proxys_forwarded_scheme_makes_https_pages_same_origin() {
    let Some(dir) = artifact_dir() else { return };
    let body = chat_body("Hi", 1, false).to_string();
    let json = "Content-Type: application/json";
    let status = |server: &Server, origin_scheme: &str, forwarded: Option<&str>| {
        let origin = format!("Origin: {origin_scheme}://{}", server.address);
        let forwarded = forwarded.map(|scheme| format!("X-Forwarded-Proto: {scheme}"));
        let mut headers = vec![origin.as_str(), json];
        headers.extend(forwarded.as_deref());
        let response = send(server, "POST", CHAT, &headers, &body);
        if response.status == 403 {
            let message = assert_envelope(&response, 403);
            assert!(message.contains("--trusted-proxy"), "{message}");
        }
        response.status
    };
    // The tests' requests come from 127.0.0.1: trusted here, not below.
    let trusting = Server::start(&dir, &["--trusted-proxy", "127.0.0.1"]);
    assert_eq!(status(&trusting, "https", Some("https")), 200);
    assert_eq!(status(&trusting, "https", Some("HTTPS, http")), 200);
    assert_eq!(status(&trusting, "https", Some("http")), 403);
    assert_eq!(status(&trusting, "https", None), 403);
    assert_eq!(status(&trusting, "http", Some("https")), 403);
    assert_eq!(status(&trusting, "http", None), 200);
    drop(trusting);

    let elsewhere = Server::start(&dir, &["--trusted-proxy", "10.1.2.3"]);
    assert_eq!(status(&elsewhere, "https", Some("https")), 403);
    assert_eq!(status(&elsewhere, "http", Some("https")), 200);
}

/// Bound to a loopback address, the server answers only requests whose `Host` names a
/// loopback address on its port (or no port), or an `--allowed-host`: a page that rebinds
/// its name to 127.0.0.1 is refused. Bound to all addresses, any `Host` is served.
#[test]
fn host_must_name_the_loopback_server() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--allowed-host", "proxy.example"]);
    let port = server.address.rsplit(':').next().unwrap().to_string();
    let get = |host: &str| {
        let bytes = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        server
            .raw(bytes.as_bytes(), Duration::from_secs(10))
            .unwrap()
    };
    for host in [
        format!("evil.example:{port}"),
        "localhost:1".into(),
        "evil.example".into(),
        format!("10.1.2.3:{port}"),
    ] {
        let message = assert_envelope(&get(&host), 403);
        assert!(message.contains(&host), "{message}");
    }
    for host in [
        format!("localhost:{port}"),
        "localhost".into(),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "proxy.example".into(),
    ] {
        assert_eq!(get(&host).status, 200, "{host}");
    }
    drop(server);

    let all = Server::start(&dir, &["--host", "0.0.0.0"]);
    let bytes = b"GET /health HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n";
    assert_eq!(all.raw(bytes, Duration::from_secs(10)).unwrap().status, 200);
}

/// A `Content-Length` over the limit is refused at once, before any of the body is sent, and
/// `Expect: 100-continue` with such a length gets that 413 rather than `100 Continue`.
#[test]
fn an_oversized_body_is_refused_from_its_content_length() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    for expect in [&[][..], &["Expect: 100-continue"][..]] {
        let mut head = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n",
            server.address
        );
        for header in expect {
            head.push_str(&format!("{header}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = TcpStream::connect(&server.address).unwrap();
        stream.write_all(head.as_bytes()).unwrap();
        let started = Instant::now();
        let response = read_response(&mut stream, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no answer to an oversized length {expect:?}"));
        // Not after the body (the read timeout, 30 s): at once, with room for a busy machine.
        assert!(started.elapsed() < Duration::from_secs(5));
        let message = assert_envelope(&response, 413);
        assert_eq!(
            response.json()["error"]["code"],
            "request_too_large",
            "{message}"
        );
    }
    // Within the limit, `Expect: 100-continue` still gets `100 Continue`, then the answer.
    let body = chat_body("Hi", 2, false).to_string();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        server.address,
        body.len()
    );
    let mut stream = TcpStream::connect(&server.address).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut interim = [0u8; 25];
    stream.read_exact(&mut interim).unwrap();
    assert!(
        interim.starts_with(b"HTTP/1.1 100 Continue"),
        "{:?}",
        String::from_utf8_lossy(&interim)
    );
    stream.write_all(body.as_bytes()).unwrap();
    assert_eq!(
        read_response(&mut stream, Duration::from_secs(30))
            .unwrap()
            .status,
        200
    );
}

/// hyper answers what it cannot parse before any of our code runs; those answers carry the
/// envelope too: a malformed request line (400), a URI over 64 KiB (414), a head over
/// 80 KiB or with over 100 fields (431).
#[test]
fn errors_hyper_makes_carry_the_envelope() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    let host = format!("Host: {}", server.address);
    let many_fields: String = (0..150).map(|i| format!("X-Field-{i}: {i}\r\n")).collect();
    let cases = [
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            format!("GET /health HTTP/1.1\r\n{host}\r\nBad Header\r\n\r\n").into_bytes(),
            400,
        ),
        (
            format!("GET /{} HTTP/1.1\r\n{host}\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            414,
        ),
        (
            format!(
                "GET /health HTTP/1.1\r\n{host}\r\nX-Big: {}\r\n\r\n",
                "b".repeat(100_000)
            )
            .into_bytes(),
            431,
        ),
        (
            format!("GET /health HTTP/1.1\r\n{host}\r\n{many_fields}\r\n").into_bytes(),
            431,
        ),
    ];
    for (bytes, status) in cases {
        let response = server
            .raw(&bytes, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no answer for {status}"));
        assert_envelope(&response, status);
    }
    assert_eq!(server.get("/health").0, 200);
}

/// `--api-key ''` (or one no client could send) is refused at start with one `error:` line,
/// as is an `--allowed-origin` that is not an origin; neither needs the model.
#[test]
fn unusable_credentials_and_origins_are_refused_at_start() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../artifacts/smollm2-135m-instruct");
    for (args, expected) in [
        (&["--api-key", ""][..], "--api-key"),
        (&["--api-key", "  "][..], "--api-key"),
        (&["--api-key", " sesame"][..], "--api-key"),
        (
            &["--allowed-origin", "localhost:3000"][..],
            "--allowed-origin",
        ),
        (&["--trusted-proxy", "proxy.example"][..], "--trusted-proxy"),
        (&["--served-model-name", " "][..], "--served-model-name"),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_runtime"))
            .args(["serve", "--port", "0", "--artifacts"])
            .arg(&dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?} was accepted: still serving after 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(!status.success(), "{args:?}");
        // clap's own refusals add a blank line and its pointer to --help.
        let lines: Vec<&str> = (stderr.lines())
            .filter(|l| !l.is_empty() && !l.starts_with("For more information, try"))
            .collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(expected),
            "{args:?}: {stderr}"
        );
    }
}

/// `--max-connections 4`: with four idle connections open, a fifth is still answered, and
/// the connection that waited longest is the one closed for it.
#[test]
fn at_max_connections_the_longest_idle_connection_makes_room() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--max-connections", "4"]);
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(&server.address).unwrap());
        // Accepted in this order: the first is the longest waiting.
        std::thread::sleep(Duration::from_millis(50));
    }
    let response = server.raw(
        format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            server.address
        )
        .as_bytes(),
        Duration::from_secs(10),
    );
    assert_eq!(response.map(|r| r.status), Some(200));
    // The oldest idle connection was closed by the server: a read sees its end at once.
    let mut oldest = idle.remove(0);
    oldest
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    let closed = match oldest.read(&mut byte) {
        Ok(n) => n == 0,
        // A reset is a close; a timeout means it is still open.
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(closed, "the oldest idle connection is still open");
    // The others are still open: a request on the newest is answered.
    let mut newest = idle.pop().unwrap();
    let request = format!(
        "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        server.address
    );
    newest.write_all(request.as_bytes()).unwrap();
    let answer = read_response(&mut newest, Duration::from_secs(10)).map(|r| r.status);
    assert_eq!(answer, Some(200));
}
