//! `POST /v1/embeddings` and `runtime embed`, through the real binary: the embedding
//! fixtures (converter/tests/data/embed-*, made by scripts/make_embedding_fixture.py)
//! converted and served give sentence-transformers' embeddings; every form of `input`,
//! base64, `dimensions`, the errors; the command line prints what the server answers; a
//! text's embedding is the same bits alone and in a batch of 16 while another request
//! generates (the engine runs embeddings between its steps); the official `openai` client.

mod common;

use std::process::{Command, Stdio};

use base64::Engine as _;
use serde_json::{Value, json};

use common::{Server, artifact_dir, chat_body, has_openai_client, run_client};

fn fixture_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../converter/tests/data")
        .join(name)
}

fn fixture(name: &str) -> Value {
    let path = fixture_dir(name).join("embeddings.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The fixture `name` converted into a new directory (`artifact` in it).
fn converted(name: &str) -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join(name);
    let render = &runtime::text::chat::ChatRequest::render;
    converter::convert::convert(&fixture_dir(name), &out, render).unwrap();
    (tmp, out.to_string_lossy().into_owned())
}

fn vectors(answer: &Value) -> Vec<Vec<f32>> {
    let data = answer["data"].as_array().unwrap();
    (data.iter().enumerate())
        .map(|(i, item)| {
            assert_eq!(item["index"], i, "{answer}");
            assert_eq!(item["object"], "embedding");
            serde_json::from_value(item["embedding"].clone()).unwrap()
        })
        .collect()
}

fn embed(server: &Server, body: Value) -> Value {
    let (status, answer) = server.post("/v1/embeddings", &body);
    assert_eq!(status, 200, "{body}: {answer}");
    answer
}

fn reference(fixture: &Value, key: &str) -> Vec<Vec<f32>> {
    serde_json::from_value(fixture[key].clone()).unwrap()
}

fn assert_close(ours: &[Vec<f32>], expected: &[Vec<f32>], what: &str) {
    assert_eq!(ours.len(), expected.len(), "{what}");
    for (i, (a, b)) in ours.iter().zip(expected).enumerate() {
        assert_eq!(a.len(), b.len(), "{what}: vector {i}");
        let diff = (a.iter().zip(b))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(diff <= 1e-5, "{what}: vector {i} differs by {diff}");
    }
}

fn bits(vectors: &[Vec<f32>]) -> Vec<Vec<u32>> {
    (vectors.iter())
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Every form of `input` gives sentence-transformers' embeddings (mean pooling, normalized),
/// the same bits from text and from its token ids, and base64 is those f32 values; usage
/// counts the tokens; `/v1/models` says how the model pools; generating is refused.
#[test]
fn the_server_embeds_as_sentence_transformers_does() {
    let (_tmp, dir) = converted("embed-llama");
    let fixture = fixture("embed-llama");
    let server = Server::start(&dir, &[]);
    let texts = fixture["texts"].clone();
    let expected = reference(&fixture, "embeddings");
    let answer = embed(&server, json!({"input": texts, "model": "embed-llama"}));
    let floats = vectors(&answer);
    assert_close(&floats, &expected, "texts");
    let tokens: usize = (fixture["ids"].as_array().unwrap().iter())
        .map(|ids| ids.as_array().unwrap().len())
        .sum();
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens})
    );
    assert_eq!(
        (answer["object"].as_str(), answer["model"].as_str()),
        (Some("list"), Some("embed-llama"))
    );

    let from_ids = vectors(&embed(&server, json!({"input": fixture["ids"]})));
    assert_eq!(bits(&from_ids), bits(&floats), "token ids");
    let one = vectors(&embed(&server, json!({"input": texts[2]})));
    assert_eq!(bits(&one), bits(&floats[2..3]), "one text");
    let one_ids = vectors(&embed(&server, json!({"input": fixture["ids"][2]})));
    assert_eq!(bits(&one_ids), bits(&floats[2..3]), "one list of ids");
    let full = vectors(&embed(
        &server,
        json!({"input": texts[2], "dimensions": 64}),
    ));
    assert_eq!(
        bits(&full),
        bits(&floats[2..3]),
        "dimensions: the full size"
    );

    let encoded = embed(
        &server,
        json!({"input": texts, "encoding_format": "base64"}),
    );
    for (i, item) in encoded["data"].as_array().unwrap().iter().enumerate() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(item["embedding"].as_str().unwrap())
            .unwrap();
        let decoded: Vec<f32> = (bytes.chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(bits(&[decoded]), bits(&floats[i..i + 1]), "base64 {i}");
    }

    let (status, models) = server.post("/v1/models", &json!({}));
    assert_eq!(status, 405, "{models}");
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let card: Value = serde_json::from_slice(&models).unwrap();
    let card = &card["data"][0];
    assert_eq!(
        (
            &card["pooling"],
            &card["normalize"],
            &card["task"],
            &card["embedding_dimensions"]
        ),
        (&json!("mean"), &json!(true), &json!("embed"), &json!(64)),
        "{card}"
    );

    let (status, refused) = server.post("/v1/chat/completions", &chat_body("w5 w6", 4, false));
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "model");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("embedding model"), "{message}");
    let (status, _) = server.post("/v1/completions", &json!({"prompt": "w5", "max_tokens": 2}));
    assert_eq!(status, 400);
}

