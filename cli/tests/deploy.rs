//! Several `runtime serve` replicas behind one address (docs/DEPLOY.md): two replicas of the
//! real binary and nginx running the committed deploy/nginx.conf, all on loopback.
//!
//! - A conversation stays on one replica: its second turn reports its whole first prompt
//!   cached, with the conversation's header and without one (the client's address).
//! - Streams pass through event by event, and a client that leaves mid-stream cancels its
//!   generation; the replicas' Host and Origin checks still refuse foreign names and pages
//!   through the proxy; with TLS ended at nginx (the config's commented `listen ... ssl`,
//!   a test certificate), a page at `https://` + the address is same-origin, since nginx
//!   sets `X-Forwarded-Proto` and the replicas trust it (`--trusted-proxy`).
//! - A replica stopped with SIGTERM while clients send requests finishes the requests it has,
//!   the new ones go to the other replica, and every request is answered once: none lost,
//!   none run on both replicas.
//! - A replica restarted at its address gets its conversations back; a request in flight
//!   on a replica killed with SIGKILL fails with 502 and is not run again on the other.
//!
//! The replicas serve the same model from two directories (symbolic links) named
//! `replica-a` and `replica-b`: a response's `model` then names the replica that generated
//! it, and `GET /v1/models` (which runs nothing) tells which replica a conversation id is
//! sent to. Skipped without the converted model (unless REQUIRE_MODEL is set) or without
//! nginx (unless REQUIRE_NGINX is set).

mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{RawResponse, Server, artifact_dir, metric, request_to};

const CHAT: &str = "/v1/chat/completions";
const A: &str = "replica-a";
const B: &str = "replica-b";
/// How long any one answer may take.
const WAIT: Duration = Duration::from_secs(60);
/// A prompt the model continues greedily for thousands of tokens without stopping.
const COUNTING: &str = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";
/// The replicas' options: one thread each (two replicas share the machine), the name
/// clients reach nginx by, which nginx passes on as `Host`, and nginx's address, whose
/// `X-Forwarded-Proto` they believe.
const REPLICA_OPTIONS: &[&str] = &[
    "--threads",
    "1",
    "--allowed-host",
    "127.0.0.1",
    "--trusted-proxy",
    "127.0.0.1",
];

