"""The grammar that makes a model call a tool (`tool_choice` required or a named function).

A Lark grammar in llguidance's dialect (its docs, "Syntax of LLGuidance Grammars": `%json`
embeds a JSON Schema, `<[ID]>` is one token) that writes the model's own call syntax —
the one its chat template shows it and tool_parsers.py reads back — around
`{"name": F, "arguments" | "parameters": <F's parameters schema>}`, one schema per allowed
function. The JSON is written as the templates write it (`json.dumps` separators, no other
whitespace), the keys in that order, so the parser reads each call as it was generated and
its arguments validate against the function's schema. A marker that is one token of the
vocabulary (Qwen's `<tool_call>`) is required as that token, as the model was trained.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from astrai.serve.tools import ToolPlan

JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
"""llguidance's JSON options ("x-guidance"): the layout of `json.dumps`."""


def call_schema(name: str, parameters: dict, key: str) -> dict:
    """`{"name": name, key: <arguments>}` as a JSON Schema, name first."""
    return {"type": "object", "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key], "additionalProperties": False}


def _calls_schema(plan: ToolPlan, key: str) -> dict:
    schemas = plan.schemas()
    names = [plan.function] if plan.choice == "function" else list(schemas)
    options = [call_schema(n, schemas[n], key) for n in names]
    return options[0] if len(options) == 1 else {"anyOf": options}


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
        items = {"type": "array", "items": _calls_schema(plan, "arguments"), "minItems": 1}
        if not plan.parallel:
            items["maxItems"] = 1
        return f"start: {_mark('[TOOL_CALLS]', token_id)} calls\ncalls: {_json(items)}\n"
    raise ValueError(f"no tool grammar for the format {fmt!r}")