/// Each malformed request is a 400 in OpenAI's envelope naming its field (an unknown field
/// by its message), checked before anything runs.
#[test]
fn malformed_embedding_requests_are_refused_naming_the_field() {
    let (_tmp, dir) = converted("embed-llama");
    let server = Server::start(&dir, &[]);
    let long: Vec<u32> = (0..129).map(|i| 4 + i % 90).collect();
    for (body, status, param, said) in [
        (
            json!({"input": ""}),
            400,
            json!("input"),
            "input 0 is empty",
        ),
        (
            json!({"input": ["w5", ""]}),
            400,
            json!("input"),
            "input 1 is empty",
        ),
        (json!({"input": []}), 400, json!("input"), "empty list"),
        (
            json!({"input": "w5", "encoding_format": "int8"}),
            400,
            json!("encoding_format"),
            "\"int8\"",
        ),
        (
            json!({"input": "w5", "dimensions": 16}),
            400,
            json!("dimensions"),
            "no shorter sizes",
        ),
        (
            json!({"input": "w5", "colour": "red"}),
            400,
            Value::Null,
            "unknown field \"colour\"",
        ),
        (json!({"input": long}), 400, json!("input"), "129 tokens"),
        (
            json!({"input": [[5, 6], [96]]}),
            400,
            json!("input"),
            "token id 96",
        ),
        (
            json!({"input": "w5", "model": "other"}),
            404,
            json!("model"),
            "does not exist",
        ),
    ] {
        let (got, answer) = server.post("/v1/embeddings", &body);
        assert_eq!(got, status, "{body}: {answer}");
        let error = &answer["error"];
        assert_eq!(error["param"], param, "{body}: {answer}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(said), "{body}: {message}");
    }
    let (_, answer) = server.post("/v1/embeddings", &json!({"input": long}));
    assert_eq!(answer["error"]["code"], "context_length_exceeded");
}

/// The server's guards hold on this route as on the others (the API key, the content type,
/// the body limit, each in OpenAI's envelope) and its routed answers are counted by route
/// (the key and the body's length are checked before routing, so not counted there).
#[test]
fn embeddings_pass_the_guards_and_are_counted_by_route() {
    let (_tmp, dir) = converted("embed-llama");
    let server = Server::start(&dir, &["--api-key", "sesame", "--body-limit", "4096"]);
    let key = "Authorization: Bearer sesame";
    let body = json!({"input": "w5 w6"}).to_string();
    let big = json!({"input": "w5 ".repeat(2000)}).to_string();
    for (headers, body, status) in [
        (vec![], body.as_str(), 401),
        (vec!["Authorization: Bearer wrong"], body.as_str(), 401),
        (vec![key, "Content-Type: text/plain"], body.as_str(), 415),
        (vec![key], big.as_str(), 413),
        (vec![key], body.as_str(), 200),
    ] {
        let (got, answer) = server.request("POST", "/v1/embeddings", &headers, body.as_bytes());
        let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        assert_eq!(got, status, "{headers:?}: {answer}");
        if status != 200 {
            assert!(answer["error"]["message"].is_string(), "{answer}");
        }
    }
    let metrics = String::from_utf8(server.get("/metrics").1).unwrap();
    for line in [
        r#"runtime_http_responses_total{route="/v1/embeddings",status="200"} 1"#,
        r#"runtime_http_responses_total{route="/v1/embeddings",status="415"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

/// `runtime embed` prints, a JSON line a text, the bits the server answers, from `--text`
/// and from stdin's lines; with a Matryoshka model cut to a listed size, both give
/// sentence-transformers' `truncate_dim` vectors.
#[test]
fn the_command_line_embeds_as_the_server_does() {
    for (name, dimensions) in [("embed-llama", None), ("embed-qwen3", Some(16))] {
        let (_tmp, dir) = converted(name);
        let fixture = fixture(name);
        let texts: Vec<String> = serde_json::from_value(fixture["texts"].clone()).unwrap();
        let server = Server::start(&dir, &[]);
        let mut body = json!({"input": texts});
        let mut args = vec!["embed".to_string(), "--artifacts".into(), dir.clone()];
        if let Some(d) = dimensions {
            body["dimensions"] = json!(d);
            args.extend(["--dimensions".into(), d.to_string()]);
        }
        let served = vectors(&embed(&server, body));
        let mut expected = reference(&fixture, "embeddings");
        if let Some(d) = dimensions {
            expected.iter_mut().for_each(|v| v.truncate(d));
        }
        assert_close(&served, &expected, name);

        let with_texts: Vec<String> = (texts.iter())
            .flat_map(|t| ["--text".to_string(), t.clone()])
            .collect();
        let printed = run_embed(&[args.clone(), with_texts].concat(), None);
        assert_eq!(bits(&printed), bits(&served), "{name}: --text");
        let piped = run_embed(&args, Some(texts.join("\n") + "\n"));
        assert_eq!(bits(&piped), bits(&served), "{name}: stdin");
    }
    // Errors are one line.
    let (_tmp, dir) = converted("embed-llama");
    for (extra, said) in [
        (vec!["--dimensions", "8"], "cannot be cut to 8"),
        (vec!["--text", ""], "text 2 is empty"),
    ] {
        let mut args = vec!["embed", "--artifacts", dir.as_str(), "--text", "w5"];
        args.extend(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains("error: ") && stderr.contains(said),
            "{args:?}: {stderr}"
        );
    }
    // Generating from an embedding model says why, in one line.
    let out = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args([
            "--artifacts",
            dir.as_str(),
            "--prompt",
            "w5 w6",
            "--max-new-tokens",
            "2",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("error: this is an embedding model"),
        "{stderr}"
    );
}

/// `runtime embed ARGS`, `stdin` written to it: its JSON lines.
fn run_embed(args: &[String], stdin: Option<String>) -> Vec<Vec<f32>> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runtime"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        std::io::Write::write_all(&mut input, text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (String::from_utf8(out.stdout).unwrap().lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// On the real model, which generates: embeddings by its last token, normalized (as vLLM
/// serves one); a text's embedding is the same bits alone on an idle server and in a batch
/// of 16 while a chat answer streams (the engine runs them between its decoding steps).
#[test]
fn a_text_embeds_alike_alone_and_in_a_batch_while_another_request_generates() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--parallel", "2"]);
    let (_, models) = server.get("/v1/models");
    let card: Value = serde_json::from_slice(&models).unwrap();
    let card = &card["data"][0];
    assert_eq!(
        (&card["pooling"], &card["normalize"], &card["task"]),
        (&json!("last"), &json!(true), &json!("generate"))
    );
    let text = "The quick brown fox jumps over the lazy dog.";
    let alone = vectors(&embed(&server, json!({"input": text})));
    let norm: f32 = alone[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    let others: Vec<String> = (0..15)
        .map(|i| format!("Sentence number {i} is about {}.", i * 7))
        .collect();
    let mut batch: Vec<String> = others.clone();
    batch.insert(7, text.to_string());
    std::thread::scope(|scope| {
        let streaming = scope.spawn(|| {
            server.stream(
                "/v1/chat/completions",
                &chat_body("Tell me a long story.", 48, true),
            )
        });
        // Embedded while the answer streams (the server decodes between the texts).
        let among = vectors(&embed(&server, json!({"input": batch})));
        assert_eq!(bits(&among[7..8]), bits(&alone), "the text among 16");
        let pieces = streaming.join().unwrap();
        assert_eq!(pieces.last().map(String::as_str), Some("[DONE]"));
    });
}

/// The official `openai` Python client (cli/tests/openai_embeddings.py): its default request
/// (base64, decoded by the client) and floats, each within 1e-5 of sentence-transformers'.
/// Skipped without the package, unless REQUIRE_OPENAI is set.
#[test]
fn openai_python_client_embeds() {
    if !has_openai_client() {
        return;
    }
    let (_tmp, dir) = converted("embed-llama");
    let server = Server::start(&dir, &["--api-key", "sesame"]);
    let fixture = fixture_dir("embed-llama").join("embeddings.json");
    run_client(
        "openai_embeddings.py",
        &format!("http://{}/v1", server.address),
        &[fixture.to_str().unwrap()],
    );
}
