"""A Jinja sandbox whose renderings are bounded in size and time.

A chat template ships with a model and runs on every chat request, so a hostile or broken
one must not take the process with it: Jinja's `ImmutableSandboxedEnvironment` refuses
unsafe attributes and caps `range` (jinja2.sandbox.MAX_RANGE), but
`{{ 'a' * (10**6) * (10**4) }}` still asks for 10 GB, `{{ 'a'|center(10**10) }}` as much,
and two nested loops over a long message run for hours. The environment here uses the
sandbox's hooks ("Sandbox" in the Jinja docs: `intercepted_binops` / `call_binop`, `call`,
`getattr`, `getitem`) to refuse an operation before it builds a value of more than
MAX_RENDER_CHARS items, wraps every filter the same way, and `bounded_render` streams the
output (`Template.generate`), stopping past MAX_RENDER_CHARS characters or
MAX_RENDER_SECONDS of work. The time is checked from a line tracer (`sys.settrace`) on the
template's own code only, so a loop with an empty body is stopped too.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Sized
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDER_CHARS = 1 << 24
"""Most characters a rendering may write, and most items (characters, list entries) any
value it builds may hold: 16 Mi, four times the server's largest request body."""
MAX_RENDER_SECONDS = 5.0
"""Most seconds of work one rendering may take (a 1,024-message chat renders in ms)."""
MAX_POWER_BITS = 4096
"""Largest integer `**` may build, in bits (Python integers grow without bound)."""
_TEMPLATE_FILE = "<template>"
"""The file name Jinja gives the code of a template compiled from a string."""
_WIDTH = re.compile(r"%[-+ #0]*(\d+)?(?:\.(\d+))?")


class TemplateLimitError(jinja2.TemplateRuntimeError):
    """A rendering went past MAX_RENDER_CHARS or MAX_RENDER_SECONDS."""


def _too_big(what: str, n: int) -> TemplateLimitError:
    return TemplateLimitError(f"{what} of {n} items is over the limit of {MAX_RENDER_CHARS} "
                              "(astrai.data.template_sandbox.MAX_RENDER_CHARS)")


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, Sized) and not isinstance(value, dict | range):
        n = len(value)
        if n > MAX_RENDER_CHARS:
            raise _too_big(what, n)
    return value


def _check_args(args: tuple, kwargs: dict, what: str) -> None:
    """An integer argument over the limit (a width, a count, a repeat) is refused before
    the call builds anything of that size."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_RENDER_CHARS:
            raise TemplateLimitError(f"{what}: the argument {v} is over the limit of "
                                     f"{MAX_RENDER_CHARS}")


def _binop_size(op: str, left: Any, right: Any) -> None:
    """Refuse `*`, `+`, `%` and `**` whose result would be over the limit, before computing it."""
    if op == "*":
        for seq, k in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(k, int):
                if len(seq) * max(k, 0) > MAX_RENDER_CHARS:
                    raise _too_big("a repetition", len(seq) * k)
    elif op == "+" and isinstance(left, str | list | tuple) and isinstance(right, Sized):
        if len(left) + len(right) > MAX_RENDER_CHARS:
            raise _too_big("a concatenation", len(left) + len(right))
    elif op == "%" and isinstance(left, str):
        widths = [int(w) for m in _WIDTH.finditer(left) for w in m.groups() if w]
        if any(w > MAX_RENDER_CHARS for w in widths):
            raise TemplateLimitError(f"a format width of {max(widths)} is over the limit of "
                                     f"{MAX_RENDER_CHARS}")
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        if right * math.log2(abs(left)) > MAX_POWER_BITS:
            raise TemplateLimitError(f"{left} ** {right} is over the limit of "
                                     f"{MAX_POWER_BITS} bits")


def _replace_size(obj: Any, args: tuple) -> None:
    """str.replace grows its subject by count(old) x the length difference."""
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str) and args[0]:
        grown = len(obj) + obj.count(args[0]) * max(len(args[1]) - len(args[0]), 0)
        if grown > MAX_RENDER_CHARS:
            raise _too_big("a replacement", grown)


def _bounded_filter(name: str, f: Callable) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        _check_args(args, kwargs, f"filter {name}")
        return _check_size(f(*args, **kwargs), f"the result of filter {name}")

    for attr in ("jinja_pass_arg",):  # pass_context / pass_eval_context markers
        if hasattr(f, attr):
            setattr(run, attr, getattr(f, attr))
    return run


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose operations refuse values over MAX_RENDER_CHARS."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.filters = {k: _bounded_filter(k, f) for k, f in self.filters.items()}

    def add_filter(self, name: str, f: Callable) -> None:
        self.filters[name] = _bounded_filter(name, f)

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        _binop_size(op, left, right)
        return super().call_binop(context, op, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        return _check_size(super().getattr(obj, attribute), f"attribute {attribute}")

    def getitem(self, obj: Any, argument: Any) -> Any:
        return _check_size(super().getitem(obj, argument), "an item")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_args(args, kwargs, "a call")
        if getattr(__obj, "__name__", None) == "replace" and isinstance(
                getattr(__obj, "__self__", None), str):
            _replace_size(__obj.__self__, args)
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a call's result")


class _Deadline:
    """A `sys.settrace` tracer that raises TemplateLimitError in the template's own code
    once MAX_RENDER_SECONDS have passed (checked every 256 lines it runs)."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.lines = 0

    def on_call(self, frame: Any, event: str, arg: Any) -> Any:
        return self.on_line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def on_line(self, frame: Any, event: str, arg: Any) -> Any:
        self.lines += 1
        if not self.lines & 255 and time.monotonic() > self.end:
            raise TemplateLimitError(f"rendering took over {self.seconds:g} s (the limit, "
                                     "astrai.data.template_sandbox.MAX_RENDER_SECONDS)")
        return self.on_line


def bounded_render(template: jinja2.Template, seconds: float | None = None,
                   **variables: Any) -> str:
    """`template.render(**variables)`, streamed and stopped (TemplateLimitError) past
    MAX_RENDER_CHARS characters or `seconds` (None: MAX_RENDER_SECONDS) of work."""
    deadline = _Deadline(MAX_RENDER_SECONDS if seconds is None else seconds)
    before = sys.gettrace()
    parts: list[str] = []
    size = 0
    sys.settrace(deadline.on_call)
    try:
        for piece in template.generate(**variables):
            size += len(piece)
            if size > MAX_RENDER_CHARS:
                raise _too_big("the rendered text", size)
            parts.append(piece)
    finally:
        sys.settrace(before)
    return "".join(parts)
