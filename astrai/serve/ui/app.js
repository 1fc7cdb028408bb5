// The chat page: talks to this server's /v1/models and /v1/chat/completions (stream: true)
// with plain fetch; no framework, no build step, nothing loaded from another origin.
import { renderMarkdown, splitThinking } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const KEY = "astrai-api-key";  // sessionStorage: kept for this tab only, gone when it closes
const messages = [];  // the conversation sent to the server: {role, content}
let controller = null;  // the AbortController of the reply streaming now
let epoch = 0;  // bumped by New chat: a reply of an earlier conversation is not kept

// --- the API key: asked only when the server answers 401 -------------------------------

function authHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function askKey(wrong) {
  const dialog = $("keydialog");
  $("keynote").textContent = wrong ? "That key was refused; try again." : "This server needs an API key.";
  $("key").value = "";
  dialog.showModal();
  return new Promise((resolve, reject) => {
    dialog.addEventListener("close", () => {
      const key = $("key").value.trim();
      if (dialog.returnValue === "ok" && key) {
        sessionStorage.setItem(KEY, key);
        resolve();
      } else {
        reject(new Error("an API key is needed to talk to this server"));
      }
    }, { once: true });
  });
}

/** fetch() with the key; on 401 asks for the key and tries again. */
async function api(path, init = {}) {
  for (;;) {
    const response = await fetch(path, { ...init, headers: authHeaders() });
    if (response.status !== 401) return response;
    await askKey(sessionStorage.getItem(KEY) !== null);
  }
}

async function errorText(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `the server answered ${response.status}`;
  }
}

// --- models: the base and its LoRA adapters, from /v1/models ----------------------------

async function loadModels() {
  const response = await api("v1/models");
  if (!response.ok) throw new Error(await errorText(response));
  const select = $("model");
  select.replaceChildren();
  for (const card of (await response.json()).data) {
    const label = card.parent ? `${card.id} (adapter on ${card.parent})` : card.id;
    select.append(new Option(label, card.id));
  }
}

// --- the conversation view ---------------------------------------------------------------

function addMessage(role) {
  const node = document.createElement("article");
  node.className = `message ${role}`;
  const body = document.createElement("div");
  body.className = "body";
  node.append(body);
  $("log").append(node);
  return node;
}

function scrollDown() {
  const log = $("log");
  log.scrollTop = log.scrollHeight;
}

/** An assistant reply being streamed: thinking (collapsed), answer, stats. */
class Reply {
  constructor() {
    this.node = addMessage("assistant");
    this.think = document.createElement("details");
    this.think.className = "thinking";
    this.think.hidden = true;
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    this.thinkBody = document.createElement("div");
    this.think.append(summary, this.thinkBody);
    this.node.prepend(this.think);
    this.stats = document.createElement("footer");
    this.stats.className = "stats";
    this.node.append(this.stats);
    this.pending = false;
  }

  /** Re-render on the next frame (a burst of deltas costs one render). */
  update(content, reasoning) {
    this.content = content;
    this.reasoning = reasoning;
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => this.render());
  }

  render() {
    this.pending = false;
    const split = splitThinking(this.content);
    const thinking = [this.reasoning, split.thinking].filter((t) => t.trim()).join("\n\n");
    this.think.hidden = thinking === "";
    this.thinkBody.replaceChildren(renderMarkdown(thinking));
    this.node.querySelector(".body").replaceChildren(renderMarkdown(split.answer));
    this.answer = split.answer;
    scrollDown();
  }
}

function formatStats(s) {
  const parts = [];
  if (s.tokens !== null) parts.push(`${s.approximate ? "≈" : ""}${s.tokens} tokens`);
  if (s.first !== null && s.tokens > 1 && s.end > s.first) {
    parts.push(`${((s.tokens - 1) / ((s.end - s.first) / 1000)).toFixed(1)} tok/s`);
  }
  if (s.first !== null) parts.push(`TTFT ${Math.round(s.first - s.start)} ms`);
  if (s.model) parts.push(s.model);
  if (s.stopped) parts.push("stopped");
  return parts.join(" · ");
}

