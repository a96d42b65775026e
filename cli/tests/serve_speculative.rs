//! `--draft ngram` (speculative decoding) through the real binaries on the real model: the
//! command line and the server answer with the same text as without drafts, greedy and
//! sampled with a seed, several requests at once; `speculative.n_max: 0` turns drafting off
//! for a request; `/metrics` counts the tokens drafted and kept; a draft model (the model's
//! own q4_0 copy) drafts the same answer, and one of another vocabulary is refused.

mod common;

use std::process::Command;

use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body};

/// An answer that copies its prompt, where drafts are kept.
const COPYING: &str = "Repeat this sentence exactly: the small red boat sails across the \
    quiet lake while the old fisherman watches the clouds drift over the green hills.";

fn content(answer: &Value) -> String {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {answer}"))
        .to_string()
}

fn metric(server: &Server, name: &str) -> u64 {
    let metrics = String::from_utf8(server.get("/metrics").1).unwrap();
    (metrics.lines())
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
}

#[test]
fn drafted_answers_are_the_plain_ones() {
    let Some(dir) = artifact_dir() else { return };
    let plain = Server::start(&dir, &["--parallel", "3"]);
    let drafted = Server::start(&dir, &["--parallel", "3", "--draft", "ngram"]);
    let sampled = |prompt: &str, seed: u64| {
        let mut body = chat_body(prompt, 60, false);
        body["temperature"] = json!(0.8);
        body["seed"] = json!(seed);
        body
    };
    let bodies = [
        chat_body(COPYING, 60, false),
        sampled(COPYING, 7),
        chat_body("Name three colours.", 30, false),
    ];
    let answers = |server: &Server| -> Vec<String> {
        // Sent together: the server decodes (and checks the drafts of) all three at once.
        std::thread::scope(|scope| {
            let running: Vec<_> = (bodies.iter())
                .map(|body| {
                    scope.spawn(move || {
                        let (status, answer) = server.post("/v1/chat/completions", body);
                        assert_eq!(status, 200, "{answer}");
                        content(&answer)
                    })
                })
                .collect();
            running.into_iter().map(|r| r.join().unwrap()).collect()
        })
    };
    assert_eq!(answers(&drafted), answers(&plain));
    let (made, kept) = (
        metric(&drafted, "runtime_draft_tokens_total"),
        metric(&drafted, "runtime_draft_tokens_accepted_total"),
    );
    assert!(kept > 0 && made >= kept, "{kept} of {made} kept");
    assert_eq!(metric(&plain, "runtime_draft_tokens_total"), 0);

    // Off for one request: nothing more drafted, the same answer.
    let mut off = chat_body(COPYING, 60, false);
    off["speculative.n_max"] = json!(0);
    let (status, answer) = drafted.post("/v1/chat/completions", &off);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(content(&answer), answers(&plain)[0]);
    assert_eq!(metric(&drafted, "runtime_draft_tokens_total"), made);
}

#[test]
fn the_command_line_drafts_the_same_answer() {
    let Some(dir) = artifact_dir() else { return };
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
            .args([
                "--artifacts",
                &dir,
                "--chat",
                "--temperature",
                "0",
                "--json",
            ])
            .args(["--prompt", COPYING, "--max-new-tokens", "60"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        answer["text"].as_str().unwrap().to_string()
    };
    assert_eq!(run(&["--draft", "ngram"]), run(&[]));
    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(["--artifacts", &dir, "--prompt", "x", "--draft", "eagle"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("ngram"),
        "{stderr}"
    );
}
