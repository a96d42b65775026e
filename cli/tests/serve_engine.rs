//! `runtime serve`'s engine under load, on the real artifact: a request's KV cache memory
//! follows its tokens, kept caches fit their budget and are reused only within a scope, a
//! short request is not stuck behind a long prompt's prefill, and a `--parallel` that cannot
//! fit is refused at start.

mod common;

use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body, wait_until_running};

/// The server process's resident memory, in bytes.
fn rss(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Sends every body at once, each on its own connection; the responses in order.
fn all_at_once(server: &Server, bodies: &[Value]) -> Vec<(u16, Value)> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (bodies.iter())
            .map(|body| scope.spawn(move || server.post("/v1/chat/completions", body)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn cached_tokens(response: &Value) -> u64 {
    response["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// A user message of about `words` words, different for each `seed` from its first word.
fn long_message(seed: usize, words: usize) -> String {
    let mut text = format!("Conversation {seed}. ");
    let sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank. ";
    while text.split_whitespace().count() < words {
        text.push_str(sentence);
    }
    text
}

/// Eight short requests at once hold a block of cache each, not a whole context each:
/// before caches grew as they fill, this grew the server by ~365 MB a request.
#[test]
fn short_requests_hold_little_memory() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "8"]);
    // One request first, so that what every request allocates alike (the first forward
    // pass's buffers) is not counted against the parallel ones.
    assert_eq!(
        server
            .post("/v1/chat/completions", &chat_body("Hi", 2, false))
            .0,
        200
    );
    let before = rss(&server);
    let bodies: Vec<Value> = (0..8)
        .map(|i| chat_body(&format!("Say the number {i}."), 2, false))
        .collect();
    for (status, body) in all_at_once(&server, &bodies) {
        assert_eq!(status, 200, "{body}");
    }
    let grown = rss(&server).saturating_sub(before);
    // A full-context cache of SmolLM2 is ~377 MB; a block of 256 positions ~12 MB.
    assert!(
        grown < 200 << 20,
        "eight 2-token requests grew the server by {} MB",
        grown >> 20
    );
}

/// Eight long conversations at once all fit, and each one's next turn starts from its own
/// kept cache: it prefills only the new messages.
#[test]
fn eight_long_conversations_reuse_their_caches() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "8"]);
    let first: Vec<Value> = (0..8)
        .map(|i| {
            json!({"messages": [{"role": "user", "content": long_message(i, 700)}],
                   "temperature": 0, "max_tokens": 4})
        })
        .collect();
    let answers = all_at_once(&server, &first);
    let next: Vec<Value> = (first.iter().zip(&answers))
        .map(|(body, (status, answer))| {
            assert_eq!(*status, 200, "{answer}");
            let mut body = body.clone();
            let reply = answer["choices"][0]["message"]["content"].clone();
            let messages = body["messages"].as_array_mut().unwrap();
            messages.push(json!({"role": "assistant", "content": reply}));
            messages.push(json!({"role": "user", "content": "And then?"}));
            body
        })
        .collect();
    for (i, (status, answer)) in all_at_once(&server, &next).into_iter().enumerate() {
        assert_eq!(status, 200, "{answer}");
        let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
        let first_prompt = answers[i].1["usage"]["prompt_tokens"].as_u64().unwrap();
        // Everything of the first turn's prompt was kept; what follows it is new.
        assert!(
            cached_tokens(&answer) >= first_prompt,
            "conversation {i}: {} of {prompt} prompt tokens cached, the first turn had {first_prompt}",
            cached_tokens(&answer)
        );
    }
}

/// Kept caches are reused only within a scope (`cache_salt` here): a client cannot learn
/// another's prompt from `cached_tokens`. Within one scope the next turn is reused, and the
/// least recently used cache goes when the budget is full.
#[test]
fn kept_caches_stay_in_their_scope_and_budget() {
    let Some(dir) = artifact_dir() else { return };
    let secret = "The code is 7391-ALPHA. Remember it.";
    let guess = |server: &Server, salt: &str, text: &str| {
        let body = json!({"messages": [{"role": "user", "content": text}],
                          "temperature": 0, "max_tokens": 1, "cache_salt": salt});
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        (
            cached_tokens(&answer),
            answer["usage"]["prompt_tokens"].as_u64().unwrap(),
        )
    };
    // A budget for one short conversation's cache (a block of positions is ~12 MB).
    let server = Server::start(&dir, &["--cache-ram", "20"]);
    guess(&server, "alice", secret);
    // Another scope shares nothing, not even the chat template's system prompt.
    assert_eq!(guess(&server, "mallory", "The code is 7").0, 0);
    // Mallory's cache took the budget: alice's went (least recently used).
    let (cached, _) = guess(&server, "alice", secret);
    assert_eq!(
        cached, 0,
        "alice's cache should have been dropped for mallory's"
    );
    // Kept now (the last used), and reused within alice's scope.
    let (cached, prompt) = guess(&server, "alice", secret);
    assert_eq!(
        cached,
        prompt - 1,
        "the same prompt again reuses all but its last token"
    );

    let server = Server::start(&dir, &["--cache-ram", "0"]);
    guess(&server, "alice", secret);
    assert_eq!(
        guess(&server, "alice", secret).0,
        0,
        "--cache-ram 0 keeps none"
    );
}

/// A short request arriving while a long prompt prefills is prefilled between the long
/// one's pieces: it is answered first.
#[test]
fn a_short_request_is_not_stuck_behind_a_long_prefill() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "4"]);
    let long = json!({"messages": [{"role": "user", "content": long_message(0, 4000)}],
                      "temperature": 0, "max_tokens": 1});
    let short = chat_body("Hi", 2, false);
    let (long_done, short_done) = std::thread::scope(|scope| {
        let long = scope.spawn(|| {
            let (status, body) = server.post("/v1/chat/completions", &long);
            assert_eq!(status, 200, "{body}");
            Instant::now()
        });
        // The long prompt's prefill has begun.
        wait_until_running(&server.address, 1);
        let short = scope.spawn(|| {
            let (status, body) = server.post("/v1/chat/completions", &short);
            assert_eq!(status, 200, "{body}");
            Instant::now()
        });
        (long.join().unwrap(), short.join().unwrap())
    });
    assert!(
        short_done < long_done,
        "the short request was answered {:?} after the long one",
        short_done - long_done
    );
}

/// A `--parallel` whose requests could not each hold even a short prompt's cache is refused
/// before the server listens, with one error line.
#[test]
fn a_parallel_that_cannot_fit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A config of a model whose cache takes 1.3 GB for a block of positions.
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(["serve", "--port", "0", "--parallel", "200", "--artifacts"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("error: --parallel 200 needs"),
        "{stderr}"
    );
}
