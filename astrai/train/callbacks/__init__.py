"""Callbacks and the default set (seeds/training.md "Callback Lifecycle")."""

from __future__ import annotations

from rich.console import Console

from astrai.config.train import TrainConfig
from astrai.inspect.guard import GuardConfig, LockInGuard
from astrai.train.callbacks.base import HOOKS, Callback, CallbackList
from astrai.train.callbacks.checkpoint import CheckpointCallback
from astrai.train.callbacks.clipping import GradientClippingCallback
from astrai.train.callbacks.grad_ckpt import GradientCheckpointingCallback
from astrai.train.callbacks.metrics import MetricsCallback
from astrai.train.callbacks.progress import ProgressCallback
from astrai.train.callbacks.tensorboard import TensorBoardCallback
from astrai.train.compile import checkpoint_module_types


def bf16_guard_enabled(config: TrainConfig) -> bool:
    """--guard-bf16 when given, else on exactly with bf16-true weights (issue 8 item 5)."""
    return config.guard_bf16 if config.guard_bf16 is not None else config.precision == "bf16-true"


def default_callbacks(config: TrainConfig, *, progress: bool = False,
                      console: Console | None = None) -> list[Callback]:
    """gradient_checkpointing (optional), metrics, tensorboard (optional, an observer of
    metrics), checkpoint, progress (optional),
    gradient_clipping (always), preemption (always; SIGTERM/SIGINT save and stop).

    Metrics come before checkpoint (the seeds list checkpoint first): both act at
    on_step_end, and writing step N's record before checkpoint step_N exists means a run
    killed in between never resumes with that record missing.
    """
    from astrai.train.preemption import PreemptionCallback

    cbs: list[Callback] = []
    if config.gradient_checkpointing:
        cbs.append(GradientCheckpointingCallback(
            checkpoint_module_types(config.gradient_checkpointing_modules)))
    if bf16_guard_enabled(config):  # before metrics, so its figures land in this step's record
        cbs.append(LockInGuard(GuardConfig(every=config.guard_every,
                                           grad_steps=config.guard_grad_steps,
                                           histograms=config.guard_histograms)))
    metrics = MetricsCallback(log_interval=config.log_interval,
                              eval_interval=config.eval_interval,
                              eval_max_batches=config.eval_max_batches,
                              peak_tflops=config.peak_tflops)
    cbs.append(metrics)
    if config.tensorboard:
        cbs.append(TensorBoardCallback(metrics))
    cbs.append(CheckpointCallback(config.ckpt_interval))
    if progress:
        cbs.append(ProgressCallback(console))
    cbs.append(GradientClippingCallback(config.max_grad_norm))
    cbs.append(PreemptionCallback())  # last: after this step's record and checkpoint
    return cbs


__all__ = [
    "HOOKS", "Callback", "CallbackList", "CheckpointCallback", "GradientCheckpointingCallback",
    "GradientClippingCallback", "MetricsCallback", "ProgressCallback", "TensorBoardCallback",
    "default_callbacks",
]
