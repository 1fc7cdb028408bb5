"""A chat request's `messages` -> the message dicts a chat template reads, validated.

OpenAI's message shapes ("Create chat completion"): `system`, `user` and `assistant`
messages with string content or text parts; an assistant message may carry `tool_calls`
(`[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]`, its content
then optional) and a `tool` message answers one call (`tool_call_id`, content). They reach
the template as transformers documents for tool use ("Tool use" in its chat-template
docs): a call's `arguments` parsed into a dict, which every tool-aware template can write
(Llama 3.1's `tojson`s it; Qwen's writes a dict or a string), a missing content as "".
"""

from __future__ import annotations

import json
from typing import Any

from astrai.serve.errors import bad_request
from astrai.serve.limits import MAX_MESSAGES

ROLES = ("system", "user", "assistant", "tool")
FIELDS = {"system": {"role", "content"}, "user": {"role", "content"},
          "assistant": {"role", "content", "tool_calls"},
          "tool": {"role", "content", "tool_call_id"}}


def _content(m: dict, where: str, optional: bool) -> str:
    content = m.get("content")
    if content is None and optional:
        return ""
    if isinstance(content, list):  # content parts: only text parts have a meaning here
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise bad_request(f"{where}: only text content parts are supported",
                              f"{where}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad_request(f"{where}: 'content' must be a string", f"{where}.content")
    return content


def _tool_call(c: Any, where: str) -> dict:
    f = c.get("function") if isinstance(c, dict) else None
    if not isinstance(c, dict) or c.get("type", "function") != "function" or not isinstance(
            f, dict) or not isinstance(f.get("name"), str):
        raise bad_request(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": "
                          "{\"name\", \"arguments\"}}", where)
    args = f.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else None
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise bad_request(f"{where}.function.arguments must be a JSON object as a string, "
                          f"got {str(args)[:60]!r}", f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": f["name"], "arguments": parsed}}
    if c.get("id") is not None:
        if not isinstance(c["id"], str):
            raise bad_request(f"{where}.id must be a string", f"{where}.id")
        out = {"id": c["id"], **out}
    return out


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object with 'role' and 'content'", where)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(f"{where}: unknown role {role!r}; use one of {', '.join(ROLES)}",
                          f"{where}.role")
    extra = {k for k, v in m.items() if v is not None} - FIELDS[role]
    if extra:
        raise bad_request(f"{where}: field '{min(extra)}' is not supported for role "
                          f"'{role}'", f"{where}.{min(extra)}", "unsupported_parameter")
    calls = m.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not calls):
        raise bad_request(f"{where}.tool_calls must be a non-empty list", f"{where}.tool_calls")
    out: dict[str, Any] = {"role": role, "content": _content(m, where, optional=bool(calls))}
    if calls:
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]")
                             for j, c in enumerate(calls)]
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise bad_request(f"{where}: a tool message needs 'tool_call_id' (the id of the "
                              "call it answers)", f"{where}.tool_call_id")
        out["tool_call_id"] = m["tool_call_id"]
    return out


def read_messages(body: dict) -> list[dict[str, Any]]:
    """The validated `messages` of a chat request; APIError 400 naming the field."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list of {\"role\", \"content\"} "
                          "objects", "messages")
    if len(msgs) > MAX_MESSAGES:
        raise bad_request(f"'messages' holds {len(msgs)} messages; at most {MAX_MESSAGES} per "
                          "request", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
