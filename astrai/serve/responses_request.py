"""A Responses API request body (`POST /v1/responses`) -> the chat request it asks for.

The OpenAI API reference ("Create a model response") names the fields: `input` (a string,
or a list of items: messages of role user / system / developer / assistant whose content
is a string or `input_text` / `output_text` parts, `function_call` and
`function_call_output` items), `instructions`, flat function `tools` (`{"type":
"function", "name", "description", "parameters", "strict"}`), `tool_choice` (`{"type":
"function", "name"}` names one), `text.format` (text / json_object / json_schema with
its `name` and `schema` beside the type), `max_output_tokens`, `store`,
`previous_response_id`. Each becomes its chat-completions twin, so a response is
rendered, constrained, decoded and read for tool calls exactly as chat is (protocol.py);
an error found there is renamed to the Responses field (`rename`). A developer message
reaches the chat template as a system message (templates know no developer role).
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any

from astrai.serve.errors import APIError, bad_request
from astrai.serve.limits import MAX_MESSAGES
from astrai.serve.protocol import check_fields

FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
          "text", "max_output_tokens", "temperature", "top_p", "stream", "store",
          "previous_response_id", "metadata", "user"}
PASSED = {"model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", "seed",
          "top_k", "min_p", "repetition_penalty"}
"""Fields handed to the chat request as they are (the last four: vLLM's sampling extras,
and a seed for reproducible sampling)."""
HARMLESS = {"truncation": "disabled", "background": False, "include": []}
"""Fields we do not implement, accepted only at the value that means "not used"."""
MAX_INPUT_ITEMS = MAX_MESSAGES
"""Items in one request's `input` (each becomes a message the template renders)."""
MAX_METADATA = (16, 64, 512)
"""`metadata`: pairs, key characters, value characters (the OpenAI API reference's)."""
ID = re.compile(r"^resp_[0-9a-f]{32}$")
"""A response id as this server writes them."""
ITEM_KEYS = {"message": {"type", "role", "content", "id", "status"},
             "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
             "function_call_output": {"type", "call_id", "output", "id", "status"},
             "reasoning": {"type", "id", "summary", "content", "status", "encrypted_content"}}
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


@dataclass
class ResponsesRequest:
    """One validated Responses request, before the stored conversation is prepended."""

    messages: list[dict]
    """The input as chat messages (without `instructions`)."""
    chat: dict
    """The chat body's other fields (tools, tool_choice, response_format, sampling)."""
    instructions: str | None
    previous_id: str | None
    store: bool
    echo: dict = field(default_factory=dict)
    """What the response object repeats of the request (its tools, text, sampling)."""

    def chat_body(self, history: list[dict]) -> dict:
        """The chat-completions body: instructions, the stored `history`, then the input."""
        system = [{"role": "system", "content": self.instructions}] \
            if self.instructions is not None else []
        return {**self.chat, "messages": system + history + self.messages}


def _str(body: dict, key: str) -> str | None:
    v = body.get(key)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"'{key}' must be a string, got {reprlib.repr(v)}", key)
    return v


def _text_parts(content: Any, where: str) -> str:
    """A string, or a list of `input_text` / `output_text` parts, as one text."""
    if isinstance(content, str):
        return content
    ok = isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text")
        and isinstance(p.get("text"), str) for p in content)
    if not ok:
        raise bad_request(f"'{where}' must be a string or a list of input_text parts "
                          "({\"type\": \"input_text\", \"text\": ...}); only text is "
                          "supported", where)
    return "".join(p["text"] for p in content)


def _item(item: Any, where: str, out: list[dict]) -> None:
    """Append input item `item` to the chat messages `out` (a function_call joins the
    assistant message before it, so one reply's calls are one message with tool_calls)."""
    if not isinstance(item, dict):
        raise bad_request(f"'{where}' must be an object (a message, function_call or "
                          "function_call_output item)", where)
    kind = item.get("type", "message")
    if kind not in ITEM_KEYS:
        raise bad_request(f"'{where}.type' {reprlib.repr(kind)} is not supported; use "
                          "message, function_call, function_call_output or reasoning",
                          f"{where}.type")
    extra = {k for k, v in item.items() if v is not None} - ITEM_KEYS[kind]
    if extra:
        raise bad_request(f"'{where}': field '{min(extra)}' is not supported for a {kind} "
                          "item", f"{where}.{min(extra)}", "unsupported_parameter")
    if kind == "reasoning":  # an earlier turn's thinking: the templates leave it out too
        return
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}, got "
                              f"{reprlib.repr(role)}", f"{where}.role")
        out.append({"role": ROLES[role],
                    "content": _text_parts(item.get("content"), f"{where}.content")})
        return
    for key in ("call_id", "name", "arguments") if kind == "function_call" else ("call_id",):
        if not isinstance(item.get(key), str):
            raise bad_request(f"'{where}.{key}' must be a string", f"{where}.{key}")
    if kind == "function_call_output":
        out.append({"role": "tool", "tool_call_id": item["call_id"],
                    "content": _text_parts(item.get("output"), f"{where}.output")})
        return
    _arguments(item["arguments"], f"{where}.arguments")
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _arguments(text: str, where: str) -> None:
    try:
        ok = isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, RecursionError):
        ok = False
    if not ok:
        raise bad_request(f"'{where}' must be a JSON object as a string, got "
                          f"{reprlib.repr(text)}", where)


