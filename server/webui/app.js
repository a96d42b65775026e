// The chat page: one conversation at a time, each answer streamed from
// /v1/chat/completions (server-sent events), the public API any client uses.
// No framework and no network beyond this server: the page must work offline, from inside
// the binary, under a Content-Security-Policy that allows nothing inline. Markdown is parsed
// by markdown-it (vendor/markdown-it.min.js, loaded before this file), whose tokens are
// built here into DOM nodes: model output never becomes HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "runtime-api-key";

const state = {
  model: null,
  // The conversation as the API gets it: {role, content} turns, without the system prompt
  // (read from its box at each request, so an edit applies to the next answer).
  messages: [],
  // The AbortController of the answer under way: aborting it closes the connection, and
  // the server drops the request before its next token.
  controller: null,
};

// --- the API key: the tab's sessionStorage, or localStorage if the person asks ---

function apiKey() {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY) ?? "";
}

function saveKey() {
  const key = $("key").value.trim();
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
  if (key) ($("remember").checked ? localStorage : sessionStorage).setItem(KEY, key);
  $("key").value = "";
  loadModel();
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// --- errors shown to the person ---

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The message of OpenAI's error envelope, or the status line.
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    message = (await response.json()).error?.message ?? message;
  } catch {
    // not JSON: the status line says it
  }
  return new ApiError(response.status, message);
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function askForKey(message) {
  showError(message);
  $("settings").hidden = false;
  $("settings-toggle").setAttribute("aria-expanded", "true");
  $("key-box").hidden = false;
  $("key").focus();
}

function report(error) {
  if (error.status === 401) {
    askForKey(`${error.message}: enter the server's API key in Settings.`);
  } else if (error instanceof TypeError) {
    // fetch's own failure: no answer from the server at all.
    showError(`the server could not be reached (${error.message})`);
  } else {
    showError(error.message || String(error));
  }
}

// --- the model's name ---

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw await failure(response);
    state.model = (await response.json()).data?.[0]?.id ?? null;
    $("model").textContent = state.model ?? "no model";
    showError("");
  } catch (error) {
    report(error);
  }
}

// --- server-sent events: each `data:` payload, parsed, until [DONE]; a comment (the
// server's `: waiting for a free slot` while the request is queued) as {comment} ---

// The stream broke before [DONE]: the server was stopped, or the network failed.
class ConnectionLost extends Error {
  constructor() {
    super("the connection to the server was lost");
  }
}

