"""The engine's flags, listed once: `@engine_flags()` gives a command all of them.

    @app.command("chat")
    @engine_flags()
    def chat_cmd(checkpoint: ..., *, engine: EngineOptions) -> None: ...

The decorator appends the flags below to the command's signature (Typer reads the
signature), collects their values into one `astrai.infer.build.EngineOptions` and passes it
as `engine`; chat, serve and serve-bench take every flag, eval the ones that load a model.
A new engine option is one entry here and one field of EngineOptions.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from astrai_cli.options import (
    Adapter,
    Device,
    Dtype,
    EnforceEager,
    MaxLoraRank,
    MaxLoras,
    NumSpeculativeTokens,
    Quantize,
    Speculative,
    SpeculativeModel,
    parse_loras,
    speculative_config,
)

PANEL = "Model and decoding"

Loras = Annotated[list[str] | None, typer.Option(
    "--lora", metavar="NAME=DIR", help="Serve the PEFT LoRA adapter DIR unmerged beside the "
    "base as NAME (repeatable; adapters of any rank and targets share one batch). serve: a "
    "request's model picks it; chat: replies use the first, /lora NAME switches; serve-bench: "
    "requests take them in turn.")]

FLAGS: dict[str, tuple[Any, Any]] = {
    "device": (Device, "auto"),
    "dtype": (Dtype, "auto"),
    "quantize": (Quantize, "none"),
    "adapter": (Adapter, None),
    "enforce_eager": (EnforceEager, False),
    "speculative": (Speculative, "none"),
    "speculative_model": (SpeculativeModel, None),
    "num_speculative_tokens": (NumSpeculativeTokens, 4),
    "lora": (Loras, None),
    "max_loras": (MaxLoras, None),
    "max_lora_rank": (MaxLoraRank, 16),
}
"""Flag parameter -> (its Annotated type, its default)."""

LOADING = ("device", "dtype", "quantize", "adapter", "enforce_eager")
"""The flags of a command that loads a model but serves no adapters or speculation (eval)."""


def engine_options(values: dict[str, Any]) -> Any:
    """The EngineOptions of the flags' values (one-line ConfigErrors for bad ones)."""
    from astrai.infer.build import EngineOptions

    spec = speculative_config(values.get("speculative", "none"),
                              values.get("speculative_model"),
                              values.get("num_speculative_tokens", 4))
    adapter = values.get("adapter")
    return EngineOptions(
        device=values.get("device", "auto"), dtype=values.get("dtype", "auto"),
        quantize=values.get("quantize", "none"),
        adapter=None if adapter is None else str(adapter),
        decode="eager" if values.get("enforce_eager") else "auto", speculative=spec,
        loras=parse_loras(values.get("lora")), max_loras=values.get("max_loras"),
        max_lora_rank=values.get("max_lora_rank", 16))


def _in_panel(annotation: Any) -> Any:
    """The Annotated flag type with its Option moved into the help's PANEL."""
    base, *extras = typing.get_args(annotation)
    moved = []
    for extra in extras:
        if isinstance(extra, typer.models.OptionInfo):
            extra = copy.copy(extra)  # the shared type stays as it is for other commands
            extra.rich_help_panel = PANEL
        moved.append(extra)
    return Annotated[(base, *moved)]


def _resolved(annotation: Any, fn: Callable) -> Any:
    """A string annotation evaluated where `fn` was written (Typer needs the objects)."""
    if not isinstance(annotation, str):
        return annotation
    return eval(annotation, fn.__globals__)  # the command module's own source text


def engine_flags(names: tuple[str, ...] | None = None) -> Callable[[Callable], Callable]:
    """Give the decorated command the engine flags `names` (default: all of FLAGS), passed
    to it as one EngineOptions in its keyword-only parameter `engine`."""
    chosen = tuple(FLAGS) if names is None else names

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn)  # the annotations as written (strings, lazily imported)
        own = [p.replace(annotation=_resolved(p.annotation, fn))
               for p in sig.parameters.values() if p.name != "engine"]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY,
                                   annotation=_in_panel(FLAGS[n][0]), default=FLAGS[n][1])
                 for n in chosen]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            values = {n: kwargs.pop(n) for n in chosen}
            return fn(**kwargs, engine=engine_options(values))

        command.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in own + added}
        del command.__wrapped__  # Typer reads the signature above, not fn's
        return command

    return decorate
