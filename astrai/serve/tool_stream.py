"""One choice's tool calls as its text grows: the content and `delta.tool_calls` entries
to send (OpenAI's streaming shape), and the whole answer at the end.

Each call is announced once its name is complete and its arguments object has begun
(`index`, `id`, `type`, `function.name`, `function.arguments`), then its arguments follow as they are written, in pieces whose
concatenation is the `arguments` string the non-streamed answer gives. Content is sent
as soon as it can no longer be the start of a call. A call that turns out malformed after
its name was sent cannot be taken back; the non-streamed answer has it as content.
"""

from __future__ import annotations

import uuid
from typing import Any

from astrai.serve.tool_parsers import ToolCall, ToolParser


def call_id() -> str:
    """A tool-call id in OpenAI's style (`call_` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def split_output(parser: ToolParser, text: str, limit: int | None, cut: bool = False
                 ) -> tuple[str | None, list[ToolCall]]:
    """The whole output -> (content, calls): at most `limit` calls (None = any number);
    content None when there are calls and no other text; `cut`: max_tokens ended it."""
    content, calls = parser.parse(text, cut)
    return content, calls[:limit] if limit is not None else calls


def message(parser: ToolParser, text: str, limit: int | None, cut: bool = False
            ) -> dict[str, Any]:
    """The chat `message` of a finished choice (`cut`: finished by max_tokens)."""
    content, calls = split_output(parser, text, limit, cut)
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = [{"id": call_id(), "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in calls]
    return out


class ToolStream:
    """What of one choice's output has been sent: content, and each call's id, name and
    arguments so far."""

    def __init__(self, parser: ToolParser, limit: int | None) -> None:
        self.parser = parser
        self.limit = limit
        self.content = ""
        self.calls: list[tuple[str, str, str]] = []
        """Per call sent: (id, name, arguments sent)."""

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def push(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """The output so far (`final`: all of it) -> (new content, new tool-call entries)."""
        segs = self.parser.segments(text, final)
        content = "".join(s.text for s in segs if s.call is None)
        scans = [s.call for s in segs if s.call is not None]
        if self.limit is not None:
            scans = scans[:self.limit]
        new = content[len(self.content):] if content.startswith(self.content) else ""
        self.content += new
        entries = []
        for i, scan in enumerate(scans):
            if i == len(self.calls):
                if scan.name is None or not scan.args:  # announced once its arguments begin
                    break
                self.calls.append((call_id(), scan.name, ""))
                entries.append({"index": i, "id": self.calls[i][0], "type": "function",
                                "function": {"name": scan.name, "arguments": ""}})
            cid, name, sent = self.calls[i]
            if len(scan.args) > len(sent) and scan.args.startswith(sent):
                piece = scan.args[len(sent):]
                self.calls[i] = (cid, name, scan.args)
                if entries and entries[-1]["index"] == i and "id" in entries[-1]:
                    entries[-1]["function"]["arguments"] = piece
                else:
                    entries.append({"index": i, "function": {"arguments": piece}})
        return new, entries
