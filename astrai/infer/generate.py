"""`Engine.generate`: one prompt or a list, all queued at once, outputs in prompt order or
streamed as deltas."""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence
from numbers import Integral
from typing import Any

import torch

from astrai.errors import ConfigError
from astrai.infer.intake import Prompt
from astrai.infer.params import SamplingParams
from astrai.infer.request import RequestOutput
from astrai.infer.routing import drain


def _per_prompt(value: Any, kind: type | tuple, n: int, what: str) -> list:
    """`value` for every prompt (one given, or None), or the list given, checked for
    length."""
    out = [value] * n if value is None or isinstance(value, kind) else list(value)
    if len(out) != n:
        raise ConfigError(f"{len(out)} {what} for {n} prompts")
    return out


def generate(engine: Any, prompts: Prompt | Sequence[Prompt],
             params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             stream: bool = False, lora: str | None | Sequence[str | None] = None
             ) -> list[RequestOutput] | Iterator[RequestOutput]:
    """See Engine.generate."""
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
    if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], Integral)):
        prompts = [prompts]
    params = _per_prompt(params, SamplingParams, len(prompts), "sampling params")
    loras = _per_prompt(lora, str, len(prompts), "lora names")
    sink: queue.SimpleQueue = queue.SimpleQueue()
    with engine.lock:  # all or none: every request is checked before any is queued
        reqs = [engine._request(p, sp, index=i, lora=a)
                for i, (p, sp, a) in enumerate(zip(prompts, params, loras))]
        for r in reqs:
            engine._submit(r)
            engine.streams.attach(r.id, sink)
    it = drain(engine, [r.id for r in reqs], sink)
    if stream:
        return it
    final = {o.request_id: o for o in it if o.finished}
    return [final[r.id] for r in reqs]