// --- streaming -----------------------------------------------------------------------------

/** The JSON events of a server-sent-events body, until [DONE]. */
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");  // SSE allows CRLF and CR line ends
    let cut;
    while ((cut = buffer.indexOf("\n\n")) !== -1) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trim()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

function number(id) {
  const value = $(id).valueAsNumber;
  return Number.isFinite(value) ? value : undefined;
}

function requestBody() {
  return JSON.stringify({
    model: $("model").value || undefined,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: number("temperature"),
    top_p: number("top_p"),
    max_tokens: number("max_tokens"),
  });
}

/** Stream one assistant reply to the conversation so far. */
async function generate() {
  const reply = new Reply();
  const stats = { start: performance.now(), first: null, end: null, tokens: null,
                  model: null, stopped: false, approximate: false };
  const text = { content: "", reasoning: "", chunks: 0 };
  const conversation = epoch;
  controller = new AbortController();
  setBusy(true);
  try {
    const response = await api("v1/chat/completions",
                               { method: "POST", body: requestBody(), signal: controller.signal });
    if (!response.ok) throw new Error(await errorText(response));
    for await (const event of events(response.body)) {
      if (event.error) throw new Error(event.error.message);
      stats.model = event.model ?? stats.model;
      if (event.usage) stats.tokens = event.usage.completion_tokens;
      const delta = event.choices?.[0]?.delta;
      if (!delta || !(delta.content || delta.reasoning_content)) continue;
      stats.first ??= performance.now();
      text.chunks++;
      text.content += delta.content ?? "";
      text.reasoning += delta.reasoning_content ?? "";
      reply.update(text.content, text.reasoning);
    }
  } catch (e) {
    if (e.name === "AbortError") stats.stopped = true;
    else showError(e.message);
  }
  stats.end = performance.now();
  if (conversation === epoch) finish(reply, stats, text);  // else New chat dropped it
}

/** A reply's end: its final render and stats, and its answer added to the history. */
function finish(reply, stats, text) {
  controller = null;
  if (stats.tokens === null) {  // a stopped stream has no usage: count its chunks
    stats.tokens = text.chunks;
    stats.approximate = true;
  }
  reply.update(text.content, text.reasoning);
  reply.render();
  reply.stats.textContent = formatStats(stats);
  if (stats.model) reply.node.dataset.model = stats.model;
  // the answer without its thinking goes back to the model, as the OpenAI API expects
  if (text.content || text.reasoning) messages.push({ role: "assistant", content: reply.answer });
  else reply.node.remove();
  setBusy(false);
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  $("regenerate").hidden = busy || messages.length === 0;
}

function showError(text) {
  const error = $("error");
  error.textContent = text;
  error.hidden = false;
}

// --- actions -------------------------------------------------------------------------------

async function send(event) {
  event.preventDefault();
  const text = $("input").value;
  if (!text.trim() || controller) return;
  $("input").value = "";
  $("error").hidden = true;
  messages.push({ role: "user", content: text });
  addMessage("user").querySelector(".body").textContent = text;
  scrollDown();
  await generate();
}

async function regenerate() {
  if (controller || messages.length === 0) return;
  if (messages.at(-1).role === "assistant") {
    messages.pop();
    [...$("log").querySelectorAll(".message.assistant")].at(-1)?.remove();
  }
  $("error").hidden = true;
  await generate();
}

function clear() {
  epoch++;
  controller?.abort();
  controller = null;
  messages.length = 0;
  $("log").replaceChildren();
  setBusy(false);
}

function main() {
  $("composer").addEventListener("submit", send);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("clear").addEventListener("click", clear);
  loadModels().then(() => { document.body.dataset.ready = "true"; },
                    (e) => showError(e.message));
}

main();
