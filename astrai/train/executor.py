"""Executors: how one training process places, wraps and steps the model.

The trainer talks to the model only through an executor (DESIGN.md "Executor"), so
data/fully-sharded parallelism plug in beside `none` without touching the loop:

    executor = ExecutorFactory.create("none", grad_accum_steps=4, device=dev, precision=p)
    model, optimizer, scheduler = executor.prepare(model_fn, optimizer_fn, scheduler_fn)
    with executor.accumulate(model):      # advances GradientState; no_sync off-window
        executor.backward(loss)
    if executor.sync_gradients:
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

from astrai.errors import ConfigError
from astrai.train.optim import AccumOptimizer, AccumScheduler, GradientState
from astrai.train.precision import Precision
from astrai.train.registry import Registry

ModelFn = Callable[[], nn.Module]
OptimizerFn = Callable[[nn.Module], torch.optim.Optimizer]
SchedulerFn = Callable[[torch.optim.Optimizer], Any]


class Executor:
    """Single-process base; every method has the meaning a distributed one must keep."""

    name = "base"

    def __init__(self, *, grad_accum_steps: int = 1, device: torch.device | str = "cpu",
                 precision: Precision | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise ConfigError(
                f"executor '{self.name}': unknown option(s) {', '.join(sorted(kwargs))}"
            )
        self.gradient_state = GradientState(grad_accum_steps)
        self.device = torch.device(device)
        self.precision = precision or Precision()
        self.model: nn.Module | None = None

    # -- topology -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def grad_accum_steps(self) -> int:
        return self.gradient_state.grad_accum_steps

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    # -- set-up ---------------------------------------------------------------------------
    def prepare(self, model_fn: ModelFn, optimizer_fn: OptimizerFn,
                scheduler_fn: SchedulerFn) -> tuple[nn.Module, AccumOptimizer, AccumScheduler]:
        """Create the model, wrap it, then build optimizer and scheduler over the wrapped
        parameters (so a sharded wrapper's parameters are the ones optimised)."""
        model = model_fn().to(device=self.device, dtype=self.precision.param_dtype)
        self.model = self._wrap(model)
        optimizer = optimizer_fn(self.model)
        scheduler = scheduler_fn(optimizer)
        return (self.model, AccumOptimizer(optimizer, self.gradient_state),
                AccumScheduler(scheduler, self.gradient_state))

    def _wrap(self, model: nn.Module) -> nn.Module:
        return model

    def unwrap(self, model: nn.Module | None = None) -> nn.Module:
        """The plain model under any wrapper (for state dicts and evaluation)."""
        model = model if model is not None else self.model
        return getattr(model, "module", model)

    # -- the step ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def accumulate(self, model: nn.Module):
        self.gradient_state.advance()  # before forward: the last micro-step knows it syncs
        ctx = contextlib.nullcontext() if self.sync_gradients else self._no_sync(model)
        with ctx:
            yield

    def _no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # one process: nothing to skip

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.precision.autocast(self.device)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of all gradients before clipping; clip to max_norm when > 0.
        A non-finite norm leaves the gradients untouched so the culprit can be named."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if max_norm > 0 and torch.isfinite(norm):
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), max_norm, norm)
        return norm

    def window_normalizer(self, loss_units: int) -> float:
        """Divisor of the summed per-unit loss of this rank's window. One process: the
        window's unit count. (DDP averages gradients over ranks, so it returns the global
        count divided by world_size.)"""
        return float(max(1, loss_units))

    # -- state for checkpoints ----------------------------------------------------------------
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """Full state dict (on rank 0; {} elsewhere), tensors on CPU."""
        return {k: v.detach().cpu() for k, v in self.unwrap().state_dict().items()}

    def optimizer_state_dict(self, optimizer: AccumOptimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: AccumOptimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    # -- collectives (identity with one process) --------------------------------------------
    def all_reduce_sum(self, value: float) -> float:
        return value

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


class NoneExecutor(Executor):
    """One process, one device."""

    name = "none"


# Add an executor with one line: "name": "module.path:Class" (imported only when chosen).
EXECUTORS: Registry[Executor] = Registry("parallel", {
    "none": NoneExecutor,
    "ddp": "astrai.train.executors.ddp:DDPExecutor",
    "fsdp": "astrai.train.executors.fsdp:FSDPExecutor",
})


class ExecutorFactory:
    """`ExecutorFactory.create(parallel_mode, grad_accum_steps=..., **kwargs)` (seeds)."""

    @staticmethod
    def create(name: str, **kwargs: Any) -> Executor:
        return EXECUTORS.get(name)(**kwargs)
