"""Observing callbacks and the default set (the hooks: astrai.train.callbacks.base)."""

from __future__ import annotations

from rich.console import Console

from astrai.config.train import TrainConfig
from astrai.inspect.guard import GuardConfig, LockInGuard
from astrai.train.callbacks.base import HOOKS, Callback, CallbackList
from astrai.train.callbacks.metrics import MetricsCallback
from astrai.train.callbacks.progress import ProgressCallback
from astrai.train.callbacks.tensorboard import TensorBoardCallback


def bf16_guard_enabled(config: TrainConfig) -> bool:
    """--guard-bf16 when given, else on exactly with bf16-true weights (where lock-in
    happens: docs/bf16-lockin.md)."""
    bf16 = config.guard.bf16
    return bf16 if bf16 is not None else config.precision.mode == "bf16-true"


def default_callbacks(config: TrainConfig, *, progress: bool = False,
                      console: Console | None = None) -> list[Callback]:
    """bf16 guard (optional), metrics, tensorboard (optional, an
    observer of metrics), progress (optional), preemption (always;
    SIGTERM/SIGINT stop at a step boundary, with a checkpoint of it). Any order works:
    callbacks only observe, and the metrics record writer is called after the others."""
    from astrai.train.preemption import PreemptionCallback

    cbs: list[Callback] = []
    if bf16_guard_enabled(config):
        cbs.append(LockInGuard(GuardConfig(every=config.guard.every,
                                           grad_steps=config.guard.grad_steps,
                                           histograms=config.guard.histograms,
                                           visible_warn=config.guard.visible_warn)))
    metrics = MetricsCallback(log_interval=config.logging.log_interval,
                              peak_tflops=config.logging.peak_tflops)
    cbs.append(metrics)
    if config.logging.tensorboard:
        cbs.append(TensorBoardCallback(metrics))
    if progress:
        cbs.append(ProgressCallback(console))
    cbs.append(PreemptionCallback())
    return cbs


__all__ = [
    "HOOKS", "Callback", "CallbackList", "MetricsCallback", "ProgressCallback",
    "TensorBoardCallback",
    "default_callbacks",
]
