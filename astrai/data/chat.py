"""Chat templates: rendering, and splitting a conversation into per-message segments.

The mask algorithm of template mode (docs/spec-reference.md) renders
each message through the chat template and masks it by role. Rendering a message *alone*
breaks templates that inject text on every render (a default system prompt, a BOS per
render), so we render growing prefixes and take differences instead:

    segment_i = render(messages[:i+1])[len(render(messages[:i])):]

An assistant segment is further split into its generation prompt (what
`add_generation_prompt=True` appends, e.g. "<|im_start|>assistant\\n") and its body.
`Tokenizer.encode_chat` encodes the same segments, so the tokens SFT trains on for a history
are exactly the tokens `astrai chat` feeds the model for that history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from astrai.errors import ConfigError, DataError

# ChatML with a BOS at the start of every render. No default system prompt.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Role markers the default template uses; `train_tokenizer` makes them special tokens.
CHAT_MARKERS = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class Segment:
    """One piece of a rendered conversation."""

    text: str
    role: str
    """The role of the message this text belongs to ("" for a template preamble)."""
    kind: str
    """"preamble" (rendered with no messages), "message", "gen_prompt" or "body"."""
    index: int
    """Index of the message in the conversation (-1 for the preamble)."""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template the way HF transformers does (sandboxed, trimmed blocks)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"chat template: syntax error at line {e.lineno}: {e.message}") from e


def render(source: str, messages: Sequence[dict], *, add_generation_prompt: bool = False,
           special: dict[str, Any] | None = None) -> str:
    """Render `messages` through the template `source` (special: bos_token, eos_token, ...)."""
    try:
        return compile_template(source).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            tools=None, **(special or {}),
        )
    except jinja2.TemplateError as e:
        raise DataError(f"chat template failed to render: {e}") from e


def _render_prefix(source: str, messages: Sequence[dict], special: dict, agp: bool) -> str:
    if not messages and not agp:
        # Some templates index messages[0]; an empty history then has no preamble.
        try:
            return compile_template(source).render(
                messages=[], add_generation_prompt=False, tools=None, **special
            )
        except (jinja2.TemplateError, LookupError, TypeError, AttributeError):
            return ""
    return render(source, messages, add_generation_prompt=agp, special=special)


def _delta(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise DataError(
            f"chat template is not prefix-stable: rendering {what} changes earlier text, so "
            "per-message masking cannot match what chat feeds the model; use a template whose "
            "render of a history is a prefix of the render of any longer history"
        )
    return longer[len(shorter):]


def chat_segments(source: str, messages: Sequence[dict], *, add_generation_prompt: bool,
                  special: dict[str, Any] | None = None) -> list[Segment]:
    """Split the render of `messages` into segments whose concatenation is the full render."""
    special = special or {}
    prev = _render_prefix(source, [], special, False)
    segs = [Segment(prev, "", "preamble", -1)] if prev else []
    for i, m in enumerate(messages):
        cur = render(source, messages[: i + 1], special=special)
        if m.get("role") == "assistant":
            with_gp = render(source, messages[:i], add_generation_prompt=True, special=special)
            gp = _delta(with_gp, prev, f"the generation prompt before message {i}")
            if cur.startswith(with_gp):
                segs.append(Segment(gp, "assistant", "gen_prompt", i))
                segs.append(Segment(cur[len(with_gp):], "assistant", "body", i))
            else:  # the template renders an assistant turn differently from its prompt
                segs.append(Segment(_delta(cur, prev, f"message {i}"), "assistant", "body", i))
        else:
            segs.append(Segment(_delta(cur, prev, f"message {i}"), str(m.get("role")),
                                "message", i))
        prev = cur
    if add_generation_prompt:
        full = render(source, messages, add_generation_prompt=True, special=special)
        segs.append(Segment(_delta(full, prev, "the generation prompt"), "assistant",
                            "gen_prompt", len(messages)))
    return [s for s in segs if s.text]


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
