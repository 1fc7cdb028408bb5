"""A request's structured-output constraint, read from OpenAI's `response_format` or vLLM's
`structured_outputs` (docs/serve.md "Structured outputs").

    response_format: {"type": "text" | "json_object"}
                     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    structured_outputs: {"json": SCHEMA} | {"json_object": true} | {"regex": R}
                        | {"choice": [S, ...]} | {"grammar": LARK}

Compiling (`compile_constraints`) runs in a worker thread under a time bound
(`COMPILE_TIMEOUT`), so a hostile schema costs its sender a 400, never the event loop; the
first token masks are computed and timed there too (llguidance builds its lexer lazily,
inside them), so a constraint whose masks would stall the engine's step is a 400 before
it reaches the engine (astrai.infer.grammar_cost).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from astrai.errors import ConfigError
from astrai.infer.structured import StructuredOutputs
from astrai.serve.errors import bad_request

COMPILE_TIMEOUT = 10.0
"""Seconds a request's constraint may take to compile before the request is a 400."""
SO_KEYS = {"json", "json_object", "regex", "choice", "grammar"}
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def read_constraint(body: dict) -> StructuredOutputs | None:
    """The body's constraint (None: free text); a 400 naming the field otherwise."""
    rf, so = body.get("response_format"), body.get("structured_outputs")
    if rf is not None and so is not None:
        raise bad_request("give either 'response_format' or 'structured_outputs', not both",
                          "structured_outputs")
    if so is not None:
        return _structured_outputs(so)
    return None if rf is None else _response_format(rf)


def _response_format(rf: Any) -> StructuredOutputs | None:
    where = "response_format"
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("'response_format' must be {\"type\": \"text\"}, {\"type\": "
                          "\"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": "
                          "{...}}", where)
    extra = set(rf) - {"type", "json_schema"}
    if extra or (rf["type"] != "json_schema" and "json_schema" in rf):
        raise bad_request(f"'response_format' has an unexpected field "
                          f"'{sorted(extra or {'json_schema'})[0]}'", where)
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return StructuredOutputs(json_object=True)
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise bad_request("'response_format.json_schema' must be an object with 'name' and "
                          "'schema'", f"{where}.json_schema")
    unknown = set(js) - {"name", "schema", "strict", "description"}
    if unknown:
        raise bad_request(f"'response_format.json_schema' has an unexpected field "
                          f"'{sorted(unknown)[0]}'", f"{where}.json_schema")
    if not isinstance(js.get("name"), str) or not NAME.fullmatch(js["name"]):
        raise bad_request("'response_format.json_schema.name' must be 1-64 letters, digits, "
                          "'_' or '-'", f"{where}.json_schema.name")
    schema = js.get("schema")
    if schema is None:
        return StructuredOutputs(json_object=True)
    return _spec({"json": schema}, f"{where}.json_schema.schema")


def _structured_outputs(so: Any) -> StructuredOutputs:
    where = "structured_outputs"
    if not isinstance(so, dict):
        raise bad_request(f"'{where}' must be an object with one of "
                          f"{', '.join(sorted(SO_KEYS))}", where)
    unknown = set(so) - SO_KEYS
    if unknown:
        raise bad_request(f"'{where}.{sorted(unknown)[0]}' is not supported; use one of "
                          f"{', '.join(sorted(SO_KEYS))}", where)
    return _spec({k: v for k, v in so.items() if v is not None}, where)


def _spec(kw: dict, where: str) -> StructuredOutputs:
    try:
        return StructuredOutputs(**kw)
    except (ConfigError, TypeError) as e:
        raise bad_request(str(e), where) from None


def compile_constraints(grammars: Any, specs: list[StructuredOutputs | None],
                        where: str, tools: list[dict] | None = None) -> None:
    """Compile each distinct constraint once (the engine's cache keeps it for the
    request), and time its token masks; what the grammar engine refuses, or a mask over the
    budget, is a 400 naming `where`, or with `tools` (the request's tools, whose calls the
    constraint enforces) the tool whose parameters schema it refuses."""
    if tools and any(s is not None for s in specs):
        # each tool's parameters on its own first: the call grammar's probe walks one
        # branch of it (one tool, its first properties), so a schema the grammar engine
        # cannot follow in another branch would fail mid-decode instead of here
        _blame_tool(grammars, tools)
    rows = Counter((s.kind, s.source) for s in specs if s is not None)
    seen = set()
    for spec in specs:
        if spec is None or (spec.kind, spec.source) in seen:
            continue
        seen.add((spec.kind, spec.source))
        try:  # its rows' masks together within the grammar-work budget (grammar_cost)
            grammars.compile(spec, copies=rows[(spec.kind, spec.source)])
        except ConfigError as e:
            if tools:
                _blame_tool(grammars, tools)
            raise bad_request(str(e), where) from None


def _blame_tool(grammars: Any, tools: list[dict]) -> None:
    """A 400 naming `tools[i].function.parameters` and the engine's reason, for the first
    tool whose parameters schema does not compile on its own (the call grammar embeds
    them all, so its own message names no tool)."""
    for i, tool in enumerate(tools):
        params = tool["function"].get("parameters")
        if not params:
            continue
        field = f"tools[{i}].function.parameters"
        try:
            grammars.compile(StructuredOutputs(json=params))
        except ConfigError as e:
            reason = str(e).removeprefix("structured outputs json: ")
            raise bad_request(f"'{field}': {reason}", field) from None
