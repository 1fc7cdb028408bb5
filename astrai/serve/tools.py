"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat request -> a ToolPlan.

Follows the OpenAI API reference ("Function calling"): a tool is `{"type": "function",
"function": {"name", "description"?, "parameters"?, "strict"?}}`; `tool_choice` is
`none` (tools shown to the model, its output never read as calls), `auto` (the default
with tools: the output is parsed for calls after it is written), `required` (at least one
call) or `{"type": "function", "function": {"name": F}}` (a call of F). The last two are
enforced while decoding by a grammar that writes the model's own call syntax around each
function's `{"name": F, "arguments" | "parameters": <its parameters schema>}`
(tool_grammar.py), so every call parses and its arguments validate against the schema.

The tools reach the chat template as transformers' `apply_chat_template(tools=...)` passes
them; a template that does not write them into the prompt is a 400, as is a model whose
call format is unknown (serve with `--tool-call-parser NAME`).
"""

from __future__ import annotations

import re
import reprlib
from dataclasses import dataclass
from typing import Any

from astrai.data.chat import renders_tools
from astrai.serve.errors import bad_request
from astrai.serve.tool_parsers import PARSERS, GenericParser, ToolParser, parser_for_template

MAX_TOOLS = 128
"""Most tools one request may carry."""
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""A function name OpenAI accepts (letters, digits, `_`, `-`; we also allow `.`)."""
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class ToolPlan:
    """How one chat request uses tools."""

    tools: list[dict]
    """The tools as sent, for the chat template."""
    choice: str
    """none | auto | required | function."""
    function: str | None
    """The function a named choice asks for."""
    parallel: bool
    """Several calls in one reply (the request allows it and the format carries it)."""
    parser: ToolParser | None
    """How calls are read from the output; None with choice none."""
    generic: bool = False
    """The chat template does not render tools: they are described in a system message and
    the reply held to the generic JSON format (generic_tools.py)."""

    @property
    def limit(self) -> int | None:
        """Most calls one reply returns (None = any number)."""
        return None if self.parallel else 1

    @property
    def enforced(self) -> bool:
        return self.choice in ("required", "function")

    def schemas(self) -> dict[str, dict]:
        """Function name -> its parameters schema (an empty object schema when none)."""
        return {t["function"]["name"]: t["function"].get("parameters")
                or {"type": "object", "properties": {}} for t in self.tools}


def _check_parameters(p: Any, where: str) -> None:
    if not isinstance(p, dict):
        raise bad_request(f"'{where}' must be a JSON Schema object, got {reprlib.repr(p)}",
                          where)
    if "type" in p and p["type"] != "object":
        raise bad_request(f"'{where}' must be a JSON Schema of type 'object', got type "
                          f"{reprlib.repr(p['type'])}", where)
    props = p.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict | bool)
                                              for v in props.values()):
        raise bad_request(f"'{where}.properties' must map each name to a schema", where)
    req = p.get("required", [])
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise bad_request(f"'{where}.required' must be a list of property names", where)


def _check_tool(t: Any, i: int) -> str:
    """Validate tools[i]; returns its function name."""
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function":
        raise bad_request(f"'{where}' must be {{\"type\": \"function\", \"function\": "
                          "{...}}: only function tools are supported", f"{where}.type")
    extra = set(t) - {"type", "function"}
    if extra:
        raise bad_request(f"'{where}': field '{min(extra)}' is not supported",
                          f"{where}.{min(extra)}")
    f = t.get("function")
    if not isinstance(f, dict):
        raise bad_request(f"'{where}.function' must be an object with a 'name'",
                          f"{where}.function")
    extra = set(f) - FUNCTION_KEYS
    if extra:
        raise bad_request(f"'{where}.function': field '{min(extra)}' is not supported",
                          f"{where}.function.{min(extra)}")
    name = f.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_request(f"'{where}.function.name' must be 1-64 letters, digits, '_', '-' "
                          f"or '.', got {reprlib.repr(name)}", f"{where}.function.name")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise bad_request(f"'{where}.function.description' must be a string",
                          f"{where}.function.description")
    if f.get("strict") is not None and not isinstance(f["strict"], bool):
        raise bad_request(f"'{where}.function.strict' must be true or false",
                          f"{where}.function.strict")
    if f.get("parameters") is not None:
        _check_parameters(f["parameters"], f"{where}.function.parameters")
    return name


def _choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if names else "none"), None
    if value in ("none", "auto", "required"):
        return value, None
    f = value.get("function") if isinstance(value, dict) else None
    name = f.get("name") if isinstance(f, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(
            name, str):
        raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                          "tool_choice")
    if name not in names:
        raise bad_request(f"'tool_choice' names the function {name!r}, which is not in "
                          "'tools'", "tool_choice")
    return "function", name


def read_tools(body: dict, template: str | None, parser_name: str | None
               ) -> ToolPlan | None:
    """The request's ToolPlan (None: no tools involved); APIError 400 naming the field.
    `template` is the chat template's source, `parser_name` the server's
    `--tool-call-parser` (None: chosen from the template)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    tools = tools or []
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' holds {len(tools)} tools; at most {MAX_TOOLS}", "tools")
    names = [_check_tool(t, i) for i, t in enumerate(tools)]
    if len(set(names)) < len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise bad_request(f"'tools' defines the function {dup!r} twice", "tools")
    choice, function = _choice(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    if not tools:
        if choice in ("required", "function"):
            raise bad_request(f"'tool_choice' {choice!r} needs 'tools'", "tool_choice")
        return None
    if template is None:
        raise bad_request("this model has no chat template to show it tools; serve with "
                          "--chat-template FILE", "tools")
    if not renders_tools(template):
        if parser_name is not None:  # the server named a format the template cannot show
            raise bad_request("this model's chat template does not render tools, so "
                              f"--tool-call-parser {parser_name} cannot apply; serve without "
                              "it (tools are then described in a system message) or with a "
                              "--chat-template FILE that renders them", "tools")
        return ToolPlan(list(tools), choice, function, False,
                        None if choice == "none" else GenericParser(), generic=True)
    parser = None
    if choice != "none":
        name = parser_name or parser_for_template(template)
        if name is None:
            raise bad_request("the tool-call format of this model's chat template is not "
                              "known; serve with --tool-call-parser "
                              f"{'|'.join(PARSERS)}", "tools")
        parser = PARSERS[name]()
    # a named function is one call of it (vLLM's and OpenAI's behaviour)
    allow = parallel is not False and choice != "function" and (parser is None
                                                                 or parser.parallel)
    return ToolPlan(list(tools), choice, function, allow, parser)
