"""Tool calling for a chat template that does not render tools: the generic format.

A small fine-tuned model's template often has no place for tools, yet a client sends them.
As llama.cpp's server does for such templates, the tools are described to the model in a
system message, and its reply is held to one JSON object by the grammar engine:

    {"tool_call": {"name": F, "arguments": <F's parameters>}}     a call of F
    {"response": "text"}                                           an answer (tool_choice auto)

so every reply parses and a call's arguments validate against its function's schema. Earlier
turns the template cannot render either are rewritten the same way: an assistant's tool
calls become that JSON as its content, a tool result a user message naming the function.
The reply is read back by tool_parsers.GenericParser (whole, when it ends: the JSON's string escapes make
a partial answer unreadable). This is the rule when the template does not render tools and
no `--tool-call-parser` is given; a parser given for such a template stays a 400.
"""

from __future__ import annotations

import json
from typing import Any

from astrai.serve.tool_grammar import call_options
from astrai.serve.tools import ToolPlan

INTRO = ("You can call functions. Each is given below as a JSON object with its name, "
         "description and parameters (a JSON Schema).")


def describe(plan: ToolPlan) -> str:
    """The system text that shows the model its tools and the reply format."""
    fns = [{"name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "parameters": t["function"].get("parameters") or {"type": "object"}}
           for t in plan.tools]
    lines = [INTRO, *(json.dumps(f, ensure_ascii=False) for f in fns)]
    call = '{"tool_call": {"name": NAME, "arguments": {...}}}'
    if plan.choice == "function":
        lines.append(f"Reply with one JSON object calling {plan.function}: {call}.")
    elif plan.choice == "required":
        lines.append(f"Reply with one JSON object calling a function: {call}.")
    else:
        lines.append(f"Reply with one JSON object: {call} to call a function, or "
                     '{"response": TEXT} to answer directly.')
    return "\n".join(lines)


def generic_messages(messages: list[dict[str, Any]], plan: ToolPlan) -> list[dict[str, Any]]:
    """`messages` for a template without tools: the tools described in the system message,
    earlier calls and results rewritten as text (the module docstring)."""
    names: dict[str, str] = {}  # tool_call_id -> function name, to name results
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            for c in calls:
                names[c.get("id", "")] = c["function"]["name"]
            first = calls[0]["function"]
            args = first.get("arguments") or "{}"
            call = {"name": first["name"],
                    "arguments": json.loads(args) if isinstance(args, str) else args}
            out.append({"role": "assistant", "content": json.dumps({"tool_call": call},
                                                                   ensure_ascii=False)})
        elif role == "tool":
            name = names.get(m.get("tool_call_id", ""), "the function")
            out.append({"role": "user", "content": f"{name} returned: {m.get('content')}"})
        else:
            out.append(m)
    text = describe(plan)
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        return [{"role": "system", "content": f"{text}\n\n{out[0]['content']}"}, *out[1:]]
    return [{"role": "system", "content": text}, *out]


def generic_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON Schema every reply follows: a call of an allowed function (its parameters
    schema hoisted as tool_grammar does), or with tool_choice auto an answer."""
    calls, defs = call_options(plan, "arguments")
    options = [{"type": "object", "required": ["tool_call"], "additionalProperties": False,
                "properties": {"tool_call": call}} for call in calls]
    if not plan.enforced:
        options.append({"type": "object", "required": ["response"],
                        "additionalProperties": False,
                        "properties": {"response": {"type": "string"}}})
    out = options[0] if len(options) == 1 else {"anyOf": options}
    return {**out, "$defs": defs}
