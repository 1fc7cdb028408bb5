"""Chat templates: compiling and rendering them as Hugging Face transformers does.

The environment is transformers' (`apply_chat_template` in "Templates for chat models"):
sandboxed, trimmed blocks, `raise_exception`, `strftime_now`, and its `tojson` filter, which
keeps key order and writes non-ASCII text as is (Jinja's own sorts keys and escapes HTML):
templates that render tools or tool-call arguments depend on it. `tools` (OpenAI's
`[{"type": "function", "function": {...}}]` list) and `documents` are passed as transformers
passes them, None when absent. How a rendered conversation becomes ids and a loss mask is
`astrai.data.chat_ids`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import json

import jinja2
import jinja2.meta
from jinja2.ext import Extension

from astrai.data.chat_templates import CHATML
from astrai.data.template_sandbox import BoundedSandbox, bounded_render
from astrai.errors import ConfigError, DataError

# What `astrai tokenizer train` gives a new tokenizer: ChatML with a BOS at the start.
DEFAULT_CHAT_TEMPLATE = CHATML

# Role markers the default template uses; `train_tokenizer` makes them special tokens.
CHAT_MARKERS = ("<|im_start|>", "<|im_end|>")


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _GenerationBlocks(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' marker of assistant text for
    `return_assistant_tokens_mask`) renders its body unchanged; astrai's masks come from the
    located reply spans either way."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template the way HF transformers does (sandboxed, trimmed blocks), in
    a sandbox that also bounds what a rendering may build (template_sandbox.py)."""
    env = BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationBlocks]
    )
    env.add_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"chat template: syntax error at line {e.lineno}: {e.message}") from e


def render(source: str, messages: Sequence[dict], *, add_generation_prompt: bool = False,
           special: dict[str, Any] | None = None, tools: Sequence[dict] | None = None,
           extra: dict[str, Any] | None = None) -> str:
    """Render `messages` through the template `source` (special: bos_token, eos_token, ...;
    tools: the function tools in OpenAI's shape, None = none; extra: further template
    variables, e.g. Qwen3's enable_thinking, which never replace the ones above)."""
    fixed = {"messages": list(messages), "add_generation_prompt": add_generation_prompt,
             "tools": None if tools is None else list(tools), "documents": None,
             **(special or {})}
    try:
        return bounded_render(compile_template(source),
                              **{k: v for k, v in (extra or {}).items() if k not in fixed},
                              **fixed)
    except RecursionError:  # a macro that calls itself without end
        raise DataError("chat template failed to render: recursion deeper than Python's "
                        "limit (a macro or include that calls itself without end?); fix "
                        "the template") from None
    except jinja2.TemplateError as e:
        raise DataError(f"chat template failed to render: {e}") from e
    except Exception as e:  # noqa: BLE001 -- any error of the template's code is its own
        raise DataError(f"chat template failed to render: {type(e).__name__}: {e}") from e


_PROBE = "astrai_probe_function_7f3a"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE, "description": "probe", "parameters": {"type": "object", "properties": {}}}}]


@lru_cache(maxsize=32)
def renders_tools(source: str) -> bool:
    """Whether the template writes the tools it is given into the prompt: a one-message
    conversation is rendered with a probe tool and the probe's name looked for (a template
    that fails on that conversation counts when it reads a `tools` variable)."""
    try:
        text = bounded_render(
            compile_template(source), messages=[{"role": "user", "content": "hi"}],
            add_generation_prompt=True, tools=_PROBE_TOOLS, documents=None, bos_token="",
            eos_token="", pad_token="")
    except Exception:  # noqa: BLE001 -- the template's own failure, whatever its type
        env = compile_template(source).environment
        return "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
    return _PROBE in text


def check_messages(messages: Any, where: str) -> list[dict]:
    """Validate a message list (role/content strings); DataError naming `where` otherwise."""
    if not isinstance(messages, list):
        raise DataError(f"{where}: expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise DataError(f"{where}: the message list is empty")
    for j, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{where}[{j}]: expected an object with role and content")
        if not isinstance(m.get("role"), str):
            raise DataError(f"{where}[{j}]: missing or non-string 'role'")
        if not isinstance(m.get("content"), str):
            raise DataError(f"{where}[{j}]: missing or non-string 'content'")
    return messages
