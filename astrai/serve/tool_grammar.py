"""The grammar that makes a model call a tool (`tool_choice` required or a named function).

A Lark grammar in llguidance's dialect (its docs, "Syntax of LLGuidance Grammars": `%json`
embeds a JSON Schema, `<[ID]>` is one token) that writes the model's own call syntax —
the one its chat template shows it and tool_parsers.py reads back — around
`{"name": F, "arguments" | "parameters": <F's parameters schema>}`, one schema per allowed
function. The JSON is written as the templates write it (`json.dumps` separators, no other
whitespace), the keys in that order, so the parser reads each call as it was generated and
its arguments validate against the function's schema. A marker that is one token of the
vocabulary (Qwen's `<tool_call>`) is required as that token, as the model was trained.

A parameters schema is embedded below the root of the call's schema, so its local
references (`#/$defs/Addr`, as pydantic's `model_json_schema()` writes them; `#` itself)
would point into the wrong document (JSON Schema 2020-12, "$ref" resolves against the
root). Each function's schema and definitions move to the root's `$defs` under a prefix
of their own (`f0`, `f0.Addr`) and its references are rewritten to match.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from astrai.serve.tools import ToolPlan

JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
"""llguidance's JSON options ("x-guidance"): the layout of `json.dumps`."""


def call_schema(name: str, parameters: dict, key: str) -> dict:
    """`{"name": name, key: <arguments>}` as a JSON Schema, name first."""
    return {"type": "object", "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key], "additionalProperties": False}


DEF_KEYS = ("$defs", "definitions")


def _rebase(node: Any, prefix: str) -> Any:
    """`node` with every local `$ref` of the function `prefix` pointing at the root's
    `$defs`: `#/$defs/N...` (or `#/definitions/N...`) -> `#/$defs/{prefix}.N...`, any
    other `#...` -> `#/$defs/{prefix}...` (the function's own schema)."""
    if isinstance(node, list):
        return [_rebase(v, prefix) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebase(v, prefix) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        parts = ref[1:].split("/", 3)
        if len(parts) >= 3 and parts[0] == "" and parts[1] in DEF_KEYS:
            out["$ref"] = f"#/$defs/{prefix}.{'/'.join(parts[2:])}"
        else:
            out["$ref"] = f"#/$defs/{prefix}{ref[1:]}"
    return out


def _hoist(parameters: dict, prefix: str, defs: dict) -> dict:
    """Move one function's schema and definitions into `defs`; its reference there."""
    body = _rebase({k: v for k, v in parameters.items() if k not in DEF_KEYS}, prefix)
    defs[prefix] = body
    for key in DEF_KEYS:
        for name, sub in (parameters.get(key) or {}).items():
            defs[f"{prefix}.{name}"] = _rebase(sub, prefix)
    return {"$ref": f"#/$defs/{prefix}"}


def call_options(plan: ToolPlan, key: str) -> tuple[list[dict], dict[str, Any]]:
    """(one call schema per function `plan` allows, the `$defs` their parameters moved to)."""
    schemas = plan.schemas()
    names = [plan.function] if plan.choice == "function" else list(schemas)
    index = {n: i for i, n in enumerate(schemas)}
    defs: dict[str, Any] = {}
    options = [call_schema(n, _hoist(schemas[n], f"f{index[n]}", defs), key) for n in names]
    return options, defs


def _calls_schema(plan: ToolPlan, key: str) -> dict:
    options, defs = call_options(plan, key)
    out = options[0] if len(options) == 1 else {"anyOf": options}
    return {**out, "$defs": defs}


def _json(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE}, ensure_ascii=False)


def _mark(text: str, token_id: Callable[[str], int | None]) -> str:
    """A marker as one token when the vocabulary has it, else as text."""
    i = token_id(text)
    return f"<[{i}]>" if i is not None else json.dumps(text)


def tool_grammar(plan: ToolPlan, token_id: Callable[[str], int | None]) -> str:
    """The Lark grammar of a reply that is only tool calls, as `plan` allows: one call, or
    with parallel calls one or more (hermes, mistral). `token_id(text)` is the id of an
    added token spelled `text`, or None."""
    fmt = plan.parser.name if plan.parser is not None else ""
    if fmt == "hermes":
        repeat = ' ("\\n" call)*' if plan.parallel else ""
        return (f"start: call{repeat}\n"
                f'call: {_mark("<tool_call>", token_id)} "\\n" fn "\\n" '
                f'{_mark("</tool_call>", token_id)}\n'
                f"fn: {_json(_calls_schema(plan, 'arguments'))}\n")
    if fmt == "llama3_json":
        return f"start: fn\nfn: {_json(_calls_schema(plan, 'parameters'))}\n"
    if fmt == "mistral":
        call = _calls_schema(plan, "arguments")
        items = {"type": "array", "items": call, "minItems": 1, "$defs": call.pop("$defs")}
        if not plan.parallel:
            items["maxItems"] = 1
        return f"start: {_mark('[TOOL_CALLS]', token_id)} calls\ncalls: {_json(items)}\n"
    raise ValueError(f"no tool grammar for the format {fmt!r}")
