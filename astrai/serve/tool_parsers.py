"""Tool calls in a model's output: the three JSON formats chat templates teach, parsed back
into OpenAI's `tool_calls`, whole or as the text grows (streaming).

The formats are those vLLM's tool parsers read (`--tool-call-parser hermes | llama3_json |
mistral` there and here), each taught by its family's chat template:

* `hermes` (Qwen2.5, Qwen3, Hermes 2 Pro): `<tool_call>\\n{"name": F, "arguments": {...}}
  \\n</tool_call>`, one block per call, text allowed around them.
* `llama3_json` (Llama 3.1 / 3.2 / 3.3): the whole reply is `{"name": F, "parameters":
  {...}}` (`"arguments"` also read), optionally after `<|python_tag|>`, several calls
  separated by `;`.
* `mistral` (Mistral v3 tokenizers): `[TOOL_CALLS][{"name": F, "arguments": {...}}, ...]`;
  `[TOOL_CALLS]` is a special token the detokenizer drops, so a reply that starts with
  `[{` reads as a call list too.

A call reads as `{"name": "F", "arguments": VALUE}` in that key order (how every one of
these templates writes calls, and what the grammar of a required call generates), its
`arguments` string being VALUE exactly as the model wrote it; a call in another key order
is accepted when the whole text is known, its arguments re-serialised. Whatever is not a
complete, well-formed call stays content (malformed JSON, a call cut off by max_tokens);
whitespace between content and a call is dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

WS = " \t\r\n"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments object as JSON text."""


@dataclass
class CallScan:
    """A call object read so far: name once its string is complete, the arguments' raw
    text so far, `end` (offset past the closing brace) once complete; `bad` once the text
    can no longer be a call."""

    start: int
    name: str | None = None
    args: str = ""
    end: int | None = None
    bad: bool = False


@dataclass(frozen=True)
class Segment:
    """A piece of the output: content text, or a call (with the text it spans)."""

    start: int
    text: str
    call: CallScan | None = None


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def _string(text: str, i: int) -> tuple[int, str | None]:
    """(end, value) of the JSON string at text[i] == '"'; end -1 when unfinished."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            try:
                return j + 1, json.loads(text[i:j + 1])
            except json.JSONDecodeError:
                return j + 1, None
        j += 1
    return -1, None


def _value_end(text: str, i: int) -> int:
    """Offset past the object or array starting at text[i]; -1 while it is unfinished."""
    depth, j, n = 0, i, len(text)
    while j < n:
        c = text[j]
        if c == '"':
            j, _ = _string(text, j)
            if j < 0:
                return -1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return -1


def scan_call(text: str, i: int) -> CallScan:
    """Read `{"name": "F", "arguments"|"parameters": {...}}` from text[i] (after blanks)."""
    s = CallScan(i)
    steps = ("{", '"name"', ":", "NAME", ",", "KEY", ":", "ARGS", "}")
    p = _ws(text, i)
    for step in steps:
        p = _ws(text, p)
        if p >= len(text):
            return s
        if step in ("{", ":", ",", "}"):
            if text[p] != step:
                s.bad = True
                return s
            p += 1
            if step == "}":
                s.end = p
            continue
        if step == "ARGS":
            if text[p] != "{":
                s.bad = True
                return s
            end = _value_end(text, p)
            s.args = text[p:] if end < 0 else text[p:end]
            if end < 0:
                return s
            p = end
            continue
        if text[p] != '"':
            s.bad = True
            return s
        p, value = _string(text, p)
        if p < 0:
            return s
        ok = {'"name"': value == "name", "NAME": isinstance(value, str) and bool(value),
              "KEY": value in ("arguments", "parameters")}[step]
        if not ok:
            s.bad = True
            return s
        if step == "NAME":
            s.name = value
    return s


def loose_call(text: str) -> ToolCall | None:
    """A complete call object in any key order (`arguments` re-serialised), or None."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if set(obj) - {"name", "arguments", "parameters"} or not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ToolParser:
    """One format: `segments(text, final)` splits an output into content and calls."""

    name = ""
    parallel = True
    """Whether the format (and its template) carries several calls in one reply."""

    def segments(self, text: str, final: bool) -> list[Segment]:
        raise NotImplementedError

    def closed(self, segment: str) -> bool:
        """Whether a call's text ends with the format's end marker (none: always)."""
        return True

    def parse(self, text: str, cut: bool = False) -> tuple[str | None, list[ToolCall]]:
        """The whole output -> (content or None when only calls, the calls). `cut`: the
        output was cut by max_tokens, so a call without its end marker (the last) is content
        (docs/serve.md: a call cut off by max_tokens stays content)."""
        content, calls = [], []
        for seg in self.segments(text, final=True):
            if seg.call is None or (cut and not self.closed(seg.text)):
                content.append(seg.text)
            else:
                calls.append(ToolCall(seg.call.name, seg.call.args))
        joined = "".join(content)
        return (joined or None) if calls else joined, calls


