//! The chat page at `/` in a real browser: Debian's Chromium, headless, driven through its
//! chromedriver (WebDriver). The page's answers must be the API's greedy answers for the same
//! conversation, Stop must cancel the request on the server, and an API key must be asked
//! for, used, and kept only in the tab. How the page shows an answer (markdown, a long
//! stream, layout, contrast) is tested on answers from a stub of `fetch` ([`STUB`]), which
//! are exactly what each test needs. On a failure the page is saved as
//! target/webui/failure.png; a passing run leaves screenshots at desktop and phone widths in
//! target/webui/ (docs/ has copies).
//!
//! Skipped without the model, or without chromium and chromedriver unless `REQUIRE_BROWSER`
//! is set (CI installs them and sets it).

mod common;

use std::cell::Cell;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
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

/// The browser tests run side by side, each with its own Chromium, driver and model server;
/// a test that times the page takes the machine alone ([`alone`]): on two cores shared with
/// the others, a 50 ms task of the page took 155.
static MACHINE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Whether this test holds [`MACHINE`] alone.
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// The machine for this test alone: waits until the other browser tests have closed their
/// drivers, and keeps new ones from starting until dropped.
fn alone() -> Alone {
    let guard = MACHINE.write().unwrap_or_else(PoisonError::into_inner);
    ALONE.set(true);
    Alone { _guard: guard }
}

/// [`MACHINE`] held alone by this test.
struct Alone {
    _guard: RwLockWriteGuard<'static, ()>,
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE.set(false);
    }
}

/// chromedriver on a free port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
    /// This test's share of the machine, unless it holds it [`alone`].
    _sharing: Option<RwLockReadGuard<'static, ()>>,
}

impl Driver {
    fn start() -> Self {
        let sharing =
            (!ALONE.get()).then(|| MACHINE.read().unwrap_or_else(PoisonError::into_inner));
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
            _sharing: sharing,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a test's browser differs from the default one (a desktop window, light colours).
#[derive(Default)]
struct Look<'a> {
    /// More Chromium flags (`--force-dark-mode`, `--host-resolver-rules=...`).
    args: &'a [&'a str],
    /// A 375-pixel-wide phone screen (a window cannot be made narrower than 500).
    phone: bool,
}

