// A small Markdown renderer for model replies, safe by construction: it builds DOM nodes
// (document.createElement, text nodes) and never parses model text as HTML, so `<script>`
// or `<img onerror=...>` in a reply shows as the characters it is. Supported: fenced code
// blocks, inline code, headings, bullet and numbered lists, bold, italic and links whose
// URL is http or https (anything else stays text). The page's Content-Security-Policy
// (default-src 'self', no inline script) is the second wall.

const INLINE = new RegExp([
  "`([^`\\n]+)`",                           // 1: inline code
  "\\[([^\\]\\n]+)\\]\\(([^)\\s]+)\\)",     // 2, 3: [text](url)
  "\\*\\*(\\S(?:[^\\n]*?\\S)?)\\*\\*",      // 4: **bold**
  "__(\\S(?:[^\\n]*?\\S)?)__",              // 5: __bold__
  "\\*(\\S(?:[^*\\n]*?\\S)?)\\*",           // 6: *italic*
  "\\b_(\\S(?:[^_\\n]*?\\S)?)_\\b",         // 7: _italic_
].join("|"), "g");

/** The URL when it is an absolute http(s) URL, else null (javascript:, data:, ...). */
export function safeUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

function el(tag, ...children) {
  const node = document.createElement(tag);
  node.append(...children);
  return node;
}

/** Inline markup of one line as nodes appended to `parent`. */
function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1] !== undefined) parent.append(el("code", m[1]));
    else if (m[2] !== undefined) parent.append(link(m[2], m[3]) ?? m[0]);
    else if (m[4] !== undefined || m[5] !== undefined) inline(strong(parent), m[4] ?? m[5]);
    else inline(parent.appendChild(el("em")), m[6] ?? m[7]);
  }
  parent.append(text.slice(last));
}

function strong(parent) {
  return parent.appendChild(el("strong"));
}

function link(text, target) {
  const href = safeUrl(target);
  if (href === null) return null;
  const a = el("a");
  inline(a, text);
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  return a;
}

/** Lines joined by <br> inside `parent`, each with its inline markup. */
function lines(parent, texts) {
  texts.forEach((t, i) => {
    if (i > 0) parent.append(el("br"));
    inline(parent, t);
  });
  return parent;
}

const FENCE = /^\s*(```|~~~)\s*([\w+.#-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d{1,9}[.)]\s+(.*)$/;

/** A fenced code block from lines[i] (the fence); returns [node, next index]. An unclosed
 * fence (a reply still streaming) runs to the end. */
function codeBlock(src, i) {
  const [, fence, lang] = src[i].match(FENCE);
  const body = [];
  let j = i + 1;
  while (j < src.length && src[j].trim() !== fence) body.push(src[j++]);
  const code = el("code", body.join("\n"));
  if (lang) code.dataset.lang = lang;
  return [el("pre", code), j + 1];
}

/** A list of consecutive items matching `pattern`; returns [node, next index]. */
function list(src, i, tag, pattern) {
  const node = el(tag);
  let j = i;
  for (let m; j < src.length && (m = src[j].match(pattern)); j++) {
    inline(node.appendChild(el("li")), m[1]);
  }
  return [node, j];
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || NUMBERED.test(line);
}

/** Markdown text -> a DocumentFragment (never HTML parsing of the text). */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const src = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < src.length) {
    const line = src[i];
    let node, m;
    if (line.trim() === "") {
      i++;
      continue;
    } else if (FENCE.test(line)) {
      [node, i] = codeBlock(src, i);
    } else if ((m = line.match(HEADING))) {
      node = el(`h${Math.min(m[1].length + 2, 6)}`);  // h3..h6: below the page's own
      inline(node, m[2]);
      i++;
    } else if (BULLET.test(line)) {
      [node, i] = list(src, i, "ul", BULLET);
    } else if (NUMBERED.test(line)) {
      [node, i] = list(src, i, "ol", NUMBERED);
    } else {
      const para = [];
      while (i < src.length && src[i].trim() !== "" && (para.length === 0 || !startsBlock(src[i]))) {
        para.push(src[i++]);
      }
      node = lines(el("p"), para);
    }
    out.append(node);
  }
  return out;
}

/** A reply's text split into its thinking and its answer: `<think>…</think>` at the start,
 * or text before a lone `</think>` (templates such as Qwen3's and DeepSeek-R1's open the
 * think block in the prompt). `open`: the thinking has not ended yet (still streaming). */
export function splitThinking(text) {
  const OPEN = "<think>", CLOSE = "</think>";
  const start = text.indexOf(OPEN), end = text.indexOf(CLOSE);
  if (start !== -1 && text.slice(0, start).trim() === "" && (end === -1 || start < end)) {
    const rest = text.slice(start + OPEN.length);
    const stop = rest.indexOf(CLOSE);
    if (stop === -1) return { thinking: rest, answer: "", open: true };
    return { thinking: rest.slice(0, stop), answer: rest.slice(stop + CLOSE.length), open: false };
  }
  if (end !== -1 && start === -1) {
    return { thinking: text.slice(0, end), answer: text.slice(end + CLOSE.length), open: false };
  }
  return { thinking: "", answer: text, open: false };
}