#[test]
fn two_replicas_behind_nginx() {
    let Some(model) = artifact_dir() else { return };
    let Some(binary) = nginx_binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let served = |name: &str| {
        let link = dir.path().join(name);
        std::os::unix::fs::symlink(&model, &link).unwrap();
        link.to_string_lossy().into_owned()
    };
    let (dir_a, dir_b) = (served(A), served(B));
    let mut replica_a = Server::start(&dir_a, REPLICA_OPTIONS);
    let replica_b = Server::start(&dir_b, REPLICA_OPTIONS);
    let prefix = dir.path().join("nginx");
    std::fs::create_dir(&prefix).unwrap();
    let nginx = Nginx::start(&binary, &prefix, [&replica_a.address, &replica_b.address]);
    let mut ids = Ids {
        balancer: nginx.address.clone(),
        next: 0,
    };

    conversations_stay_on_their_replica(&nginx, &mut ids);
    streams_pass_event_by_event(&nginx);
    a_client_that_leaves_cancels_its_generation(&nginx, [&replica_a, &replica_b]);
    host_and_origin_are_still_checked(&nginx);
    pages_over_tls_are_same_origin(&nginx);
    // Conversations of A for after its restart: once A has refused a connection, nginx
    // sends every id to B for a while.
    let (returning, killed) = (ids.for_replica(A), ids.for_replica(A));
    sigterm_drains_and_the_other_replica_answers(&nginx, &mut ids, &mut replica_a, &replica_b);

    // A rolling restart: the replica comes back at its address and, once nginx tries it
    // again (fail_timeout after it refused a connection), gets its conversations back.
    let port_a = replica_a.port();
    let mut replica_a = Server::start_on_port(&dir_a, port_a, REPLICA_OPTIONS);
    let deadline = Instant::now() + Duration::from_secs(20);
    while replica_of(&nginx.address, &returning) != A {
        assert!(
            Instant::now() < deadline,
            "nginx did not send {A}'s conversations back to it within 20 s of its restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    sigkill_fails_the_request_under_way_without_retrying_it(
        &nginx,
        &killed,
        &mut replica_a,
        &replica_b,
    );
}

/// Turn two of a conversation (turn one's messages, its answer and a new question, with the
/// same `X-Conversation-Id`) lands on turn one's replica, which has turn one's prompt cached.
/// Every conversation shares the chat template's system prompt, so any replica that served
/// anything reports some cached tokens: the check is that the whole first prompt is cached,
/// which only the replica that ran turn one can report.
fn conversations_stay_on_their_replica(nginx: &Nginx, ids: &mut Ids) {
    let conversations = [
        (
            Some(ids.for_replica(A)),
            A,
            "What is the capital of France?",
            false,
        ),
        (Some(ids.for_replica(B)), B, "Name a large animal.", true),
        // Without the header: the client's address (all of this test's are 127.0.0.1).
        (None, "", "What color is the sky?", false),
    ];
    for (id, replica, question, stream) in conversations {
        let id = id.as_deref();
        let first = json!({
            "messages": [{"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 12,
        });
        let one = answer(&chat(&nginx.address, id, &first));
        if !replica.is_empty() {
            assert_eq!(one.model, replica, "conversation {id:?}: turn one");
        }
        let mut second = json!({
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": one.content},
                {"role": "user", "content": "Say it again in one word."},
            ],
            "temperature": 0, "max_tokens": 8,
        });
        if stream {
            second["stream"] = json!(true);
            second["stream_options"] = json!({"include_usage": true});
        }
        let two = answer(&chat(&nginx.address, id, &second));
        assert_eq!(
            two.model, one.model,
            "conversation {id:?}: turn two went to another replica than turn one"
        );
        assert!(
            two.cached_tokens > 0 && two.cached_tokens >= one.prompt_tokens,
            "conversation {id:?}: turn two has {} tokens cached, turn one's prompt was {}: it \
             did not land where turn one's prefix is kept",
            two.cached_tokens,
            one.prompt_tokens
        );
    }
}

/// A streamed answer arrives event by event through nginx, not at its end: the first event
/// comes well before the last.
fn streams_pass_event_by_event(nginx: &Nginx) {
    let body = json!({"prompt": COUNTING, "max_tokens": 100, "temperature": 0, "stream": true});
    let body = body.to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        nginx.address,
        body.len()
    );
    let mut stream = TcpStream::connect(&nginx.address).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let started = Instant::now();
    let (mut received, mut first_event, mut reads) = (Vec::new(), None, 0);
    let mut buffer = [0u8; 65536];
    loop {
        let n = stream.read(&mut buffer).unwrap();
        if n == 0 {
            break;
        }
        received.extend_from_slice(&buffer[..n]);
        reads += 1;
        if first_event.is_none() && received.windows(6).any(|w| w == b"data: ") {
            first_event = Some(started.elapsed());
        }
    }
    let total = started.elapsed();
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    let first_event = first_event.unwrap();
    assert!(
        first_event < total / 2 && reads > 10,
        "the first event came after {first_event:?} of {total:?}, in {reads} reads: nginx \
         held the stream back"
    );
}

/// A client that goes away mid-stream: nginx closes its connection to the replica, which
/// cancels the generation before its next token (a chat page's stop button).
fn a_client_that_leaves_cancels_its_generation(nginx: &Nginx, replicas: [&Server; 2]) {
    let body = json!({"prompt": COUNTING, "max_tokens": 3000, "temperature": 0, "stream": true});
    let body = body.to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        nginx.address,
        body.len()
    );
    let mut stream = TcpStream::connect(&nginx.address).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while !received.windows(6).any(|w| w == b"data: ") {
        let n = stream.read(&mut buffer).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buffer[..n]);
    }
    let running = || {
        (replicas.iter())
            .map(|r| metric(&r.address, "runtime_requests_running"))
            .sum::<u64>()
    };
    assert_eq!(running(), 1, "the stream is not running");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while running() > 0 {
        assert!(
            Instant::now() < deadline,
            "the generation of a client that left still runs 10 s later"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Through nginx (which passes the client's `Host`), a replica bound to loopback still
/// refuses a foreign `Host` (DNS rebinding) and a foreign page's `Origin`, and serves a
/// page of the address clients use.
fn host_and_origin_are_still_checked(nginx: &Nginx) {
    let get = |headers: &[&str]| {
        request_to(&nginx.address, "GET", "/v1/models", headers, b"", WAIT).unwrap()
    };
    let foreign_host = get(&["Host: rebound.example"]);
    assert_eq!(foreign_host.status, 403, "{}", shown(&foreign_host));
    let same_origin = format!("Origin: http://{}", nginx.address);
    let own_page = get(&[&same_origin]);
    assert_eq!(own_page.status, 200, "{}", shown(&own_page));
    let foreign_page = get(&["Origin: http://elsewhere.example"]);
    assert_eq!(foreign_page.status, 403, "{}", shown(&foreign_page));
}

/// Through nginx's TLS listener a page at `https://` + the address is the replicas' own
/// origin (nginx says `X-Forwarded-Proto: https`), while one at `http://` is not; over
/// plain HTTP a client's own `X-Forwarded-Proto: https` is overwritten by nginx, so it
/// cannot pass an `https://` origin off as the replicas' own.
fn pages_over_tls_are_same_origin(nginx: &Nginx) {
    let tls = &nginx.tls_address;
    assert_eq!(https_get(tls, &format!("https://{tls}")), 200);
    assert_eq!(https_get(tls, &format!("http://{tls}")), 403);
    assert_eq!(https_get(tls, "https://elsewhere.example"), 403);
    let spoofed = [
        &format!("Origin: https://{}", nginx.address)[..],
        "X-Forwarded-Proto: https",
    ];
    let response = request_to(&nginx.address, "GET", "/v1/models", &spoofed, b"", WAIT).unwrap();
    assert_eq!(response.status, 403, "{}", shown(&response));
}

/// The status of `GET /v1/models` over TLS to `address` with a page's `Origin`, by
/// Python's standard library (the certificate is the test's own, not verified).
fn https_get(address: &str, origin: &str) -> u16 {
    let script = "import http.client, ssl, sys\n\
        host, port = sys.argv[1].rsplit(':', 1)\n\
        c = http.client.HTTPSConnection(host, int(port), timeout=60, \
            context=ssl._create_unverified_context())\n\
        c.request('GET', '/v1/models', headers={'Origin': sys.argv[2]})\n\
        print(c.getresponse().status)\n";
    let output = Command::new("python3")
        .args(["-c", script, address, origin])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.trim().parse().unwrap()
}

/// One request's outcome, as its client saw it.
#[derive(Debug)]
struct Outcome {
    id: String,
    /// The replica nginx sent its conversation id to while both were up.
    target: &'static str,
    started: Instant,
    ended: Instant,
    status: u16,
    /// The replica that generated the answer (its `model`), if the answer is whole.
    model: Option<String>,
}

/// Four clients send requests (each its own conversation id and question), two to ids
/// that go to replica A, two to ids that go to B. Once A has answered some and is running
/// one, it gets SIGTERM.
///
/// The accounting, that every request was answered exactly once:
/// - none lost: every client got a 200 with a whole answer (`finish_reason` set) naming the
///   replica that generated it;
/// - none run twice: a request reaches a replica only through nginx, and nginx's log lists
///   every attempt it made for a request with the bytes it sent: 0 when the replica refused
///   the connection (stopped: the request never reached it), more when it got the request.
///   Each request has exactly one attempt that sent anything, to the replica its answer
///   names. The replicas' own counters agree: B, never stopped, generated exactly the
///   requests that name it (`runtime_requests_total` counts every generation that ended,
///   a client's abandoned ones too) and had none abandoned (a request nginx gave up on,
///   say to send it elsewhere, would be); A had generated, just before its SIGTERM, no
///   more than those that name it (its count after the signal cannot be read: its
///   listener is closed, then it exits, so for A nginx's log is the record);
/// - the new requests go to B: every request to an id of A sent after A's port refused
///   connections was answered by B, and there were some; A finished at least one request
///   it had when it got the signal (draining, not cut).
fn sigterm_drains_and_the_other_replica_answers(
    nginx: &Nginx,
    ids: &mut Ids,
    replica_a: &mut Server,
    replica_b: &Server,
) {
    const CLIENTS: [&str; 4] = [A, A, B, B];
    const EACH: usize = 8;
    // Which replica an id goes to is asked before the signal: after it, every id goes to B.
    let plans: Vec<Vec<String>> = (CLIENTS.iter())
        .map(|target| (0..EACH).map(|_| ids.for_replica(target)).collect())
        .collect();
    let total_a = metric(&replica_a.address, "runtime_requests_total");
    let total_b = metric(&replica_b.address, "runtime_requests_total");
    let cancelled_b = metric(&replica_b.address, "runtime_requests_cancelled_total");
    let done_a = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (CLIENTS.iter().zip(plans).enumerate())
        .map(|(client, (&target, plan))| {
            let (balancer, done_a) = (nginx.address.clone(), done_a.clone());
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                for (i, id) in plan.into_iter().enumerate() {
                    let question = format!(
                        "Client {client}, question {i}: what is {client} plus {}?",
                        i + 10
                    );
                    let body = json!({
                        "messages": [{"role": "user", "content": question}],
                        "temperature": 0, "max_tokens": 24,
                    });
                    let started = Instant::now();
                    let response = chat(&balancer, Some(&id), &body);
                    let whole = response.json()["choices"][0]["finish_reason"].is_string();
                    let model = response.json()["model"].as_str().map(str::to_string);
                    outcomes.push(Outcome {
                        id,
                        target,
                        started,
                        ended: Instant::now(),
                        status: response.status,
                        model: model.filter(|_| whole),
                    });
                    if target == A {
                        done_a.fetch_add(1, Ordering::Relaxed);
                    }
                }
                outcomes
            })
        })
        .collect();

    // SIGTERM once A's clients have had answers and A is generating.
    let deadline = Instant::now() + WAIT;
    while done_a.load(Ordering::Relaxed) < 2
        || metric(&replica_a.address, "runtime_requests_running") == 0
    {
        assert!(Instant::now() < deadline, "replica A never got to work");
        std::thread::sleep(Duration::from_millis(2));
    }
    let generated_a = metric(&replica_a.address, "runtime_requests_total") - total_a;
    replica_a.terminate();
    let signalled = Instant::now();
    let closed = wait_refused(&replica_a.address);

    let outcomes: Vec<Outcome> = (clients.into_iter())
        .flat_map(|client| client.join().unwrap())
        .collect();
    let exit = replica_a.wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|status| status.success()),
        "replica A after SIGTERM: {exit:?}"
    );

    // None lost.
    for outcome in &outcomes {
        assert!(
            outcome.status == 200 && outcome.model.is_some(),
            "a request was lost: {outcome:?}"
        );
    }
    let answered_by = |replica: &str| {
        let of = |o: &&Outcome| o.model.as_deref() == Some(replica);
        outcomes.iter().filter(of).count()
    };
    // New requests went to B; A drained what it had.
    let after_close: Vec<&Outcome> = (outcomes.iter())
        .filter(|o| o.target == A && o.started > closed)
        .collect();
    assert!(
        !after_close.is_empty(),
        "A's clients had nothing left to send after its SIGTERM: no test of the failover"
    );
    for outcome in after_close {
        assert_eq!(outcome.model.as_deref(), Some(B), "{outcome:?}");
    }
    let drained = (outcomes.iter())
        .filter(|o| o.started < signalled && o.ended > signalled)
        .filter(|o| o.model.as_deref() == Some(A))
        .count();
    assert!(
        drained > 0,
        "no request under way on A at its SIGTERM was finished by A"
    );

    // None run twice: one delivered attempt each, to the replica that answered.
    let address_of = HashMap::from([
        (A, replica_a.address.as_str()),
        (B, replica_b.address.as_str()),
    ]);
    let logged = nginx.logged(outcomes.len(), |line| {
        line.request.starts_with("POST ") && outcomes.iter().any(|o| o.id == line.conversation)
    });
    for outcome in &outcomes {
        let mut lines = logged.iter().filter(|l| l.conversation == outcome.id);
        let (line, None) = (lines.next().unwrap(), lines.next()) else {
            panic!("{} logged twice: {logged:#?}", outcome.id)
        };
        let delivered: Vec<&Attempt> = (line.attempts.iter()).filter(|a| a.sent > 0).collect();
        let model = outcome.model.as_deref().unwrap();
        assert!(
            line.status == 200 && delivered.len() == 1 && delivered[0].address == address_of[model],
            "{} was sent to a replica other than the one that answered ({model}), or to more \
             than one: {line:?}",
            outcome.id
        );
    }
    let generated_b = metric(&replica_b.address, "runtime_requests_total") - total_b;
    let abandoned_b = metric(&replica_b.address, "runtime_requests_cancelled_total") - cancelled_b;
    assert_eq!(abandoned_b, 0, "nginx gave up on requests it had sent to B");
    assert_eq!(
        generated_b as usize,
        answered_by(B),
        "replica B generated other requests than those it answered"
    );
    assert!(
        generated_a as usize <= answered_by(A),
        "replica A generated {generated_a} requests before its SIGTERM, more than the {} it \
         answered",
        answered_by(A)
    );
    assert_eq!(answered_by(A) + answered_by(B), outcomes.len());
}

