"""Sizing a run to a wall-clock budget: measure one optimizer step, then divide.

A cosine schedule needs its total step count up front, and a run must be exactly resumable,
so the quickstart does not train "until the clock runs out". It times a few real
forward/backward/optimizer steps of the model it will train (same shape, threads and device),
then fixes `steps = seconds left / seconds per step`. On a loaded machine the run gets
fewer steps rather than a later finish. `--steps N` skips the measurement.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from astrai import threads
from astrai.model.config import ModelConfig


def measure_step_seconds(config: ModelConfig, batch_size: int, seq_len: int, *,
                         device: torch.device, timed: int = 3, seed: int = 0,
                         optimizer: str = "adamw") -> float:
    """Median seconds of one training step (forward, cross-entropy, backward, the trainer's
    `optimizer`, built as the trainer builds it) on random ids, after one untimed warm-up
    step. bf16 autocast on CUDA, as the trainer. Leaves the global RNG states as it found
    them (module construction draws from them)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return _measure(config, batch_size, seq_len, device, timed, seed, optimizer)


def _measure(config: ModelConfig, batch_size: int, seq_len: int, device: torch.device,
             timed: int, seed: int, optimizer: str) -> float:
    from astrai.config.train import TrainConfig
    from astrai.model.init import build_model
    from astrai.train.optim import build_optimizer

    model = build_model(config, seed=seed, device=device).train()
    opt = build_optimizer(model, TrainConfig(optimizer={"name": optimizer, "max_lr": 1e-6}))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=gen)
    ids = ids.to(device)
    x, y = ids[:, :-1], ids[:, 1:]  # (B, T)
    cuda = device.type == "cuda"
    times = []
    for i in range(timed + 1):
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(x).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        if i:  # the first step pays for allocations and lazy initialisation
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def fastest_threads(config: ModelConfig, batch_size: int, seq_len: int, *,
                    device: torch.device, seed: int = 0,
                    optimizer: str = "adamw") -> tuple[int, float]:
    """(intra-op threads, seconds per step) of the faster of one thread and the current
    count, measured on the run's own step (astrai.threads explains why one thread can win).
    The thread count is left as it was found."""
    def step() -> float:
        return measure_step_seconds(config, batch_size, seq_len, device=device, seed=seed,
                                    optimizer=optimizer)

    if device.type != "cpu":
        return torch.get_num_threads(), step()
    return threads.fastest_threads(step)


SHORT_FRACTION = 0.75
"""A sized run with fewer than this fraction of the recipe's steps is reported as cut."""


@dataclass(frozen=True)
class StepPlan:
    """How many steps the run gets, and why."""

    steps: int
    step_s: float | None
    """Measured seconds per step (None when --steps fixed the count)."""
    threads: int
    """Intra-op CPU threads the run uses."""
    train_budget_s: float | None
    """Seconds left for training when the steps were sized."""
    capped_by: str | None
    """'epochs' or 'minimum' when a bound, not the budget, decided."""
    full_steps: int | None = None
    """The recipe's own step count (its epoch cap): more than `steps` when the budget cut it."""

    @property
    def budget_cut(self) -> bool:
        """True when the time budget gave fewer steps than the recipe's full count."""
        return self.full_steps is not None and self.steps < self.full_steps

    @property
    def cut_short(self) -> bool:
        """True when the budget cut more than a quarter of the recipe's steps: worth telling
        the user (a smaller cut moves bits per byte by a few thousandths)."""
        return self.budget_cut and self.steps < SHORT_FRACTION * self.full_steps


def size_steps(train_budget_s: float, step_s: float, *, steps_per_epoch: int,
               max_epochs: float, min_steps: int = 10, threads: int = 1) -> StepPlan:
    """steps = floor(budget / step time), kept within [min_steps, max_epochs epochs]."""
    fit = math.floor(max(0.0, train_budget_s) / max(step_s, 1e-9))
    cap = max(min_steps, math.floor(max_epochs * steps_per_epoch))
    if fit > cap:
        return StepPlan(cap, step_s, threads, train_budget_s, "epochs", cap)
    if fit < min_steps:
        return StepPlan(min_steps, step_s, threads, train_budget_s, "minimum", cap)
    return StepPlan(fit, step_s, threads, train_budget_s, None, cap)


def eval_seconds(step_s: float, val_tokens: int, tokens_per_step: int) -> float:
    """Estimated validation time: a forward is about a third of a training step."""
    return step_s * val_tokens / max(1, tokens_per_step) / 3
