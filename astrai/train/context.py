"""TrainContext: the run, as the trainer holds it and shows it to its callbacks.

`TrainerState` is the committed state at the last optimizer-step boundary: it is what a
checkpoint's trainer_state.pt stores, so a resumed run starts exactly at that boundary.
The rest of the context is the run's parts and what the run's end reports. Only the
trainer writes it: callbacks read it and learn of each step from a frozen StepReport
(astrai.train.report); they ask for a stop or add figures through a StepControl.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from astrai.config.train import TrainConfig
from astrai.model.config import ModelConfig
from astrai.train.executors import Executor
from astrai.train.report import StepReport
from astrai.train.schedule import LRScheduler
from astrai.train.strategies.base import Strategy


@dataclass
class TrainerState:
    """Counters at the last optimizer-step boundary (saved in trainer_state.pt)."""

    step: int = 0
    """Optimizer steps completed (the N of checkpoints/step_N)."""
    epoch: int = 0
    """Current epoch (0-based)."""
    epoch_batches: int = 0
    """Micro-batches of the current epoch consumed by completed steps (sampler position)."""
    consumed_samples: int = 0
    """Samples consumed over all ranks: batch_per_device * world_size per micro-batch."""
    consumed_tokens: int = 0
    """Input tokens consumed over all ranks."""
    skipped_steps: int = 0
    """Steps skipped for a non-finite loss or gradient (--skip-nonfinite)."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def rng_state() -> dict[str, Any]:
    """Every RNG a run may draw from (torch CPU/CUDA, numpy, python), in types that
    torch.load(weights_only=True) accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(gauss)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class RunPaths:
    """Where a run writes (docs/train.md "The run directory")."""

    run_dir: Path
    ckpt_dir: Path

    @property
    def metrics(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def config(self) -> Path:
        return self.run_dir / "train_config.json"

    @property
    def latest(self) -> Path:
        return self.run_dir / "latest"


@dataclass
class TrainContext:
    # -- the run (built once by astrai.train.builder; callbacks read, never replace) -----
    config: TrainConfig
    """The run's resolved config (saved in every checkpoint's meta.json)."""
    model: nn.Module
    """The (possibly wrapped) model being trained."""
    model_config: ModelConfig
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    strategy: Strategy
    """Turns a batch into its loss (the trainer knows no loss)."""
    executor: Executor
    """Device, precision, wrapping, collectives (none | ddp | fsdp)."""
    train_data: Dataset
    """The training samples: dicts of 1-D tensors."""
    sampler: Any
    """Resumable sampler: set_epoch(e), __iter__, __len__, state_dict(consumed=...),
    load_state_dict (this rank's share; astrai.data.rdsampler.RDSampler by default)."""
    collate_fn: Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]]
    total_steps: int
    """Optimizer steps of the whole run."""
    windows_per_epoch: int
    """Optimizer steps in one epoch on each rank (leftover micro-batches are not run)."""
    paths: RunPaths
    """Where the run writes (metrics.jsonl, checkpoints/)."""
    seq_len: int = 0
    """Tokens per row fed to the model (for FLOPs per token)."""
    tokenizer_dir: Path | None = None
    """Copied into every checkpoint, so chat can open it."""
    eval_data: Dataset | None = None
    """Held-out samples for validation (None: no validation)."""
    byte_lengths: torch.Tensor | None = None
    """[V] UTF-8 bytes per token id, for bits per byte."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Extra facts saved in each checkpoint's meta.json (dataset, model source, ...)."""
    state: TrainerState = field(default_factory=TrainerState)
    """The committed counters at the last step boundary."""

    # -- the latest step (written by the trainer only) -------------------------------------
    last_report: StepReport | None = None
    """The report of the latest committed step (what on_step_end received)."""
    last_loss: float | None = None
    """The loss of the latest logged step (the run summary's final_loss)."""
    last_eval: dict[str, float] = field(default_factory=dict)
    """The latest validation figures (val_loss, val_ppl, val_bpb)."""

    # -- the run's end ---------------------------------------------------------------------
    completed: bool = False
    """True once the run reached total_steps without a stop request."""
    stop_reason: str | None = None
    """Why training ends at this step boundary, with a checkpoint of it: the trainer sets
    it from a callback's StepControl.request_stop."""
    errors: list[str] = field(default_factory=list)
    """Warnings for the summary (skipped steps, failing on_error hooks)."""
    boundary_rng: dict[str, Any] | None = None
    """RNG states at the last step boundary (saved with the committed TrainerState)."""
    boundary_sampler: dict[str, Any] | None = None
    """Sampler position at the last step boundary."""

    @property
    def is_main(self) -> bool:
        return self.executor.is_main

    @property
    def world_size(self) -> int:
        return self.executor.world_size

    @property
    def done(self) -> bool:
        return self.state.step >= self.total_steps