async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    let read;
    try {
      read = await reader.read();
    } catch {
      throw new ConnectionLost();
    }
    if (read.done) throw new ConnectionLost();
    buffer += read.value.replace(/\r\n?/g, "\n");
    // One read may hold many events (a fast model, a slow page): split once, not per event.
    const blocks = buffer.split("\n\n");
    buffer = blocks.pop();
    for (const block of blocks) {
      const lines = block.split("\n");
      const comment = lines.find((line) => line.startsWith(":"));
      if (comment) yield { comment: comment.slice(1).trim() };
      const data = lines
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

// --- markdown: markdown-it parses it (CommonMark, with GFM tables and strikethrough), and
// its tokens are built here as DOM nodes, never HTML: model output is untrusted. Raw HTML in
// it stays text (html: false), only the elements below are made, links only to http(s). ---

const md = markdownit({
  html: false,
  linkify: false,
  typographer: false,
  // A single newline breaks the line, as a model writing plain text means it.
  breaks: true,
  // Past this depth markdown-it leaves out what is nested (see markdownBlocks()); 20 is
  // CommonMark's preset, far deeper than answers go, and keeps the page from 20,000 levels.
  maxNesting: 20,
});
// No javascript:, data: or relative links from a model: such a link stays as written, text.
md.validateLink = (url) => /^https?:\/\//i.test(url);

// Each construct once, rendered when the page is idle (see the end of this file).
const WARM_UP = `# a

1. *b* **c** \`d\` [e](https://e.example/)
   - f

> g

| h |
|--:|
| i |

~~~
j
~~~`;

// What markdown-it makes with html off; a token for anything else becomes a <span>.
const TAGS = new Set(
  "p h3 h4 h5 h6 blockquote ul ol li table thead tbody tr th td strong em s a hr br".split(" "),
);
// Each takes its direction from its own text: a Hebrew paragraph right to left, an English
// one left to right, in the same answer.
const DIRECTED = new Set("p h3 h4 h5 h6 blockquote ul ol li table th td".split(" "));

function element(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

// `source` rendered: what the page's tests call.
function markdown(source) {
  const root = document.createDocumentFragment();
  root.append(...markdownBlocks(source).nodes);
  return root;
}

// `source`'s top-level blocks as DOM nodes, one each, and where in `source` the last starts.
function markdownBlocks(source) {
  const tokens = md.parse(source, {});
  // Nested to the limit (a model's 20,000 `>`): markdown-it dropped what was inside, so the
  // text is shown as it came instead.
  if (tokens.some((token) => token.nesting === 1 && token.level >= md.options.maxNesting - 1)) {
    return { nodes: [element("p", source)], last: 0 };
  }
  const root = document.createDocumentFragment();
  build(root, tokens);
  const line = tokens.findLast((token) => token.level === 0 && token.map)?.map[0] ?? 0;
  // Where that line starts, its lines counted as markdown-it counts them.
  const newline = /\r\n?|\n/g;
  let last = 0;
  for (let i = 0; i < line && newline.exec(source); i++) last = newline.lastIndex;
  return { nodes: [...root.childNodes], last };
}

// Appends `tokens` (a block's, or an inline token's children) to `parent`: an opening token's
// element holds what follows it until its closing token.
function build(parent, tokens) {
  const open = [parent];
  for (const token of tokens) {
    const into = open.at(-1);
    if (token.nesting === -1) {
      open.pop();
    } else if (token.nesting === 1) {
      // A tight list's paragraphs are hidden: their text goes straight into the item.
      open.push(token.hidden ? into : opening(into, token));
    } else {
      leaf(into, token);
    }
  }
}

// The element an opening token makes, appended to `parent`: what its content goes into.
function opening(parent, token) {
  const heading = /^h([1-6])$/.exec(token.tag);
  // Headings from h3: the answer's `#` is below the page's own.
  const name = heading ? `h${Math.min(Number(heading[1]) + 2, 6)}` : token.tag;
  const node = element(TAGS.has(name) ? name : "span");
  if (DIRECTED.has(node.localName)) node.dir = "auto";
  if (node.localName === "ol" && token.attrGet("start")) {
    // A list split by a code block or a paragraph goes on with its numbering.
    node.start = Number(token.attrGet("start"));
  }
  // A table column's alignment, set through the DOM (a style attribute would break the policy).
  const align = /text-align:(left|center|right)/.exec(token.attrGet("style") ?? "");
  if (align) node.style.textAlign = align[1];
  if (node.localName === "a") {
    const href = token.attrGet("href") ?? "";
    // markdown-it checked it (validateLink); checked again here, where it becomes a link.
    if (/^https?:\/\//i.test(href)) {
      node.href = href;
      node.rel = "noopener noreferrer";
      node.target = "_blank";
    }
    if (token.attrGet("title")) node.title = token.attrGet("title");
  }
  if (node.localName === "table") {
    // A wide table scrolls in its own box, not the page.
    const box = element("div");
    box.className = "table";
    box.append(node);
    parent.append(box);
  } else {
    parent.append(node);
  }
  return node;
}

function leaf(parent, token) {
  switch (token.type) {
    case "inline":
      build(parent, token.children);
      break;
    case "code_inline":
      parent.append(element("code", token.content));
      break;
    case "fence":
    case "code_block": {
      const code = element("code", token.content.replace(/\n$/, ""));
      const lang = token.info.trim().split(/\s+/)[0];
      if (lang) code.dataset.lang = lang;
      const pre = element("pre");
      pre.dir = "ltr";
      pre.append(code);
      parent.append(pre);
      break;
    }
    case "hardbreak":
      parent.append(element("br"));
      break;
    case "softbreak":
      parent.append("\n");
      break;
    case "hr":
      parent.append(element("hr"));
      break;
    default:
      // Text, and an image's description (images are not fetched: the policy allows none).
      parent.append(token.content);
  }
}

// --- the conversation on the page ---

// Copies `text` with the Clipboard API where the page is a secure context (https, or
// localhost); else (plain http under another name: no navigator.clipboard) through a
// selected, hidden textarea. Whether it was copied.
async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = element("textarea");
    area.value = text;
    area.className = "offscreen";
    area.readOnly = true;
    area.setAttribute("aria-hidden", "true");
    document.body.append(area);
    area.select();
    try {
      return document.execCommand("copy");
    } catch {
      return false;
    } finally {
      area.remove();
    }
  }
}