/// A request under way on replica A when A is killed (SIGKILL) fails with 502, in OpenAI's
/// envelope, and is not sent to B (whose count of generations does not move): it reached
/// A, so running it again is the client's decision. The next request of that conversation
/// goes to B.
fn sigkill_fails_the_request_under_way_without_retrying_it(
    nginx: &Nginx,
    id: &str,
    replica_a: &mut Server,
    replica_b: &Server,
) {
    let long = {
        let (balancer, id) = (nginx.address.clone(), id.to_string());
        std::thread::spawn(move || {
            let body = json!({"prompt": COUNTING, "max_tokens": 600, "temperature": 0});
            let headers = [format!("X-Conversation-Id: {id}")];
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            let body = body.to_string();
            request_to(
                &balancer,
                "POST",
                "/v1/completions",
                &headers,
                body.as_bytes(),
                WAIT,
            )
        })
    };
    let deadline = Instant::now() + WAIT;
    while metric(&replica_a.address, "runtime_requests_running") == 0 {
        assert!(Instant::now() < deadline, "the long request never ran on A");
        std::thread::sleep(Duration::from_millis(2));
    }
    let generated_b = metric(&replica_b.address, "runtime_requests_total");
    replica_a.child.kill().unwrap();
    replica_a.child.wait().unwrap();

    let failed = long.join().unwrap().expect("no answer to the long request");
    assert_eq!(failed.status, 502, "{}", shown(&failed));
    assert!(
        failed.json()["error"]["message"].is_string(),
        "nginx's 502 is not in OpenAI's envelope: {}",
        shown(&failed)
    );
    let next = json!({
        "messages": [{"role": "user", "content": "Are you there?"}],
        "temperature": 0, "max_tokens": 4,
    });
    let next = answer(&chat(&nginx.address, Some(id), &next));
    assert_eq!(
        next.model, B,
        "the next request did not go to the other replica"
    );
    let generated = metric(&replica_b.address, "runtime_requests_total") - generated_b;
    assert_eq!(
        generated, 1,
        "replica B ran {generated} requests for the killed one and the next: the killed \
         request was run again"
    );
    let logged = nginx.logged(1, |line| {
        line.conversation == id && line.request.contains("/v1/completions")
    });
    let attempts = &logged[0].attempts;
    assert!(
        logged[0].status == 502 && attempts.len() == 1 && attempts[0].address == replica_a.address,
        "the killed request was passed to another replica: {:?}",
        logged[0]
    );
}

