// The chat page: one conversation at a time, each answer streamed from
// /v1/chat/completions (server-sent events), the public API any client uses.
// No framework and no network beyond this server: the page must work offline, from inside
// the binary, under a Content-Security-Policy that allows nothing inline.
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

async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const comment = block.split("\n").find((line) => line.startsWith(":"));
      if (comment) yield { comment: comment.slice(1).trim() };
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

// --- markdown, built as DOM nodes (never innerHTML: model output is untrusted) ---

const LIST_ITEM = /^\s*([-*+]|\d+[.)])\s+/;
const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)/;

function element(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

function startsBlock(line) {
  return FENCE.test(line) || /^#{1,6}\s/.test(line) || LIST_ITEM.test(line) || line.startsWith(">");
}

// Code fences (an unclosed one runs to the end: the answer may still be streaming),
// headings, lists, quotes and paragraphs.
function markdown(source) {
  const root = document.createDocumentFragment();
  const lines = source.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      const code = [];
      for (i++; i < lines.length && !lines[i].trimStart().startsWith(fence[1]); i++) {
        code.push(lines[i]);
      }
      i++;
      const block = element("code", code.join("\n"));
      if (fence[2]) block.dataset.lang = fence[2];
      const pre = element("pre");
      pre.append(block);
      root.append(pre);
    } else if (/^#{1,6}\s/.test(line)) {
      const [, marks, text] = line.match(/^(#{1,6})\s+(.*)$/);
      root.append(inline(element(`h${Math.min(marks.length + 2, 6)}`), text));
      i++;
    } else if (LIST_ITEM.test(line)) {
      const list = element(/^\s*\d/.test(line) ? "ol" : "ul");
      for (; i < lines.length && LIST_ITEM.test(lines[i]); i++) {
        list.append(inline(element("li"), lines[i].replace(LIST_ITEM, "")));
      }
      root.append(list);
    } else if (line.startsWith(">")) {
      const quoted = [];
      for (; i < lines.length && lines[i].startsWith(">"); i++) {
        quoted.push(lines[i].replace(/^>\s?/, ""));
      }
      const quote = element("blockquote");
      quote.append(markdown(quoted.join("\n")));
      root.append(quote);
    } else if (!line.trim()) {
      i++;
    } else {
      const paragraph = [];
      for (; i < lines.length && lines[i].trim() && !startsBlock(lines[i]); i++) {
        paragraph.push(lines[i]);
      }
      root.append(inline(element("p"), paragraph.join("\n")));
    }
  }
  return root;
}

// `code`, **bold**, *italic* / _italic_ (not inside snake_case words), and links to
// http(s) addresses only (no javascript: or data: URLs from a model).
const INLINE =
  /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|(?<!\w)_([^_\s][^_]*)_(?!\w)|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;

function inline(parent, text) {
  let at = 0;
  for (const m of text.matchAll(INLINE)) {
    parent.append(text.slice(at, m.index));
    if (m[1]) {
      parent.append(element("code", m[2].trim()));
    } else if (m[3] !== undefined) {
      parent.append(inline(element("strong"), m[3]));
    } else if (m[4] !== undefined || m[5] !== undefined) {
      parent.append(inline(element("em"), m[4] ?? m[5]));
    } else {
      const link = element("a", m[6]);
      link.href = m[7];
      link.rel = "noopener noreferrer";
      link.target = "_blank";
      parent.append(link);
    }
    at = m.index + m[0].length;
  }
  parent.append(text.slice(at));
  return parent;
}

// --- the conversation on the page ---

function addMessage(role, text) {
  $("empty").hidden = true;
  const view = element("article");
  view.className = `message ${role}`;
  const body = element("div");
  body.className = "body";
  view.append(body);
  if (role === "assistant") {
    const copy = element("button", "Copy");
    copy.type = "button";
    copy.className = "copy";
    copy.addEventListener("click", () => navigator.clipboard?.writeText(view.dataset.text ?? ""));
    view.append(copy);
  }
  $("log").append(view);
  // A new turn is always brought into view.
  $("log").scrollTop = $("log").scrollHeight;
  show(view, text, "");
  return view;
}

// The answer so far: its text kept whole in data-text (what Copy copies), rendered as
// markdown, with a model's reasoning (`reasoning_content`) folded above it.
function show(view, text, reasoning) {
  const log = $("log");
  // Follow the answer only if the person is at the bottom: not while they read above.
  const following = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  view.dataset.text = text;
  const body = view.querySelector(".body");
  body.replaceChildren();
  if (reasoning) {
    const details = element("details");
    details.append(element("summary", "Thinking"), element("div", reasoning));
    body.append(details);
  }
  if (view.classList.contains("user")) {
    body.append(element("p", text));
  } else {
    body.append(markdown(text));
  }
  if (following) log.scrollTop = log.scrollHeight;
}

function setBusy(controller) {
  state.controller = controller;
  $("send").hidden = Boolean(controller);
  $("stop").hidden = !controller;
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
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  if (state.model) request.model = state.model;
  const controller = new AbortController();
  setBusy(controller);
  let answer = "";
  let reasoning = "";
  let finish = null;
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
      show(view, answer, reasoning);
    }
    view.dataset.state = "done";
    if (finish === "length") view.dataset.note = "max tokens reached";
    conversation.push({ role: "assistant", content: answer });
  } catch (error) {
    if (controller.signal.aborted) {
      // Stopped: what came so far stays, as the conversation's answer.
      view.dataset.state = "stopped";
      view.dataset.note = "stopped";
      conversation.push({ role: "assistant", content: answer });
    } else {
      // Failed: the turn is taken back and its text returned to the box, to send again.
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
});