function addMessage(role, text) {
  $("empty").hidden = true;
  const view = element("article");
  view.className = `message ${role}`;
  const body = element("div");
  body.className = "body";
  // The person's text takes its direction from itself (the answer's blocks from theirs).
  body.dir = "auto";
  view.append(body);
  if (role === "assistant") {
    const button = element("button", "Copy");
    button.type = "button";
    button.className = "copy";
    button.addEventListener("click", async () => {
      const copied = await copy(view.dataset.text ?? "");
      button.textContent = copied ? "Copied" : "Copy failed";
      button.focus();
      setTimeout(() => (button.textContent = "Copy"), 2000);
    });
    view.append(button);
  }
  $("log").append(view);
  // A new turn is always brought into view.
  $("log").scrollTop = $("log").scrollHeight;
  show(view, text, "");
  return view;
}

// The answer so far: its text kept whole in data-text (what Copy copies), rendered as
// markdown, with a model's reasoning (`reasoning_content`) folded above it. `final`: the
// whole answer has come (see renderAnswer()).
function show(view, text, reasoning, final = true) {
  const log = $("log");
  // Follow the answer only if the person is at the bottom: not while they read above.
  const following = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  view.dataset.text = text;
  const body = view.querySelector(".body");
  if (reasoning) {
    // Made once, so that it stays open if the person opens it while the answer streams.
    let thinking = view.querySelector(":scope > details");
    if (!thinking) {
      thinking = element("details");
      thinking.dir = "auto";
      thinking.append(element("summary", "Thinking"), element("div"));
      view.insertBefore(thinking, body);
    }
    thinking.lastChild.textContent = reasoning;
  }
  if (view.classList.contains("user")) {
    body.replaceChildren(element("p", text));
  } else {
    renderAnswer(body, text, final);
  }
  if (following) log.scrollTop = log.scrollHeight;
}

// Per answer's body: how much of its text its first blocks were rendered from for good, and
// how many. More text can change only an answer's last block, so each frame parses the text
// from the last block on: it costs what that block does, not the whole answer. The
// exception is a link reference (`[1]: https://...`), which may come after the links that
// use it: with one, the final rendering parses the whole answer.
const settled = new WeakMap();
const REFERENCE = /^ {0,3}\[[^\]]+\]:/m;

// Renders `text` into `body`, replacing only the blocks that changed (mostly the last):
// laying the whole answer out again would cost more than parsing it, and would lose a
// selection in it. A rendering failure shows the text as it is: never lost to a bug here.
function renderAnswer(body, text, final) {
  const whole = final && REFERENCE.test(text);
  let kept = (!whole && settled.get(body)) || { length: 0, count: 0 };
  let rest;
  try {
    rest = markdownBlocks(text.slice(kept.length));
  } catch (error) {
    console.error("the answer is shown as text: rendering it failed", error);
    kept = { length: 0, count: 0 };
    rest = { nodes: [element("p", text)], last: 0 };
  }
  const shown = [...body.childNodes];
  const blocks = [...shown.slice(0, kept.count), ...rest.nodes];
  let same = kept.count;
  while (same < shown.length && same < blocks.length && shown[same].isEqualNode(blocks[same])) {
    same++;
  }
  for (const node of shown.slice(same)) node.remove();
  body.append(...blocks.slice(same));
  const count = kept.count + Math.max(rest.nodes.length - 1, 0);
  settled.set(body, { length: kept.length + rest.last, count });
}

function setBusy(controller) {
  state.controller = controller;
  $("send").hidden = Boolean(controller);
  $("stop").hidden = !controller;
  // While an answer streams, the live log is busy: a screen reader reads it once, at the
  // end, not again at each token.
  $("log").setAttribute("aria-busy", String(Boolean(controller)));
}

