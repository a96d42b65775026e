//! The chat page at `/` in a real browser: Debian's Chromium, headless, driven through its
//! chromedriver (WebDriver). The page's answers must be the API's greedy answers for the same
//! conversation, Stop must cancel the request on the server, and an API key must be asked
//! for, used, and kept only in the tab. On a failure the page is saved as
//! target/webui/failure.png; a passing run leaves screenshots at desktop and phone widths in
//! target/webui/ (docs/ has copies).
//!
//! Skipped without the model, or without chromium and chromedriver unless `REQUIRE_BROWSER`
//! is set (CI installs them and sets it).

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, artifact_dir, chat_body, metric, request_to, wait_until_running};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

fn browser_available() -> bool {
    let found = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    assert!(
        found || std::env::var_os("REQUIRE_BROWSER").is_none(),
        "REQUIRE_BROWSER is set but {CHROMIUM} or {CHROMEDRIVER} is missing \
         (apt-get install chromium chromium-driver)"
    );
    found
}

fn shots_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/webui")
}

/// chromedriver on a free port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium session with its own empty profile. Background networking is off:
/// this machine has no network, and Chromium's attempts would be refused many at a time.
async fn browser(driver: &Driver, profile: &Path) -> Client {
    let options = json!({
        "binary": CHROMIUM,
        "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--window-size=1280,900",
            format!("--user-data-dir={}", profile.display()),
        ],
    });
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a chromedriver session")
}

type Step = Result<(), String>;

/// Runs `steps` in the page, saving a screenshot if they fail.
async fn checked(client: &Client, steps: impl Future<Output = Step>) {
    if let Err(failure) = steps.await {
        let dir = shots_dir();
        let _ = std::fs::create_dir_all(&dir);
        let shot = dir.join("failure.png");
        if let Ok(png) = client.screenshot().await {
            let _ = std::fs::write(&shot, png);
        }
        panic!("{failure} (the page: {})", shot.display());
    }
}

/// Evaluates the JavaScript expression `expression` in the page.
async fn eval(client: &Client, expression: &str) -> Result<Value, String> {
    (client
        .execute(&format!("return {expression};"), vec![])
        .await)
        .map_err(|e| format!("evaluating {expression}: {e}"))
}