/// What a test needs of an answer.
struct Answer {
    model: String,
    content: String,
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// A whole or streamed chat answer (its chunks' content joined, its usage from the last).
fn answer(response: &RawResponse) -> Answer {
    let text = String::from_utf8_lossy(&response.body);
    assert_eq!(response.status, 200, "{text}");
    let (model, content, usage) = if response.head.contains("text/event-stream") {
        let chunks: Vec<Value> = (text.lines())
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect();
        let content: String = (chunks.iter())
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        let usage = (chunks.iter().rev().find(|c| c["usage"].is_object()))
            .unwrap_or_else(|| panic!("no usage in the stream: {text}"))["usage"]
            .clone();
        (chunks[0]["model"].clone(), content, usage)
    } else {
        let v = response.json();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        (v["model"].clone(), content.to_string(), v["usage"].clone())
    };
    Answer {
        model: model.as_str().unwrap().to_string(),
        content,
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap(),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    }
}

/// A response's status and body, for a failure's message.
fn shown(response: &RawResponse) -> String {
    let body = String::from_utf8_lossy(&response.body);
    format!("{} {body}", response.status)
}

/// A chat request through nginx, with the conversation's header if given.
fn chat(balancer: &str, conversation: Option<&str>, body: &Value) -> RawResponse {
    let header = conversation.map(|id| format!("X-Conversation-Id: {id}"));
    let headers: Vec<&str> = header.iter().map(String::as_str).collect();
    let body = body.to_string();
    request_to(balancer, "POST", CHAT, &headers, body.as_bytes(), WAIT)
        .unwrap_or_else(|| panic!("no answer through nginx to {conversation:?}"))
}

/// The replica nginx sends conversation `id` to (`/v1/models` names it, and runs nothing).
fn replica_of(balancer: &str, id: &str) -> String {
    let header = format!("X-Conversation-Id: {id}");
    let response = request_to(balancer, "GET", "/v1/models", &[&header], b"", WAIT).unwrap();
    assert_eq!(response.status, 200, "{}", shown(&response));
    response.json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Fresh conversation ids, each found to go to a given replica.
struct Ids {
    balancer: String,
    next: usize,
}

impl Ids {
    fn for_replica(&mut self, replica: &str) -> String {
        for _ in 0..200 {
            let id = format!("conversation-{}", self.next);
            self.next += 1;
            if replica_of(&self.balancer, &id) == replica {
                return id;
            }
        }
        panic!("no conversation id of 200 goes to {replica}")
    }
}

/// When `address` refuses connections (its listener closed), at most 15 s from now (at
/// once on an idle machine; the rest is room for a busy one).
fn wait_refused(address: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match TcpStream::connect(address) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Instant::now(),
            _ => assert!(
                Instant::now() < deadline,
                "{address} still accepts 15 s after SIGTERM"
            ),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// nginx's binary: on PATH, or in /usr/sbin where Debian puts it (not on a user's PATH).
/// `None` (the test skipped) if there is none, unless REQUIRE_NGINX is set.
fn nginx_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs =
        std::env::split_paths(&path).chain(["/usr/sbin", "/usr/local/sbin"].map(PathBuf::from));
    let found = dirs.map(|dir| dir.join("nginx")).find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("REQUIRE_NGINX").is_none(),
            "REQUIRE_NGINX is set and there is no nginx (apt-get install nginx-light)"
        );
        eprintln!("skipped: no nginx (apt-get install nginx-light; REQUIRE_NGINX=1 fails instead)");
    }
    found
}

