"""What the trainer tells its callbacks about a step, and the two things they may ask back.

* `MicroBatch`: one micro-batch of the current window (on_batch_begin / on_batch_end).
* `StepReport`: a frozen, host-side account of one committed optimizer step (on_step_end).
  The device figures (loss, grad norm, strategy metrics, loss units) are read on the host
  only on logged steps (`logged`: every `log_interval` steps, at validation, at the last
  step, or when a callback asked with `StepControl.request_log`); on the other steps they
  are None / empty and reading them costs nothing (docs/train.md "Host reads").
* `StepControl`: per step, a callback may `request_stop(reason)` (the run ends at this step
  boundary, with a checkpoint of it), `add_metric(name, value)` (a figure for this step's
  record) and `request_log()` (read this step's figures; in on_optimizer_step).

Callbacks never write the trainer's state (docs/architecture.md "The training step").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of the window being run."""

    step: int
    """The optimizer step this micro-batch belongs to (committed step + 1)."""
    index: int
    """Its position in the window, 0 .. grad_accum_steps - 1."""
    batch: Mapping[str, torch.Tensor]
    """The micro-batch on its device."""


@dataclass(frozen=True)
class StepReport:
    """One committed optimizer step, as host values."""

    step: int
    """Optimizer steps completed, this one included (the N of checkpoints/step_N)."""
    epoch: int
    lr: float
    """Learning rate this step used."""
    step_time: float
    """Seconds of the step: its window's data, forward, backward and update (validation
    and checkpoint writing excluded)."""
    tokens: int
    """Input tokens of the step over all ranks (padding included)."""
    samples: int
    """Samples of the step over all ranks."""
    skipped: bool
    """The loss or gradient was not finite and --skip-nonfinite allowed skipping it."""
    done: bool
    """This is the run's last step."""
    logged: bool
    """The device figures below were read on the host for this step."""
    loss: float | None = None
    """Mean loss over the step's loss units, all ranks (logged steps only)."""
    grad_norm: float | None = None
    """Global L2 norm of the gradients before clipping (logged steps only)."""
    loss_units: int | None = None
    """Loss units (tokens, pairs, prompts) of the step over all ranks (logged steps only)."""
    metrics: Mapping[str, Any] = field(default_factory=_empty)
    """The strategy's metrics, unit-weighted over the window and the ranks, plus figures
    callbacks added (logged steps only, except added ones, which are always present)."""
    evaluated: bool = False
    """Validation ran at this step; `eval` holds its figures."""
    eval: Mapping[str, float] = field(default_factory=_empty)
    """val_loss, val_ppl, val_bpb of this step's validation."""

    def with_metrics(self, added: Mapping[str, Any]) -> StepReport:
        if not added:
            return self
        return replace(self, metrics=MappingProxyType({**self.metrics, **added}))


@dataclass
class StepControl:
    """A step's requests from callbacks; the trainer reads them, callbacks only call."""

    stop_reason: str | None = None
    log_requested: bool = False
    record_requested: bool = False
    added: dict[str, Any] = field(default_factory=dict)

    def request_stop(self, reason: str) -> None:
        """End the run at this step boundary (a checkpoint of it is written)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def add_metric(self, name: str, value: Any) -> None:
        """A figure for this step's record (metrics.jsonl when the step is logged)."""
        self.added[name] = value

    def request_log(self) -> None:
        """Read this step's figures on the host (from on_optimizer_step: before the trainer
        reads its finite check, so it costs no extra read)."""
        self.log_requested = True

    def request_record(self) -> None:
        """Read this step's figures and write its record (metrics.jsonl) whatever the log
        interval: for a callback whose added figures belong to this step (from
        on_optimizer_step)."""
        self.log_requested = self.record_requested = True