/// A headless Chromium session with its own empty profile. Background networking is off:
/// this machine has no network, and Chromium's attempts would be refused many at a time.
async fn browser(driver: &Driver, profile: &Path, look: &Look<'_>) -> Client {
    let mut args = vec![
        "--headless=new".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-dev-shm-usage".into(),
        "--disable-quic".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--window-size=1280,900".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    args.extend(look.args.iter().map(|a| a.to_string()));
    let mut options = json!({"binary": CHROMIUM, "args": args});
    if look.phone {
        options["mobileEmulation"] =
            json!({"deviceMetrics": {"width": 375, "height": 812, "pixelRatio": 2}});
    }
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

/// Runs `steps` in the page, saving a screenshot if they fail. The browser is closed before
/// the test fails: killing chromedriver would leave it running.
async fn checked(client: &Client, steps: impl Future<Output = Step>) {
    if let Err(failure) = steps.await {
        let dir = shots_dir();
        let _ = std::fs::create_dir_all(&dir);
        let shot = dir.join("failure.png");
        if let Ok(png) = client.screenshot().await {
            let _ = std::fs::write(&shot, png);
        }
        let _ = client.clone().close().await;
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
    let (driver, profile, client) = open_browser(&server, &Look::default()).await;
    (server, driver, profile, client)
}

/// `server`'s page in a new headless browser that looks as `look` says, ready to be used
/// (the page's script loaded).
async fn open_browser(server: &Server, look: &Look<'_>) -> (Driver, tempfile::TempDir, Client) {
    let driver = Driver::start();
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path(), look).await;
    checked(&client, async {
        let page = format!("http://{}/", server.address);
        (client.goto(&page).await).map_err(|e| format!("opening {page}: {e}"))?;
        let ready = "typeof markdown === 'function'";
        until(&client, ready, Duration::from_secs(20))
            .await
            .map(drop)
    })
    .await;
    (driver, profile, client)
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
        // Greedy and short, so the answer's own note (such as "max tokens reached" for a
        // sampled answer that rambles) cannot stand where the waiting note should have gone.
        click(&client, "settings-toggle").await?;
        fill(&client, "temperature", "0").await?;
        fill(&client, "max-tokens", "64").await?;
        fill(&client, "prompt", "Hi\n").await?;
        let waiting = format!("{LAST_ANSWER}?.dataset.note === 'waiting for a free slot'");
        until(&client, &waiting, Duration::from_secs(30)).await?;
        // The long completion's client leaves: the question gets the slot.
        drop(long);
        let done = format!("{LAST_ANSWER}.dataset.state === 'done' && {LAST_ANSWER}.dataset.text");
        until(&client, &done, Duration::from_secs(120)).await?;
        match eval(&client, &format!("{LAST_ANSWER}.dataset.note ?? null")).await? {
            Value::Null => Ok(()),
            // Sixty-four tokens were not enough: the page says so, and the waiting note went.
            Value::String(note) if note == "max tokens reached" => Ok(()),
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
        (
            "/webui/vendor/markdown-it.min.js",
            "text/javascript; charset=utf-8",
        ),
        ("/webui/icon.svg", "image/svg+xml"),
        ("/favicon.ico", "image/svg+xml"),
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

/// Replaces the page's `fetch` of `/v1/chat/completions` (other requests still reach the
/// server) with the stream a server sends: `stubAnswer(pieces, options)` makes the next
/// questions answered by `pieces`, one content delta each, `burst` events a read (as a fast
/// model's events reach a busy page together), each read a task of its own; `holdAt: n`
/// holds the stream after `n` pieces while `stub.hold` is true; `finish` is the last
/// chunk's finish_reason. The requests' bodies are kept in `stub.requests`.
const STUB: &str = r#"(() => {
  const realFetch = window.fetch.bind(window);
  window.stub = { requests: [], hold: false };
  window.stubAnswer = (pieces, { burst = 1, holdAt = -1, finish = "stop" } = {}) => {
    window.fetch = (url, init) => {
      if (!String(url).endsWith("/v1/chat/completions")) return realFetch(url, init);
      stub.requests.push(JSON.parse(init.body));
      stub.hold = holdAt >= 0;
      const held = () => stub.hold && sent >= holdAt;
      const event = (delta, reason = null) =>
        `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: reason }] })}\n\n`;
      const encoder = new TextEncoder();
      let sent = 0;
      const body = new ReadableStream({
        async pull(controller) {
          do await new Promise((resolve) => setTimeout(resolve, held() ? 20 : 0));
          while (held());
          const end = Math.min(sent + burst, pieces.length, stub.hold ? holdAt : Infinity);
          let text = "";
          for (; sent < end; sent++) text += event({ content: pieces[sent] });
          const last = sent === pieces.length;
          if (last) text += event({}, finish) + "data: [DONE]\n\n";
          controller.enqueue(encoder.encode(text));
          if (last) controller.close();
        },
      });
      return Promise.resolve(
        new Response(body, { headers: { "Content-Type": "text/event-stream" } }),
      );
    };
  };
  return true;
})()"#;

/// The page's answers from now on are `pieces`, streamed as [`STUB`] says with `options`.
async fn stub_answers(client: &Client, pieces: &[String], options: Value) -> Step {
    let installed = eval(client, "window.stubAnswer !== undefined").await?;
    if installed != json!(true) {
        eval(client, STUB).await?;
    }
    let call = format!("(stubAnswer({}, {options}), true)", json!(pieces));
    eval(client, &call).await.map(drop)
}

/// `text` in pieces of `size` bytes (ASCII) or characters (else), as tokens come.
fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// Sends `question` and waits until the answer has come whole: its `data-text`.
async fn ask_stub(client: &Client, question: &str) -> Result<Value, String> {
    fill(client, "prompt", &format!("{question}\n")).await?;
    let done = format!("{LAST_ANSWER}?.dataset.state === 'done' && {LAST_ANSWER}.dataset.text");
    until(client, &done, Duration::from_secs(30)).await
}

/// What model output ordinarily holds, rendered as CommonMark with GFM tables (the
/// hand-written renderer threw on the first three and got the rest wrong): a heading line
/// ending in `\r`, U+2028, 20,000 nested `>` (quickly, the text kept), ordered lists split
/// by a blank line, a code block or a paragraph (numbered on), bullets under a numbered item
/// (nested, not numbered), a ```` fence holding a ``` one, a link with balanced parentheses,
/// a table; and hostile markup, which stays inert. Streamed a few characters at a time (the
/// page then parses from the last block on), an answer ends rendered as it is whole.
#[tokio::test(flavor = "current_thread")]
async fn markdown_renders_ordinary_model_output_as_commonmark() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        let cases = r#"(() => {
          const render = (source) => {
            const box = document.createElement('div');
            box.append(markdown(source));
            return box;
          };
          const numbers = (box) => [...box.querySelectorAll('ol')]
            .flatMap((ol) => [...ol.children].map((li, i) => ol.start + i));
          const out = {};
          let box = render('# Title\r\nText after it\r\n');
          out.cr = [box.querySelector('h3')?.textContent, box.querySelector('p')?.textContent];
          box = render('one\u2028two\u2029three');
          out.separators = box.textContent;
          const started = performance.now();
          box = render('>'.repeat(20000) + ' deep');
          out.deep = { ms: performance.now() - started, kept: box.textContent.includes('deep') };
          box = render('1. one\n\n2. two\n\n```\ncode\n```\n\n3. three\n\nA paragraph.\n\n4. four');
          out.numbers = numbers(box);
          box = render('1. Step\n   - a\n   - b\n2. Next');
          out.nested = { numbers: numbers(box),
            bullets: [...box.querySelectorAll('ol > li > ul > li')].map((li) => li.textContent) };
          box = render('````md\n```js\nx\n```\n````\nafter');
          out.fence = [box.querySelectorAll('pre').length, box.querySelector('pre code')?.textContent,
                       box.querySelector('pre code')?.dataset.lang, box.querySelector('p')?.textContent];
          box = render('See [Rust](https://en.wikipedia.org/wiki/Rust_(programming_language)).');
          out.link = [box.querySelector('a')?.getAttribute('href'), box.querySelector('a')?.target,
                      box.querySelector('a')?.rel, box.textContent];
          box = render('| name | n |\n|---|--:|\n| a *b* | 1 |\n| c | 22 |');
          out.table = { head: [...box.querySelectorAll('thead th')].map((e) => e.textContent),
            cells: [...box.querySelectorAll('tbody td')].map((e) => e.textContent),
            align: getComputedStyle(document.body.appendChild(box).querySelector('td:last-child')).textAlign,
            em: box.querySelector('td em')?.textContent };
          box.remove();
          box = render('<script>window.owned=1</script>\n\n<img src=x onerror="window.owned=1">\n\n' +
            '[a](javascript:window.owned=1) [b](JaVaScRiPt:window.owned=1) ' +
            '[c](data:text/html,owned) <javascript:window.owned=1> [d][r] [e](vbscript:x) ' +
            '[f](/relative) ![g](https://example.com/x.png) [ok](https://example.com/ "t")\n\n' +
            '[r]: javascript:window.owned=1');
          document.body.appendChild(box);
          out.hostile = { tags: [...new Set([...box.querySelectorAll('*')].map((e) => e.localName))].sort(),
            links: [...box.querySelectorAll('a')].map((a) => a.getAttribute('href')),
            attributes: [...box.querySelectorAll('*')].flatMap((e) => e.getAttributeNames())
              .filter((name) => name.startsWith('on') || name === 'src' || name === 'style') };
          box.remove();
          return out;
        })()"#;
        let out = eval(&client, cases).await?;
        let owned = eval(&client, "new Promise((done) => setTimeout(() => done(window.owned ?? null), 100))").await?;
        let checks = [
            (out["cr"] == json!(["Title", "Text after it"]), "a heading line ending in \\r"),
            (out["separators"] == json!("one\u{2028}two\u{2029}three"), "U+2028 and U+2029"),
            (out["deep"]["kept"] == json!(true), "20,000 nested > (its text)"),
            (out["deep"]["ms"].as_f64().is_some_and(|ms| ms < 2000.0), "20,000 nested > (in time)"),
            (out["numbers"] == json!([1, 2, 3, 4]), "an ordered list split by code and text"),
            (out["nested"]["numbers"] == json!([1, 2]), "bullets under a numbered item (numbers)"),
            (out["nested"]["bullets"] == json!(["a", "b"]), "bullets under a numbered item"),
            (out["fence"] == json!([1, "```js\nx\n```", "md", "after"]), "a ```` fence"),
            (
                out["link"] == json!([
                    "https://en.wikipedia.org/wiki/Rust_(programming_language)", "_blank",
                    "noopener noreferrer", "See Rust."
                ]),
                "a link with parentheses",
            ),
            (out["table"]["head"] == json!(["name", "n"]), "the table's head"),
            (out["table"]["cells"] == json!(["a b", "1", "c", "22"]), "the table's cells"),
            (out["table"]["align"] == json!("right"), "the table's column alignment"),
            (out["table"]["em"] == json!("b"), "markdown in a table cell"),
            (out["hostile"]["tags"] == json!(["a", "p"]), "hostile markup's elements"),
            (out["hostile"]["links"] == json!(["https://example.com/"]), "hostile markup's links"),
            (out["hostile"]["attributes"] == json!([]), "hostile markup's attributes"),
            (owned == Value::Null, "hostile markup ran"),
        ];
        for (ok, what) in checks {
            if !ok {
                return Err(format!("{what}: wrong in {out}"));
            }
        }
        // Streamed a few characters at a time (the page renders from the last block on as it
        // comes), an answer ends rendered as it is whole; a link's reference may come last.
        let blocks = "Title\n=====\n\nSee [the docs][1] and *this\nline*.\n\n- a\n- b\n\n- c\n\n\
            1. one\n\n```\ncode\n```\n\n2. two\n   - nested\n\n> quote\nlazy\n\n\
            text\n| x | y |\n|---|---|\n| 1 | 2 |\n\n---\n\n    indented\n";
        let referenced = format!("{blocks}\n[1]: https://example.com/docs\n");
        for (answer, link) in [(blocks, false), (&referenced, true)] {
            stub_answers(&client, &pieces(answer, 3), json!({})).await?;
            ask_stub(&client, "streamed").await?;
            let same = eval(&client, &format!("(() => {{ const whole = document.createElement('div'); whole.append(markdown({})); return [{LAST_ANSWER}.querySelector('.body').innerHTML, whole.innerHTML]; }})()", json!(answer))).await?;
            let linked = same[0].as_str().unwrap_or_default().contains("href=\"https://example.com/docs\"");
            if same[0] != same[1] || linked != link {
                return Err(format!("streamed, the answer is rendered as {} rather than {}", same[0], same[1]));
            }
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// An answer the renderer could choke on, or one it fails on, is never lost: the question
/// and the answer stay on the page, the answer as text if it cannot be rendered (the
/// hand-written renderer threw on these and the page then deleted both).
#[tokio::test(flavor = "current_thread")]
async fn an_answer_that_fails_to_render_stays_as_text_with_its_question() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        let deep = format!("{} deep", ">".repeat(20_000));
        let answers = [
            ("a heading ending in \\r", "# Heading\r\nOne\u{2028}two".to_string()),
            ("20,000 nested >", deep),
        ];
        for (what, answer) in answers {
            stub_answers(&client, &pieces(&answer, 40), json!({"burst": 5})).await?;
            let text = ask_stub(&client, what).await?;
            if text != json!(answer) {
                return Err(format!("{what}: the answer's text is {text}"));
            }
            let shown = eval(&client, &format!("[document.querySelectorAll('article.user').length, {LAST_ANSWER}.querySelector('.body').textContent.includes('two') || {LAST_ANSWER}.querySelector('.body').textContent.includes('deep')]")).await?;
            if shown[1] != json!(true) {
                return Err(format!("{what}: the answer is not shown ({shown})"));
            }
        }
        // The renderer itself failing: the answer is shown as it came.
        eval(&client, "(window.markdown = window.markdownBlocks = () => { throw new Error('a renderer bug'); }, true)").await?;
        let answer = "**Bold** and more.";
        stub_answers(&client, &pieces(answer, 3), json!({})).await?;
        let text = ask_stub(&client, "the renderer fails").await?;
        let page = eval(&client, &format!("[[...document.querySelectorAll('article.user')].map((a) => a.textContent), {LAST_ANSWER}.querySelector('.body').textContent, document.getElementById('error').hidden]")).await?;
        let questions = json!(["a heading ending in \\r", "20,000 nested >", "the renderer fails"]);
        if text != json!(answer) || page != json!([questions, answer, true]) {
            return Err(format!("after a rendering failure the page shows {page} ({text})"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// An 8 KB answer (headings, lists, tables, code) streamed as 2,000 events, many a read as
/// from a fast model, renders without blocking the page more than 100 ms at a time (the
/// page rendered it whole at every event: 12-17 s of blocked main thread), and whole. A
/// second answer may show it: a busy host can stall the page's thread that long once (the
/// hypervisor, another process on the 2 cores), where a render that blocks does so each time.
#[tokio::test(flavor = "current_thread")]
async fn a_long_streamed_answer_never_blocks_the_page() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    // Timed: no other test's page or model beside it.
    let _alone = alone();
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    let mut answer = String::new();
    let mut parts = 0;
    while answer.len() < 8 * 1024 {
        parts += 1;
        answer += &format!(
            "## Part {parts}\n\nSome **bold** text, *emphasis* and `code` in a paragraph.\n\n\
             1. first\n2. second\n   - nested\n\n| n | square |\n|---|---:|\n| {parts} | {} |\n\n\
             ```rust\nfn part_{parts}() -> u32 {{ {parts} }}\n```\n\n",
            parts * parts
        );
    }
    // 2,000 pieces of 4 or 5 bytes (the answer is ASCII).
    let n = answer.len();
    let events: Vec<String> = (0..2000)
        .map(|i| answer[i * n / 2000..(i + 1) * n / 2000].to_string())
        .collect();
    checked(&client, async {
        stub_answers(&client, &events, json!({"burst": 50})).await?;
        let supported = eval(&client, "PerformanceObserver.supportedEntryTypes.includes('longtask')").await?;
        if supported != json!(true) {
            return Err("this Chromium reports no long tasks".into());
        }
        eval(&client, "(window.longest = 0, new PerformanceObserver((list) => { for (const task of list.getEntries()) longest = Math.max(longest, task.duration); }).observe({ type: 'longtask' }), true)").await?;
        let mut blocked = Vec::new();
        for _ in 0..2 {
            // Once the page has been idle (and so warmed up, as it does when loaded).
            eval(&client, "new Promise((done) => requestIdleCallback(() => done(true)))").await?;
            eval(&client, "(window.longest = 0, true)").await?;
            let text = ask_stub(&client, "A long answer, please.").await?;
            // The observer is told of tasks after they end: a frame later.
            let longest = eval(&client, "new Promise((done) => requestAnimationFrame(() => setTimeout(() => done(longest), 50)))").await?;
            let shown = eval(&client, &format!("(() => {{ const answer = {LAST_ANSWER}; return [answer.querySelectorAll('h4').length, answer.querySelectorAll('table').length, answer.querySelectorAll('pre').length, answer.querySelector('h4:last-of-type')?.textContent]; }})()")).await?;
            eprintln!("{} events: the longest task took {longest} ms", events.len());
            if text != json!(answer) {
                return Err(format!("the answer came as {} bytes, not {}", text.as_str().map_or(0, str::len), answer.len()));
            }
            if shown != json!([parts, parts, parts, format!("Part {parts}")]) {
                return Err(format!("the answer of {parts} parts is rendered as {shown} (h4, tables, code, last heading)"));
            }
            if longest.as_f64().is_some_and(|ms| ms < 100.0) {
                return Ok(());
            }
            blocked.push(longest);
        }
        Err(format!("the page was blocked for {} ms at a time in each of two answers (over {} events each)", json!(blocked), events.len()))
    })
    .await;
    let _ = client.close().await;
}

/// While an answer streams, the live log is `aria-busy`, so that a screen reader reads the
/// answer once when it is done instead of again at each token; then it is not.
#[tokio::test(flavor = "current_thread")]
async fn the_log_is_busy_while_an_answer_streams() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        let answer = "One two three four five six seven eight nine ten.";
        stub_answers(&client, &pieces(answer, 4), json!({"holdAt": 4})).await?;
        fill(&client, "prompt", "Count to ten.\n").await?;
        // Held after four pieces: shown so far, and busy.
        let partial = format!(
            "{LAST_ANSWER}?.querySelector('.body').textContent === {}",
            json!(answer[..16])
        );
        until(&client, &partial, Duration::from_secs(10)).await?;
        let live = "[document.getElementById('log').getAttribute('aria-live'), document.getElementById('log').getAttribute('aria-busy')]";
        let during = eval(&client, live).await?;
        if during != json!(["polite", "true"]) {
            return Err(format!("while streaming the log is {during} (aria-live, aria-busy)"));
        }
        eval(&client, "(stub.hold = false, true)").await?;
        let done = format!("{LAST_ANSWER}.dataset.state === 'done'");
        until(&client, &done, Duration::from_secs(10)).await?;
        let after = eval(&client, live).await?;
        if after != json!(["polite", "false"]) {
            return Err(format!("after the answer the log is {after} (aria-live, aria-busy)"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// The server lost mid-answer (killed): the question and the partial answer stay, and the
/// answer says the connection was lost (the page said "network error" and deleted both).
#[tokio::test(flavor = "current_thread")]
async fn a_lost_connection_keeps_the_partial_answer_and_says_so() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (mut server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        click(&client, "settings-toggle").await?;
        fill(&client, "max-tokens", "2000").await?;
        let question = "Write a very long story about a dragon who learns to cook.";
        fill(&client, "prompt", &format!("{question}\n")).await?;
        until(&client, &format!("{LAST_ANSWER}?.dataset.text?.length > 20"), Duration::from_secs(60)).await?;
        server.child.kill().map_err(|e| e.to_string())?;
        server.child.wait().map_err(|e| e.to_string())?;
        let failed = format!("{LAST_ANSWER}?.dataset.state === 'failed'");
        until(&client, &failed, Duration::from_secs(10)).await?;
        let page = eval(&client, &format!("(() => {{ const answer = {LAST_ANSWER}; return {{
            question: document.querySelector('article.user')?.textContent,
            text: answer.dataset.text, shown: answer.querySelector('.body').textContent,
            note: getComputedStyle(answer, '::after').content,
            error: document.getElementById('error').hidden ? null : document.getElementById('error').textContent,
            ready: !document.getElementById('send').hidden }}; }})()")).await?;
        let text = page["text"].as_str().unwrap_or_default();
        let checks = [
            (page["question"] == json!(question), "the question"),
            (text.len() > 20 && page["shown"].as_str().is_some_and(|s| s.contains(text.trim_end())), "the partial answer"),
            (page["note"] == json!("\"connection lost: the answer is incomplete\""), "the answer's note"),
            (page["error"] == json!("the connection to the server was lost"), "the error"),
            (page["ready"] == json!(true), "Send"),
        ];
        for (ok, what) in checks {
            if !ok {
                return Err(format!("{what}: wrong in {page}"));
            }
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// Over plain HTTP under another host name (an `--allowed-host`, as behind a proxy), the page
/// is no secure context and has no `navigator.clipboard`: Copy still copies, and says so
/// (it silently did nothing).
#[tokio::test(flavor = "current_thread")]
async fn copy_works_over_plain_http_on_another_host_name() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let server = Server::start(&dir, &["--allowed-host", "copytest.example"]);
    let rules = "--host-resolver-rules=MAP copytest.example 127.0.0.1";
    let look = Look {
        args: &[rules],
        ..Look::default()
    };
    let (_driver, _profile, client) = open_browser(&server, &look).await;
    checked(&client, async {
        let port = server.address.rsplit(':').next().unwrap_or_default();
        (client.goto(&format!("http://copytest.example:{port}/")).await).map_err(|e| e.to_string())?;
        until(&client, "typeof markdown === 'function'", Duration::from_secs(20)).await?;
        let context = eval(&client, "[location.hostname, window.isSecureContext, navigator.clipboard === undefined]").await?;
        if context != json!(["copytest.example", false, true]) {
            return Err(format!("the page is not on an insecure host name: {context}"));
        }
        click(&client, "settings-toggle").await?;
        fill(&client, "temperature", "0").await?;
        fill(&client, "max-tokens", "8").await?;
        let answer = ask(&client, "Say hello.").await?;
        // Every label Copy shows, however briefly.
        eval(&client, &format!("(() => {{ const button = {LAST_ANSWER}.querySelector('.copy'); window.labels = []; new MutationObserver(() => labels.push(button.textContent)).observe(button, {{ childList: true, characterData: true, subtree: true }}); button.id = 'copy-last'; return true; }})()")).await?;
        click(&client, "copy-last").await?;
        until(&client, "window.labels.length > 0", Duration::from_secs(5)).await?;
        let labels = eval(&client, "window.labels").await?;
        if labels[0] != json!("Copied") {
            return Err(format!("Copy said {labels}"));
        }
        // What was copied, pasted by the keyboard into the message box.
        fill(&client, "prompt", "").await?;
        let prompt = (client.find(Locator::Id("prompt")).await).map_err(|e| e.to_string())?;
        (prompt.send_keys("\u{E009}v\u{E000}").await).map_err(|e| e.to_string())?;
        let pasted = eval(&client, "document.getElementById('prompt').value").await?;
        if pasted != json!(answer) {
            return Err(format!("pasted {pasted}, not the answer {answer:?}"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// Hebrew and Arabic read right to left (each message and block takes its direction from its
/// own text), and on a phone's 375 pixels nothing widens the page: long words and addresses
/// break, code and tables scroll in their own box.
#[tokio::test(flavor = "current_thread")]
async fn messages_take_their_direction_and_fit_a_phone_screen() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let server = Server::start(&dir, &[]);
    let look = Look {
        phone: true,
        ..Look::default()
    };
    let (_driver, _profile, client) = open_browser(&server, &look).await;
    checked(&client, async {
        let long = "x".repeat(300);
        let answer = format!(
            "مرحبا بك، كيف يمكنني المساعدة؟\n\nAn English paragraph.\n\n\
             ### {long}\n\n- {long}\n- https://example.com/{long}\n\n`{long}` and [a link](https://example.com/{long})\n\n\
             | a | b | c |\n|---|---|---|\n| {long} | {long} | {long} |\n\n```\n{long}\n```\n"
        );
        stub_answers(&client, &pieces(&answer, 50), json!({"burst": 10})).await?;
        ask_stub(&client, "שלום, מה שלומך?").await?;
        let page = eval(&client, &format!("(() => {{
            const answer = {LAST_ANSWER};
            const direction = (node) => node && getComputedStyle(node).direction;
            const fits = (node) => node.scrollWidth <= node.clientWidth;
            return {{
                width: window.innerWidth,
                question: direction(document.querySelector('article.user .body')),
                arabic: direction(answer.querySelector('.body p')),
                english: direction(answer.querySelectorAll('.body p')[1]),
                page: fits(document.documentElement) && fits(document.body),
                log: fits(document.getElementById('log')),
                messages: [...document.querySelectorAll('article')].every(fits),
                blocks: [...answer.querySelectorAll('.body > *, li')].filter((e) => !fits(e)).map((e) => e.localName),
                scrolling: [...answer.querySelectorAll('pre, .table')].map((e) => [e.localName, getComputedStyle(e).overflowX, e.scrollWidth > e.clientWidth]),
            }}; }})()")).await?;
        let expected = json!({
            "width": 375, "question": "rtl", "arabic": "rtl", "english": "ltr",
            "page": true, "log": true, "messages": true, "blocks": ["div", "pre"],
            "scrolling": [["div", "auto", true], ["pre", "auto", true]],
        });
        if page != expected {
            return Err(format!("at 375 pixels the page is {page}, not {expected}"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// A cleared Temperature or Max tokens is left out of the request (the server's default):
/// it was sent as 0, and a max_tokens of 0 is refused (400).
#[tokio::test(flavor = "current_thread")]
async fn cleared_settings_are_left_out_of_the_request() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        stub_answers(&client, &pieces("Hello.", 2), json!({})).await?;
        click(&client, "settings-toggle").await?;
        fill(&client, "temperature", "").await?;
        fill(&client, "max-tokens", "").await?;
        ask_stub(&client, "Hi").await?;
        fill(&client, "temperature", "0.5").await?;
        fill(&client, "max-tokens", "64").await?;
        ask_stub(&client, "Hi again").await?;
        let sent = eval(&client, "stub.requests.map((r) => [r.temperature ?? null, r.max_tokens ?? null, 'temperature' in r, 'max_tokens' in r])").await?;
        let expected = json!([[null, null, false, false], [0.5, 64, true, true]]);
        if sent != expected {
            return Err(format!("sent {sent} (temperature, max_tokens, present), not {expected}"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}

/// Contrast, computed from what Chromium draws, of a JavaScript list of [selector, pseudo
/// element] pairs: each pair's ratio (WCAG 2), its text over its background, the
/// backgrounds of its ancestors blended in and its opacity applied.
const CONTRAST: &str = r#"((pairs) => {
  const rgba = (css) => {
    const m = css.match(/^rgba?\(([\d.]+),? ([\d.]+),? ([\d.]+)(?:[,/] ?([\d.]+))?\)$/);
    if (!m) throw new Error(`not an rgb colour: ${css}`);
    return [+m[1], +m[2], +m[3], m[4] === undefined ? 1 : +m[4]];
  };
  const over = ([r, g, b, a], [R, G, B]) => [r * a + R * (1 - a), g * a + G * (1 - a), b * a + B * (1 - a)];
  const luminance = (rgb) => {
    const [r, g, b] = rgb.map((c) => (c /= 255) <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  return pairs.map(([selector, pseudo]) => {
    const node = document.querySelector(selector);
    if (!node) return [selector, pseudo, null];
    const chain = [];
    for (let e = node; e; e = e.parentElement) chain.unshift(e);
    let background = [255, 255, 255];
    let opacity = 1;
    for (const e of chain) {
      const style = getComputedStyle(e);
      background = over(rgba(style.backgroundColor), background);
      opacity *= +style.opacity;
    }
    const [r, g, b, a] = rgba(getComputedStyle(node, pseudo).color);
    const text = over([r, g, b, a * opacity], background);
    const [light, dark] = [luminance(text), luminance(background)].sort((x, y) => y - x);
    return [selector, pseudo, Math.round(((light + 0.05) / (dark + 0.05)) * 100) / 100];
  });
})"#;

/// Every text on the page is at least 4.5:1 against its background (WCAG AA), in light and
/// dark colours: Copy was 4.45:1, the dark placeholder 3.69:1.
#[tokio::test(flavor = "current_thread")]
async fn text_meets_wcag_aa_contrast_in_light_and_dark() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let server = Server::start(&dir, &[]);
    let pairs = json!([
        ["#model", null],
        ["#new", null],
        ["#settings-toggle", null],
        ["label[for=system]", null],
        ["#system", null],
        ["#system", "::placeholder"],
        ["#prompt", "::placeholder"],
        ["#key", "::placeholder"],
        ["#temperature", null],
        ["#send", null],
        ["#stop", null],
        ["#error", null],
        ["#empty", null],
        ["article.user .body p", null],
        ["article.assistant .body p", null],
        ["article.assistant a", null],
        ["article.assistant blockquote", null],
        ["article.assistant li", null],
        ["article.assistant p code", null],
        ["article.assistant pre code", null],
        ["article.assistant td", null],
        ["article.assistant .copy", null],
        ["article.assistant", "::after"],
    ]);
    let answer = "Some text with [a link](https://example.com/) and `code`.\n\n> A quote.\n\n\
                  - an item\n\n| a |\n|---|\n| b |\n\n```\ncode block\n```\n";
    for (scheme, args) in [("light", &[][..]), ("dark", &["--force-dark-mode"][..])] {
        let look = Look {
            args,
            ..Look::default()
        };
        let (_driver, _profile, client) = open_browser(&server, &look).await;
        checked(&client, async {
            let dark = eval(
                &client,
                "matchMedia('(prefers-color-scheme: dark)').matches",
            )
            .await?;
            if dark != json!(scheme == "dark") {
                return Err(format!("{scheme}: prefers-color-scheme: dark is {dark}"));
            }
            let hint = eval(&client, &format!("{CONTRAST}([['#empty', null]])")).await?;
            stub_answers(&client, &pieces(answer, 8), json!({"finish": "length"})).await?;
            click(&client, "settings-toggle").await?;
            ask_stub(&client, "Hi").await?;
            eval(&client, "(showError('an error'), true)").await?;
            let mut ratios = eval(&client, &format!("{CONTRAST}({pairs})")).await?;
            ratios[12] = hint[0].clone();
            let low: Vec<&Value> = (ratios.as_array().into_iter().flatten())
                .filter(|pair| !pair[2].as_f64().is_some_and(|ratio| ratio >= 4.5))
                .collect();
            if !low.is_empty() {
                return Err(format!(
                    "{scheme}: below 4.5:1 (selector, pseudo element, ratio): {low:?}"
                ));
            }
            Ok(())
        })
        .await;
        let _ = client.close().await;
    }
}

/// The page has an icon, from this origin under the same policy, and `/favicon.ico` (which
/// browsers ask for) is one too: it was a 404, a console error on every visit. Everything
/// the page loads loads.
#[tokio::test(flavor = "current_thread")]
async fn the_page_has_an_icon_and_loads_whole() {
    let Some(dir) = artifact_dir() else { return };
    if !browser_available() {
        return;
    }
    let (_server, _driver, _profile, client) = open_page(&dir, &[]).await;
    checked(&client, async {
        let icons = eval(&client, "Promise.all([document.querySelector('link[rel=icon]')?.href ?? 'none', '/favicon.ico'].map(async (url) => {
            const image = new Image();
            image.src = url;
            const drawn = await image.decode().then(() => image.naturalWidth > 0, () => false);
            const response = await fetch(url);
            return [response.status, response.headers.get('content-type'), drawn];
        }))").await?;
        let expected = json!([[200, "image/svg+xml", true], [200, "image/svg+xml", true]]);
        if icons != expected {
            return Err(format!("the icons: {icons} (status, type, drawn), not {expected}"));
        }
        let failed = eval(&client, "performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource')).filter((e) => e.responseStatus !== 200).map((e) => [e.name, e.responseStatus])").await?;
        if failed != json!([]) {
            return Err(format!("the page loaded with failures: {failed}"));
        }
        Ok(())
    })
    .await;
    let _ = client.close().await;
}