/// nginx in the foreground, stopped (SIGTERM, then SIGKILL) when dropped.
struct Nginx {
    child: Child,
    address: String,
    /// Its TLS listener's (the config's commented lines, with a test certificate).
    tls_address: String,
    prefix: PathBuf,
}

/// One attempt nginx made to pass a request to a replica, from its log.
#[derive(Debug)]
struct Attempt {
    address: String,
    /// Bytes of the request sent to the replica: 0 if it refused the connection.
    sent: u64,
}

impl Nginx {
    /// Runs deploy/nginx.conf with the replicas' addresses and free ports of its own put
    /// in place of the ones it names, its TLS lines uncommented with the test certificate,
    /// with `prefix` for its pid, logs and temporary files; returns once it answers
    /// `/health` from a replica.
    fn start(binary: &Path, prefix: &Path, replicas: [&str; 2]) -> Self {
        let committed = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/nginx.conf");
        let mut config = std::fs::read_to_string(committed).unwrap();
        let tls = [
            "listen 127.0.0.1:8443 ssl;",
            "ssl_certificate ",
            "ssl_certificate_key ",
        ];
        for line in tls {
            let commented = format!("# {line}");
            assert_eq!(
                config.matches(&commented).count(),
                1,
                "deploy/nginx.conf must have `{commented}` once"
            );
            config = config.replacen(&commented, line, 1);
        }
        let tls_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tls");
        for file in ["cert.pem", "key.pem"] {
            std::fs::copy(Path::new(tls_dir).join(file), prefix.join(file)).unwrap();
        }
        // Both held until both are known, so that they differ.
        let listeners = [(); 2].map(|()| TcpListener::bind("127.0.0.1:0").unwrap());
        let [address, tls_address] =
            listeners.map(|l| format!("127.0.0.1:{}", l.local_addr().unwrap().port()));
        // Each through a placeholder, in case a replica's new port is one the file names.
        let addresses = [
            ("127.0.0.1:8081", replicas[0]),
            ("127.0.0.1:8082", replicas[1]),
            ("127.0.0.1:8080", &address),
            ("127.0.0.1:8443", &tls_address),
        ];
        for (i, (from, _)) in addresses.iter().enumerate() {
            assert_eq!(
                config.matches(from).count(),
                1,
                "deploy/nginx.conf must name {from} once"
            );
            config = config.replace(from, &format!("@{i}@"));
        }
        for (i, (_, to)) in addresses.iter().enumerate() {
            config = config.replace(&format!("@{i}@"), to);
        }
        let path = prefix.join("nginx.conf");
        std::fs::write(&path, config).unwrap();
        let child = Command::new(binary)
            .arg("-p")
            .arg(prefix)
            .args(["-e", "stderr", "-c"])
            .arg(&path)
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut nginx = Self {
            child,
            address,
            tls_address,
            prefix: prefix.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = nginx.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
                panic!("nginx exited: {status}\n{log}");
            }
            let health = request_to(&nginx.address, "GET", "/health", &[], b"", WAIT);
            if health.as_ref().is_some_and(|r| r.status == 200) {
                return nginx;
            }
            assert!(
                Instant::now() < deadline,
                "nginx not ready after 20 s: {}",
                health.as_ref().map_or("no answer".into(), shown)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The access log's lines that `keep` keeps, once there are at least `count` of them
    /// (nginx logs a request after sending its response: the client may have read it first).
    fn logged(&self, count: usize, keep: impl Fn(&Logged) -> bool) -> Vec<Logged> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = std::fs::read_to_string(self.prefix.join("access.log")).unwrap();
            let lines: Vec<Logged> = (log.lines())
                .map(|line| {
                    Logged::parse(line).unwrap_or_else(|| panic!("unexpected log line {line:?}"))
                })
                .filter(|line| keep(line))
                .collect();
            if lines.len() >= count {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{count} requests not logged: {log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A request as nginx logs it (deploy/nginx.conf's `log_format replicas`).
#[derive(Debug)]
struct Logged {
    /// The request line.
    request: String,
    status: u16,
    conversation: String,
    /// The replicas nginx tried, in order.
    attempts: Vec<Attempt>,
}

impl Logged {
    fn parse(line: &str) -> Option<Self> {
        let (_, rest) = line.split_once('"')?;
        let (request, rest) = rest.split_once('"')?;
        let status = rest.split_whitespace().next()?.parse().ok()?;
        let addresses = field(line, "upstream")?.split(", ");
        let sent = field(line, "upstream_sent")?.split(", ");
        let attempts = (addresses.zip(sent))
            .map(|(address, sent)| Attempt {
                address: address.to_string(),
                sent: sent.parse().unwrap_or(0),
            })
            .collect();
        Some(Self {
            request: request.to_string(),
            status,
            conversation: field(line, "conversation")?.to_string(),
            attempts,
        })
    }
}

/// `name="value"` in a logged line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers, then exits (SIGKILL would leave them).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