def _whole(scan: CallScan, body: str, start: int) -> CallScan | None:
    """`scan` when it read a whole call; else a call of `body` (found at `start`) in
    another key order; None when `body` is no call."""
    if scan.end is not None and not scan.bad:
        return scan
    loose = loose_call(body)
    if loose is None:
        return None
    return CallScan(start, loose.name, loose.arguments, start + len(body))


def _text(out: list[Segment], start: int, piece: str, *, hold: str | None = None,
          before_call: bool = False) -> None:
    """Append content `piece` (found at `start`) with the blanks next to calls dropped;
    `hold` (while the output grows) keeps back an end that may begin that marker and
    trailing blanks, which may yet precede a call."""
    if out and out[-1].call is not None:  # blanks right after a call
        skip = len(piece) - len(piece.lstrip(WS))
        piece, start = piece[skip:], start + skip
    if hold is not None:
        piece = piece[:len(piece) - _partial_suffix(piece, hold)] if hold else piece
        piece = piece.rstrip(WS)
    elif before_call:
        piece = piece.rstrip(WS)
    if piece:
        out.append(Segment(start, piece))


class HermesParser(ToolParser):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def closed(self, segment: str) -> bool:
        return segment.endswith(self.CLOSE)

    def segments(self, text: str, final: bool) -> list[Segment]:
        out: list[Segment] = []
        pos = 0
        while True:
            k = text.find(self.OPEN, pos)
            if k < 0:
                _text(out, pos, text[pos:], hold=None if final else self.OPEN)
                return out
            body = k + len(self.OPEN)
            close = text.find(self.CLOSE, body)
            scan = scan_call(text, body)
            if close < 0 and not final:  # still being written: streamed while it fits
                if not scan.bad:
                    _text(out, pos, text[pos:k], before_call=True)
                    out.append(Segment(k, text[k:], scan))
                return out
            stop = len(text) if close < 0 else close
            end = stop if close < 0 else close + len(self.CLOSE)
            tail = "" if scan.end is None else text[scan.end:stop].strip(WS)
            call = _whole(scan, text[body:stop].strip(WS), k) if not tail else None
            if call is None:  # malformed: the block stays content
                _text(out, pos, text[pos:end])
            else:
                _text(out, pos, text[pos:k], before_call=True)
                out.append(Segment(k, text[k:end], call))
            pos = end


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    parallel = False  # Llama 3.1's template refuses more than one call per message
    TAG = "<|python_tag|>"

    def segments(self, text: str, final: bool) -> list[Segment]:
        p = _ws(text, 0)
        if text.startswith(self.TAG, p):
            p = _ws(text, p + len(self.TAG))
        elif not final and p < len(text) and self.TAG.startswith(text[p:]):
            return []
        if p >= len(text) or text[p] != "{":
            return [Segment(0, text)] if text and (final or p < len(text)) else []
        out: list[Segment] = []
        while True:
            scan, end = scan_call(text, p), _value_end(text, p)
            if end < 0:
                if final:
                    return [Segment(0, text)]
                if not scan.bad:
                    out.append(Segment(p, text[p:], scan))
                return out
            call = _whole(scan, text[p:end], p) if scan.end in (None, end) else None
            if call is None:
                return [Segment(0, text)] if final else out
            out.append(Segment(p, text[p:end], call))
            q = _ws(text, end)
            if q < len(text) and text[q] != ";":
                return [Segment(0, text)] if final else out
            p = _ws(text, q + 1)
            if p >= len(text):
                return out