async function send(text) {
  showError("");
  const system = $("system").value.trim();
  // This conversation's turns: a new conversation started meanwhile gets its own array.
  const conversation = state.messages;
  const turn = { role: "user", content: text };
  conversation.push(turn);
  const asked = addMessage("user", text);
  const view = addMessage("assistant", "");
  view.dataset.state = "streaming";
  const request = {
    messages: system ? [{ role: "system", content: system }, ...conversation] : conversation,
    stream: true,
  };
  // A cleared field is left out (the server's default), not sent as 0.
  const temperature = $("temperature").valueAsNumber;
  if (!Number.isNaN(temperature)) request.temperature = temperature;
  const maxTokens = $("max-tokens").valueAsNumber;
  if (!Number.isNaN(maxTokens)) request.max_tokens = maxTokens;
  if (state.model) request.model = state.model;
  const controller = new AbortController();
  setBusy(controller);
  let answer = "";
  let reasoning = "";
  let finish = null;
  // Rendered at most once a frame: a long answer comes as thousands of events, and parsing
  // it whole at each would block the page for seconds (Stop could not even be clicked).
  let frame = 0;
  const render = (final) => {
    cancelAnimationFrame(frame);
    frame = 0;
    show(view, answer, reasoning, final);
  };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(request),
      signal: controller.signal,
    });
    if (!response.ok) throw await failure(response);
    for await (const chunk of events(response.body)) {
      if (chunk.comment) {
        // Queued: said under the answer until its first chunk.
        view.dataset.note = chunk.comment;
        continue;
      }
      delete view.dataset.note;
      if (chunk.error) throw new ApiError(0, chunk.error.message);
      const choice = chunk.choices?.[0];
      answer += choice?.delta?.content ?? "";
      reasoning += choice?.delta?.reasoning_content ?? "";
      finish = choice?.finish_reason ?? finish;
      frame ||= requestAnimationFrame(() => render(false));
    }
    render(true);
    view.dataset.state = "done";
    if (finish === "length") view.dataset.note = "max tokens reached";
    conversation.push({ role: "assistant", content: answer });
  } catch (error) {
    render(true);
    if (controller.signal.aborted) {
      // Stopped: what came so far stays, as the conversation's answer.
      view.dataset.state = "stopped";
      view.dataset.note = "stopped";
      conversation.push({ role: "assistant", content: answer });
    } else if (answer || reasoning) {
      // Cut off mid-answer (the server lost, or failing): what came stays, as the
      // conversation's answer, and says it is incomplete.
      view.dataset.state = "failed";
      view.dataset.note =
        error instanceof ConnectionLost
          ? "connection lost: the answer is incomplete"
          : `the answer is incomplete: ${error.message}`;
      conversation.push({ role: "assistant", content: answer });
      report(error);
    } else {
      // Failed before any answer: the turn is taken back and its text returned to the box,
      // to send again.
      conversation.splice(conversation.indexOf(turn), 1);
      asked.remove();
      view.remove();
      if (!$("prompt").value) $("prompt").value = text;
      report(error);
    }
  } finally {
    setBusy(null);
    $("prompt").focus();
  }
}

function newConversation() {
  state.controller?.abort();
  state.messages = [];
  $("log").replaceChildren($("empty"));
  $("empty").hidden = false;
  showError("");
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("new").addEventListener("click", newConversation);
  $("settings-toggle").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  });
  $("key-save").addEventListener("click", saveKey);
  $("key").addEventListener("keydown", (event) => {
    if (event.key === "Enter") saveKey();
  });
  loadModel();
  $("prompt").focus();
  // The first answer would wait for the parser's code to be compiled and the fonts of its
  // elements to be loaded: both are done once when the page is idle, on a sample out of sight.
  (window.requestIdleCallback ?? setTimeout)(() => {
    const body = element("div");
    body.className = "body";
    body.append(markdown(WARM_UP));
    const sample = element("div");
    sample.className = "message assistant offscreen";
    sample.setAttribute("aria-hidden", "true");
    sample.append(body);
    document.body.append(sample);
    sample.getBoundingClientRect();
    sample.remove();
  });
});
