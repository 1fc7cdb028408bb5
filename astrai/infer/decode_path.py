"""The engine's decode path: chosen once at construction, named, checked on its first step.

    path = choose_path(runner, "auto", max_batch)  # "native" | "graphs" | "static" | "eager"
    logits = path.run(batch, backend, lora)        # the step's one call site

Every step of an engine goes through one `DecodePath`. A fast path — the native CPU step
(astrai/infer/native_step.py: every block in one C++ call), or the static-shape step
(astrai/infer/decode_step.py: CUDA graphs, or its buffers run eagerly) — takes the steps its
declared capabilities cover and hands every other one (prefill, adapters' rows, more rows than
it takes) to the eager ragged runner, which serves everything. Capabilities are what a path
declares, never branches in the engine's step:

* `verifies` — speculative verify rows (a request's token and its k proposals in one step);
* the step's shape (`accepts`: one token per request, within the path's row limit).

Rows of unmerged LoRA adapters always run eager: only the runner adds their updates.

Int8 and bf16 weights, and sliding windows, are decided at construction: a path that cannot
serve the model is never chosen (`native_step.unsupported`, `decode_step.static_unsupported`).

A fast path is checked on its first step against the eager reference on the same batch: it
runs, then the eager runner runs the same step (rewriting the same K/V slots with its own
values) and each row's logits are compared by cosine similarity — rounding differences between
a kernel and torch (fp32, bf16 or int8) stay far above the bound, a wrong kernel (a slot
misread, a missing term) falls far below it. On a mismatch or an exception the path is
switched off with one warning naming it and why, the step's eager logits are used, and the
engine runs eager from then on (an exception on a later step — a CUDA graph capture of a
new batch bucket — switches it off the same way; `name` becomes "eager"; `Engine.stats().decode`, `chat`'s
/stats, `serve`'s /metrics and `serve-bench` report it).
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from astrai.infer.backends.base import mismatch
from astrai.infer.decode_step import DecodeStep, static_unsupported
from astrai.infer.native_step import NativeDecodeStep, unsupported
from astrai.infer.runner import ModelRunner
from astrai.infer.scheduler import StepBatch
from astrai.model.context import AttentionBackend
from astrai.model.lora_batch import LoraSelection

log = logging.getLogger("astrai.infer")

MIN_COSINE = 0.99
"""Each row's logits, fast path against eager, must be at least this similar: fp32 kernels
agree to ~1e-7, bf16 and int8 activations to ~1e-3; a wrong kernel gives ~0 or NaN."""


class FastStep(Protocol):
    """A native or static step (native_step.NativeDecodeStep, decode_step.DecodeStep)."""

    verifies: bool

    def accepts(self, batch: StepBatch) -> bool: ...

    def run(self, batch: StepBatch) -> torch.Tensor: ...


class DecodePath:
    """Runs every step: `fast` where it takes the step, else the eager runner."""

    def __init__(self, name: str, runner: ModelRunner, fast: FastStep | None = None) -> None:
        self.name = name
        self.runner = runner
        self.fast = fast
        self.checked = fast is None
        """Whether the fast path's first step was compared with eager (or there is none)."""
        self.failure: str | None = None
        """Why the fast path was switched off, or None."""

    def takes(self, batch: StepBatch, lora: LoraSelection | None) -> bool:
        """The fast path's declared capabilities cover the step."""
        f = self.fast
        if f is None or lora is not None:  # adapters' rows: the eager runner adds them
            return False
        if not f.verifies and any(c.draft for c in batch.chunks):
            return False
        return f.accepts(batch)

    def run(self, batch: StepBatch, backend: AttentionBackend,
            lora: LoraSelection | None = None) -> torch.Tensor:
        """fp32 logits [n_sampling, V] of the step's sampling rows, in order."""
        if not self.takes(batch, lora):
            return self.runner.run(batch, backend, lora)
        if not self.checked:
            return self._first(batch, backend)
        try:
            return self.fast.run(batch)
        except Exception as e:  # noqa: BLE001 - e.g. a later bucket's CUDA graph capture
            return self._switch_off(f"{type(e).__name__}: {e}", batch, backend)

    def _first(self, batch: StepBatch, backend: AttentionBackend) -> torch.Tensor:
        """The fast path's first step, compared with the eager runner's on the same batch."""
        self.checked = True
        try:
            fast = self.fast.run(batch)
        except Exception as e:  # noqa: BLE001 - any failure of an accelerated path: eager
            return self._switch_off(f"{type(e).__name__}: {e}", batch, backend)
        ref = self.runner.run(batch, backend)  # rewrites the step's K/V slots, eagerly
        why = mismatch(fast, ref, "logits", "the eager step's", MIN_COSINE)
        if why is not None:
            self._switch_off(why, None, None)
        return ref

    def _switch_off(self, why: str, batch: StepBatch | None,
                    backend: AttentionBackend | None) -> torch.Tensor | None:
        log.warning("decode path %s switched off, running eager: %s", self.name, why)
        self.failure = f"{self.name}: {why}"
        self.name, self.fast = "eager", None
        return None if batch is None else self.runner.run(batch, backend)


def choose_path(runner: ModelRunner, mode: str, max_batch: int) -> DecodePath:
    """The engine's one path for decode `mode` (auto | native | graphs | static | eager):
    native where the runner's kernels serve the model, else the static step in the mode it
    resolves to (graphs | static), else eager; logged once."""
    model, pool, kernels = runner.model, runner.pool, runner.kernels
    native = NativeDecodeStep.create(model, pool, runner.head_operands, kernels, mode)
    static = DecodeStep(model, pool, runner.lm_head, mode, max_batch, kernels)
    if native is not None:
        path = DecodePath("native", runner, native)
    elif static.enabled:
        path = DecodePath(static.mode, runner, static)
    else:
        path = DecodePath("eager", runner)
    why = [] if mode in ("eager", path.name) else [
        f"{name}: {reason}" for name, reason in (
            ("native", unsupported(model, pool, kernels) if native is None else None),
            ("static", static_unsupported(model, pool) if not static.enabled else None))
        if reason is not None]
    log.info("decode path: %s%s", path.name, f" ({'; '.join(why)})" if why else "")
    return path