def read_input(value: Any) -> list[dict]:
    """`input` -> chat messages; a 400 naming the item and field."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty list of items", "input")
    if len(value) > MAX_INPUT_ITEMS:
        raise bad_request(f"'input' holds {len(value)} items; at most {MAX_INPUT_ITEMS} per "
                          "request", "input")
    out: list[dict] = []
    for i, item in enumerate(value):
        _item(item, f"input[{i}]", out)
    return out


def _tools(value: Any) -> list[dict] | None:
    """Flat function tools -> chat's `{"type": "function", "function": {...}}`; the rest of
    their checks (names, schemas) are chat's, renamed back (`rename`)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise bad_request(f"'{where}' must be {{\"type\": \"function\", \"name\": ...}}: "
                              "only function tools are supported", f"{where}.type")
        extra = set(t) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise bad_request(f"'{where}': field '{min(extra)}' is not supported",
                              f"{where}.{min(extra)}", "unsupported_parameter")
        out.append({"type": "function", "function": {k: v for k, v in t.items()
                                                     if k != "type" and v is not None}})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and set(value) == {
            "type", "name"} and isinstance(value["name"], str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                      "\"function\", \"name\": ...}", "tool_choice")


def _text_format(text: Any) -> dict | None:
    """`text` -> chat's `response_format` (None: free text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad_request("'text' must be {\"format\": {...}}", "text")
    if text.get("verbosity") is not None:
        raise bad_request("'text.verbosity' is not supported; remove it", "text.verbosity",
                          "unsupported_parameter")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object",
                                                             "json_schema"):
        raise bad_request("'text.format' must be {\"type\": \"text\"}, {\"type\": "
                          "\"json_object\"} or {\"type\": \"json_schema\", \"name\", "
                          "\"schema\"}", "text.format")
    allowed = {"type", "name", "schema", "strict", "description"} \
        if fmt["type"] == "json_schema" else {"type"}
    extra = set(fmt) - allowed
    if extra:
        raise bad_request(f"'text.format' has an unexpected field '{min(extra)}'",
                          f"text.format.{min(extra)}")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    return {"type": "json_schema",
            "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def _metadata(value: Any) -> dict | None:
    pairs, key_chars, value_chars = MAX_METADATA
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > pairs or not all(
            isinstance(k, str) and len(k) <= key_chars and isinstance(v, str)
            and len(v) <= value_chars for k, v in value.items()):
        raise bad_request(f"'metadata' must map at most {pairs} keys of at most {key_chars} "
                          f"characters to strings of at most {value_chars}", "metadata")
    return value


def read_request(body: Any) -> ResponsesRequest:
    """Validate a Responses body; APIError 400 naming the field."""
    body = check_fields(body, FIELDS | PASSED, HARMLESS)
    if "input" not in body or body["input"] is None:
        raise bad_request("'input' is required: a string or a list of items", "input")
    messages = read_input(body["input"])
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise bad_request("'store' must be true or false", "store")
    previous = _str(body, "previous_response_id")
    if previous is not None and not ID.match(previous):
        raise bad_request(f"'previous_response_id' {reprlib.repr(previous)} is not a response "
                          "id of this server", "previous_response_id")
    chat = {k: body[k] for k in PASSED if body.get(k) is not None}
    chat["tools"] = _tools(body.get("tools"))
    chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    chat["response_format"] = _text_format(body.get("text"))
    chat["max_completion_tokens"] = body.get("max_output_tokens")
    echo = {"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or
            ("auto" if body.get("tools") else "none"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "metadata": _metadata(body.get("metadata")) or {}}
    for key in ("temperature", "top_p", "max_output_tokens", "user"):
        echo[key] = body.get(key)
    return ResponsesRequest(messages, chat, _str(body, "instructions"), previous,
                            store is not False, echo)


RENAMES = [(re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
           (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
           (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
           (re.compile(r"^(messages|prompt)\b.*"), "input")]
"""Chat field -> Responses field, for the errors the chat pipeline raises."""
WORDS = [("max_completion_tokens", "max_output_tokens"),
         ("response_format.json_schema", "text.format"),
         ("'response_format'", "'text.format'"), ("'messages'", "'input'")]


def rename(e: APIError) -> APIError:
    """An error of the chat pipeline with the Responses field's name in `param` and
    message (`tools[0].function.parameters` -> `tools[0].parameters`, ...)."""
    param, message = e.param, e.message
    if param is not None:
        for pattern, new in RENAMES:
            param = pattern.sub(new, param)
    for old, new in WORDS:
        message = message.replace(old, new)
    message = re.sub(r"(tools\[\d+\])\.function", r"\1", message)
    return APIError(e.status, message, type=e.type, param=param, code=e.code,
                    headers=e.headers)
