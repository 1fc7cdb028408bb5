"""Executors: how one training process places, wraps and steps the model.

The trainer talks to the model only through an executor (docs/distributed.md "Executors"), so
data/fully-sharded parallelism plug in beside `none` without touching the loop:

    executor = EXECUTORS.get("none")(device=dev, precision=p)
    model, optimizer, scheduler = executor.prepare(model_fn, optimizer_fn, scheduler_fn)
    with executor.grad_sync(model, last_micro_batch):   # no_sync on all but the last
        executor.backward(loss)
    norm = executor.clip_grad_norm(max_norm)

A subclass overrides `_wrap` (DDP / fully_shard), `_no_sync`, `clip_grad_norm` (global
norm), the state-dict methods (gather to rank 0) and the collective helpers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from astrai.train.precision import Precision
from astrai.train.registry import Registry, reject_unknown

ModelFn = Callable[[], nn.Module]
OptimizerFn = Callable[[nn.Module], torch.optim.Optimizer]
SchedulerFn = Callable[[torch.optim.Optimizer], Any]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper (.module); FSDP2's fully_shard and an unwrapped
    model are returned as they are."""
    return getattr(model, "module", model)


class Executor:
    """Single-process base; every method has the meaning a distributed one must keep."""

    name = "base"

    def __init__(self, *, device: torch.device | str = "cpu", precision: Precision | None = None,
                 **options: Any) -> None:
        reject_unknown("executor", self.name, options)
        self.device = torch.device(device)
        self.precision = precision or Precision()
        self.model: nn.Module | None = None

    # -- topology -------------------------------------------------------------------------
    rank: int = 0
    """This process's rank (a distributed executor sets it from the launcher)."""
    world_size: int = 1
    """Processes in the run."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel group: which share of each batch it reads (the
        rank, unless tensor parallelism makes several processes share one batch)."""
        return self.rank

    @property
    def dp_size(self) -> int:
        """Data-parallel groups: how many shares each global batch is split into."""
        return self.world_size

    # -- set-up ---------------------------------------------------------------------------
    def prepare(self, model_fn: ModelFn, optimizer_fn: OptimizerFn,
                scheduler_fn: SchedulerFn) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        """Create the model, wrap it, then build optimizer and scheduler over the wrapped
        parameters (so a sharded wrapper's parameters are the ones optimised)."""
        model = model_fn().to(device=self.device, dtype=self.precision.param_dtype)
        self.model = self._wrap(model)
        optimizer = optimizer_fn(self.model)
        scheduler = scheduler_fn(optimizer)
        return self.model, optimizer, scheduler

    def _wrap(self, model: nn.Module) -> nn.Module:
        return model

    def unwrap(self, model: nn.Module | None = None) -> nn.Module:
        """The plain model under any wrapper (for state dicts and evaluation)."""
        return unwrap(model if model is not None else self.model)

    # -- the step ---------------------------------------------------------------------------
    def grad_sync(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward and backward: with sync=False (every micro-batch
        of a window but the last) gradients accumulate locally, without the cross-rank
        reduction; the last one reduces the whole window's gradients once."""
        return contextlib.nullcontext() if sync else self._no_sync(model)

    def _no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # one process: nothing to skip

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.precision.autocast(self.device)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of all gradients before clipping (a device tensor, not read);
        clip to max_norm when > 0. A non-finite norm leaves the gradients untouched so the
        culprit can be named."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        clip_by_norm_(list(self.model.parameters()), max_norm, norm)
        return norm

    def window_normalizer(self, loss_units: torch.Tensor) -> torch.Tensor:
        """Divisor of the summed per-unit loss of this rank's window (a float64 device
        tensor, never read on the host). One process: the window's unit count. (DDP
        averages gradients over ranks, so it returns the global count divided by
        world_size.)"""
        return loss_units.clamp(min=1)

    # -- state for checkpoints ----------------------------------------------------------------
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """Full state dict (on rank 0; {} elsewhere), tensors on CPU."""
        return {k: v.detach().cpu() for k, v in self.unwrap().state_dict().items()}

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    # -- collectives (identity with one process) --------------------------------------------
    def all_reduce_sum(self, value: float) -> float:
        """Sum of a host number over ranks (validation sums)."""
        return value

    def all_reduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of a device tensor over the data-parallel ranks (every share of the batch
        once), returned as a new tensor and not read on the host (the step's stacked sums:
        one collective per step, not one per figure)."""
        return t

    def barrier(self) -> None:
        pass

    def checkpoint_group(self) -> Any:
        """The process group of background (async) checkpoint writes; None with one
        process (DCP then saves without one)."""
        return None

    def close(self) -> None:
        pass


def clip_by_norm_(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """torch.nn.utils.clip_grads_with_norm_ without reading `norm` on the host: a
    non-finite norm is replaced by 0 for the coefficient, which then clamps to 1.0, so
    such gradients are multiplied by exactly 1 (left as they are). A finite norm gives
    torch's own coefficient, op for op."""
    if max_norm > 0:
        safe = torch.nan_to_num(norm, nan=0.0, posinf=0.0, neginf=0.0)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, safe)


class NoneExecutor(Executor):
    """One process, one device."""

    name = "none"


# Add an executor with one line: "name": "module.path:Class" (imported only when chosen).
EXECUTORS: Registry[Executor] = Registry("parallel", {
    "none": NoneExecutor,
    "ddp": "astrai.train.executors.ddp:DDPExecutor",
    "fsdp": "astrai.train.executors.fsdp:FSDPExecutor",
})