/// Waits until `expression` is truthy in the page; its value.
async fn until(client: &Client, expression: &str, within: Duration) -> Result<Value, String> {
    let deadline = Instant::now() + within;
    loop {
        let value = eval(client, expression).await?;
        if !matches!(&value, Value::Null | Value::Bool(false)) && value != json!("") {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(format!("still not true after {within:?}: {expression}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn fill(client: &Client, id: &str, text: &str) -> Step {
    let field = (client.find(Locator::Id(id)).await).map_err(|e| format!("#{id}: {e}"))?;
    field.clear().await.map_err(|e| format!("#{id}: {e}"))?;
    (field.send_keys(text).await).map_err(|e| format!("#{id}: {e}"))
}

async fn click(client: &Client, id: &str) -> Step {
    let button = (client.find(Locator::Id(id)).await).map_err(|e| format!("#{id}: {e}"))?;
    button.click().await.map_err(|e| format!("#{id}: {e}"))
}

const LAST_ANSWER: &str = "[...document.querySelectorAll('article.assistant')].at(-1)";

/// Types `question`, sends it with Enter, and waits for the whole streamed answer.
async fn ask(client: &Client, question: &str) -> Result<String, String> {
    fill(client, "prompt", &format!("{question}\n")).await?;
    let done = format!("{LAST_ANSWER}?.dataset.state === 'done' && {LAST_ANSWER}.dataset.text");
    let answer = until(client, &done, Duration::from_secs(120)).await?;
    Ok(answer.as_str().unwrap_or_default().to_string())
}

/// The API's greedy answer to `messages`.
fn api_answer(server: &Server, messages: &Value, max_tokens: usize, key: Option<&str>) -> String {
    let body = json!({"messages": messages, "temperature": 0, "max_tokens": max_tokens});
    let auth = key.map(|k| format!("Authorization: Bearer {k}"));
    let headers: Vec<&str> = auth.iter().map(String::as_str).collect();
    let (status, raw) = server.request(
        "POST",
        "/v1/chat/completions",
        &headers,
        body.to_string().as_bytes(),
    );
    let value: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{value}");
    value["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The page served by a new `runtime serve` (with `extra` options), open in a new headless
/// browser: the server, the driver and the browser's profile live as long as the page.
async fn open_page(dir: &str, extra: &[&str]) -> (Server, Driver, tempfile::TempDir, Client) {
    let server = Server::start(dir, extra);
    let driver = Driver::start();
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    (client.goto(&format!("http://{}/", server.address)).await).expect("the page opens");
    (server, driver, profile, client)
}

#[tokio::test(flavor = "current_thread")]
async fn the_page_answers_as_the_api_does_and_stop_cancels() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        let model = until(&client, "document.getElementById('model').textContent !== '…' && document.getElementById('model').textContent", Duration::from_secs(10)).await?;
        if model != json!("smollm2-135m-instruct") {
            return Err(format!("the page names the model {model}"));
        }
        // Greedy, and short: the settings the API call below uses.
        click(&client, "settings-toggle").await?;
        fill(&client, "temperature", "0").await?;
        fill(&client, "max-tokens", "40").await?;

        // Two turns: the second is answered with the first in its history.
        let first = "What is the capital of France?";
        let answer = ask(&client, first).await?;
        let expected = api_answer(&server, &json!([{"role": "user", "content": first}]), 40, None);
        if answer != expected {
            return Err(format!("the page's answer {answer:?} is not the API's {expected:?}"));
        }
        let second = "And of Italy?";
        let answer2 = ask(&client, second).await?;
        let history = json!([
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": second},
        ]);
        let expected2 = api_answer(&server, &history, 40, None);
        if answer2 != expected2 {
            return Err(format!("second turn: {answer2:?}, the API's {expected2:?}"));
        }
        screenshots(&client).await?;

        // Stop, mid-answer: the page keeps what came, the server drops the request.
        click(&client, "new").await?;
        fill(&client, "max-tokens", "2000").await?;
        fill(&client, "prompt", "Write a very long story about a dragon who learns to cook.\n").await?;
        until(&client, &format!("{LAST_ANSWER}?.dataset.text?.length > 20"), Duration::from_secs(60)).await?;
        let cancelled_before = metric(&server.address, "runtime_requests_cancelled_total");
        click(&client, "stop").await?;
        until(&client, &format!("{LAST_ANSWER}.dataset.state === 'stopped'"), Duration::from_secs(5)).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric(&server.address, "runtime_requests_cancelled_total") != cancelled_before + 1
            || metric(&server.address, "runtime_requests_running") != 0
        {
            if Instant::now() > deadline {
                return Err("the server did not cancel the stopped request within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let generated = metric(&server.address, "runtime_completion_tokens_total");
        tokio::time::sleep(Duration::from_millis(500)).await;
        if metric(&server.address, "runtime_completion_tokens_total") != generated {
            return Err("tokens are still being generated after Stop".into());
        }
        // The page is ready for the next question.
        eval(&client, "document.getElementById('send').hidden === false && document.getElementById('stop').hidden").await.and_then(|ready| {
            if ready == json!(true) { Ok(()) } else { Err("Send is not back after Stop".into()) }
        })
    })
    .await;
    let _ = client.close().await;
}

/// The page at desktop and phone widths, for docs/.
async fn screenshots(client: &Client) -> Step {
    let dir = shots_dir();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for (name, width, height) in [("desktop", 1280, 800), ("phone", 390, 844)] {
        (client.set_window_size(width, height).await).map_err(|e| e.to_string())?;
        let png = client.screenshot().await.map_err(|e| e.to_string())?;
        std::fs::write(dir.join(format!("webui-{name}.png")), png).map_err(|e| e.to_string())?;
    }
    (client.set_window_size(1280, 900).await).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "current_thread")]
async fn the_page_asks_for_the_api_key_and_keeps_it_in_the_tab() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (server, _driver, _profile, client) = open_page(&dir, &["--api-key", "sesame"]).await;
    checked(&client, async {
        // /v1/models answered 401: the page says so and shows the key's field.
        let error = until(&client, "!document.getElementById('key-box').hidden && document.getElementById('error').textContent", Duration::from_secs(10)).await?;
        if !error.as_str().unwrap_or_default().contains("API key") {
            return Err(format!("the 401 is shown as {error}"));
        }
        fill(&client, "key", "sesame").await?;
        click(&client, "key-save").await?;
        until(&client, "document.getElementById('model').textContent === 'smollm2-135m-instruct'", Duration::from_secs(10)).await?;
        fill(&client, "temperature", "0").await?;
        fill(&client, "max-tokens", "16").await?;
        let question = "Say hello.";
        let answer = ask(&client, question).await?;
        let expected = api_answer(&server, &json!([{"role": "user", "content": question}]), 16, Some("sesame"));
        if answer != expected {
            return Err(format!("with a key: {answer:?}, the API's {expected:?}"));
        }
        // Kept for this tab only: "remember" was not ticked.
        let stored = eval(&client, "[sessionStorage.getItem('runtime-api-key'), localStorage.getItem('runtime-api-key')]").await?;
        if stored != json!(["sesame", null]) {
            return Err(format!("the key is stored as {stored} (session, local)"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// Model output is untrusted: markdown becomes elements built from text, never HTML, and
/// links only to http(s) addresses.
#[tokio::test(flavor = "current_thread")]
async fn markdown_renders_without_running_what_the_model_wrote() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        until(
            &client,
            "typeof markdown === 'function'",
            Duration::from_secs(10),
        )
        .await?;
        let source = "# Title\n\nSome **bold**, *em*, `x<y` and snake_case_name.\n\n\
            - one\n- two\n\n```rust\nfn main() { println!(\"<b>\"); }\n```\n\
            <img src=x onerror=\"window.owned=1\"> [ok](https://example.com) \
            [bad](javascript:window.owned=1)";
        let shape = eval(
            &client,
            &format!(
            "(() => {{ const d = document.createElement('div'); d.append(markdown({})); return {{
                html: [...d.querySelectorAll('*')].map(e => e.tagName.toLowerCase()).join(' '),
                code: d.querySelector('pre code')?.textContent,
                lang: d.querySelector('pre code')?.dataset.lang,
                links: [...d.querySelectorAll('a')].map(a => a.href),
                text: d.textContent }}; }})()",
            json!(source)
        ),
        )
        .await?;
        let expected_tags = "h3 p strong em code ul li li pre code p a";
        let checks = [
            (shape["html"] == json!(expected_tags), "the elements"),
            (
                shape["code"] == json!("fn main() { println!(\"<b>\"); }"),
                "the code block",
            ),
            (shape["lang"] == json!("rust"), "the code block's language"),
            (
                shape["links"] == json!(["https://example.com/"]),
                "the links",
            ),
            (
                shape["text"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("<img src=x"),
                "the HTML as text",
            ),
        ];
        for (ok, what) in checks {
            if !ok {
                return Err(format!("{what} wrong in {shape}"));
            }
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// A question asked while every slot is taken says "waiting for a free slot" under its
/// answer (the server's comment in the stream) until the answer starts; then it is answered
/// and the note goes.
#[tokio::test(flavor = "current_thread")]
async fn a_queued_question_says_it_waits_for_a_free_slot() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (server, _driver, _profile, client) = open_page(&dir, &["--parallel", "1"]).await;
    // The only slot, taken by a long completion (4000 tokens of counting).
    let body = json!({"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 4000,
                      "temperature": 0, "stream": true})
    .to_string();
    let mut long = std::net::TcpStream::connect(&server.address).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.address,
        body.len()
    );
    std::io::Write::write_all(&mut long, head.as_bytes()).unwrap();
    wait_until_running(&server.address, 1);
    checked(&client, async {
        fill(&client, "prompt", "Hi\n").await?;
        let waiting = format!("{LAST_ANSWER}?.dataset.note === 'waiting for a free slot'");
        until(&client, &waiting, Duration::from_secs(30)).await?;
        // The long completion's client leaves: the question gets the slot.
        drop(long);
        let done = format!("{LAST_ANSWER}.dataset.state === 'done' && {LAST_ANSWER}.dataset.text");
        until(&client, &done, Duration::from_secs(120)).await?;
        match eval(&client, &format!("{LAST_ANSWER}.dataset.note ?? null")).await? {
            Value::Null => Ok(()),
            note => Err(format!("the answer still says {note}")),
        }
    })
    .await;
    let _ = client.close().await;
}

#[test]
fn no_webui_leaves_the_root_unserved() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &["--no-webui"]);
    let (status, body) = server.get("/");
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    assert_eq!(server.get("/webui/app.js").0, 404);
    // The API stays.
    assert_eq!(
        server
            .post("/v1/chat/completions", &chat_body("Hi", 2, false))
            .0,
        200
    );
}

/// Every file of the page carries the headers that keep a hostile page or model output from
/// using it (docs/HARDENING.md, "The chat page"): the strict policy, no framing, no sniffing,
/// no referrer, its own content type.
#[test]
fn the_page_files_carry_their_security_headers() {
    let Some(dir) = artifact_dir() else { return };
    let server = Server::start(&dir, &[]);
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/webui/app.js", "text/javascript; charset=utf-8"),
        ("/webui/style.css", "text/css; charset=utf-8"),
    ] {
        let response = request_to(
            &server.address,
            "GET",
            path,
            &[],
            b"",
            Duration::from_secs(10),
        )
        .unwrap_or_else(|| panic!("no answer for {path}"));
        assert_eq!(response.status, 200, "{path}");
        for header in [
            "content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
                .to_string(),
            "x-frame-options: deny".to_string(),
            "x-content-type-options: nosniff".to_string(),
            "referrer-policy: no-referrer".to_string(),
            format!("content-type: {content_type}"),
        ] {
            assert!(
                response.head.lines().any(|line| line.trim() == header),
                "{path} lacks {header:?}: {}",
                response.head
            );
        }
    }
}