class MistralParser(ToolParser):
    name = "mistral"
    MARK = "[TOOL_CALLS]"

    def segments(self, text: str, final: bool) -> list[Segment]:
        out: list[Segment] = []
        k = text.find(self.MARK)
        bare = text.lstrip(WS)
        if k < 0 and not bare.startswith("[{"):
            if not final and bare and "[{".startswith(bare):
                return out
            _text(out, 0, text, hold=None if final else self.MARK)
            return out
        p = _ws(text, 0 if k < 0 else k + len(self.MARK))
        calls = self._calls(text, p, final)
        if calls is None:  # a malformed list: all of it content
            return [Segment(0, text)] if final else out
        _text(out, 0, text[:max(k, 0)], before_call=True)
        return out + calls

    def _calls(self, text: str, p: int, final: bool) -> list[Segment] | None:
        """The call segments of the list at text[p]; None when it is malformed."""
        if p >= len(text) or text[p] != "[":
            return None if final or p < len(text) else []
        out: list[Segment] = []
        p = _ws(text, p + 1)
        while p < len(text):
            scan = scan_call(text, p)
            end = _value_end(text, p) if text[p] == "{" else -1
            if end < 0:
                if final or scan.bad:
                    return None
                return out + [Segment(p, text[p:], scan)]
            call = _whole(scan, text[p:end], p) if scan.end in (None, end) else None
            if call is None:
                return None
            out.append(Segment(p, text[p:end], call))
            q = _ws(text, end)
            if q < len(text) and text[q] == "]":
                return out if not final or not text[q + 1:].strip(WS) else None
            if q < len(text) and text[q] != ",":
                return None
            p = _ws(text, q + 1)
        return None if final else out


PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)}
"""`--tool-call-parser NAME` -> the parser."""

_SIGNS = (("hermes", re.compile(r"<tool_call>")),
          ("mistral", re.compile(r"\[TOOL_CALLS\]")),
          ("llama3_json", re.compile(r"<\|python_tag\|>|\"parameters\": ")))


class GenericParser(ToolParser):
    """Reads a reply in the generic format (astrai/serve/generic_tools.py: {"tool_call": ...}
    or {"response": ...}) once it is complete."""

    name = "generic"
    parallel = False

    def segments(self, text: str, final: bool) -> list[Segment]:
        if not final:
            return []  # a partial JSON string cannot be shown yet
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:  # cut by max_tokens: the answer so far, else as written
            m = _ANSWER.match(text)
            said = _partial_string(text[m.end():]) if m else None
            piece = text if said is None else said
            return [Segment(0, piece)] if piece else []
        if isinstance(obj, dict) and isinstance(obj.get("response"), str):
            return [Segment(0, obj["response"])] if obj["response"] else []
        call = obj.get("tool_call") if isinstance(obj, dict) else None
        if (isinstance(call, dict) and isinstance(call.get("name"), str)
                and isinstance(call.get("arguments"), dict)):
            args = json.dumps(call["arguments"], ensure_ascii=False)
            return [Segment(0, text, CallScan(0, call["name"], args, len(text)))]
        return [Segment(0, text)]


_ANSWER = re.compile(r'\s*\{\s*"response"\s*:\s*"')


def _partial_string(body: str) -> str | None:
    """The text of a JSON string cut before its closing quote (an escape cut in half
    dropped), or None when `body` is no such string."""
    for cut in range(min(len(body), 6) + 1):
        try:
            return json.loads('"' + body[:len(body) - cut] + '"')
        except json.JSONDecodeError:
            continue
    return None


def parser_for_template(source: str) -> str | None:
    """The format a chat template teaches, from the call syntax it writes; None if none
    of the three."""
    for name, sign in _SIGNS:
        if sign.search(source):
            return name
    return None
