"""Learning-rate schedules: cosine, SGDR and warmup-stable-decay.

Each schedule is a pure function `rate(step) -> multiplier of max_lr`, where `step` is the
0-based index of the optimizer step about to be taken; the scheduler object only counts steps
and writes `max_lr * rate(step)` into the optimizer's param groups.

Warmup is linear and never uses a zero rate: step s < W gets (s + 1) / W, so the first
update already learns (a step at lr 0 would waste its batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from astrai.train.registry import Registry, reject_unknown

RateFn = Callable[[int], float]


def warmup_rate(step: int, warmup: int) -> float:
    return (step + 1) / warmup


def cosine_rate(step: int, *, warmup: int, total: int, min_rate: float) -> float:
    """Linear warmup, then cosine from 1 to min_rate over the remaining steps."""
    if step < warmup:
        return warmup_rate(step, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_rate + (1 - min_rate) * 0.5 * (1 + math.cos(math.pi * progress))


def sgdr_rate(step: int, *, warmup: int, cycle: int, min_rate: float, t_mult: int = 2) -> float:
    """SGDR (Loshchilov & Hutter 2017): cosine cycles restarting at 1, cycle i lasting
    cycle * t_mult**i steps."""
    if step < warmup:
        return warmup_rate(step, warmup)
    t, length = step - warmup, cycle
    while t >= length:  # at most log2(total) iterations
        t -= length
        length *= t_mult
    return min_rate + (1 - min_rate) * 0.5 * (1 + math.cos(math.pi * t / length))


def wsd_rate(step: int, *, warmup: int, total: int, decay: int, min_rate: float) -> float:
    """Warmup-Stable-Decay (Hu et al. 2024, MiniCPM): rate 1 until the last `decay` steps,
    then a quadratic fall (1 - p)^2 from 1 to min_rate."""
    if step < warmup:
        return warmup_rate(step, warmup)
    start = total - decay
    if step < start:
        return 1.0
    p = min(1.0, (step - start) / max(1, decay))
    return min_rate + (1 - min_rate) * (1 - p) ** 2


class LRScheduler:
    """Sets each param group's lr to max_lr * rate(step). State is one integer."""

    name = "base"

    def __init__(self, optimizer: torch.optim.Optimizer, rate: RateFn) -> None:
        self.optimizer, self.rate, self.step_count = optimizer, rate, 0
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self._apply()

    def _apply(self) -> None:
        r = self.rate(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * r

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self._apply()


def _rates(total: int, warmup: int, min_rate: float) -> tuple[int, int, float]:
    return max(1, total), max(0, min(warmup, total)), min_rate


class CosineScheduler(LRScheduler):
    name = "cosine"

    def __init__(self, optimizer, *, total_steps: int, warmup_steps: int, min_rate: float,
                 **options: object) -> None:
        reject_unknown("schedule", self.name, options)
        total, warmup, m = _rates(total_steps, warmup_steps, min_rate)
        super().__init__(optimizer, lambda s: cosine_rate(s, warmup=warmup, total=total, min_rate=m))


class SGDRScheduler(LRScheduler):
    name = "sgdr"

    def __init__(self, optimizer, *, total_steps: int, warmup_steps: int, min_rate: float,
                 cycle_steps: int | None = None, t_mult: int = 2, **options: object) -> None:
        reject_unknown("schedule", self.name, options)
        total, warmup, m = _rates(total_steps, warmup_steps, min_rate)
        # Default: three cycles (1 + 2 + 4 = 7 units) fill the run after warmup.
        cycle = cycle_steps or max(1, (total - warmup) // (1 + t_mult + t_mult**2))
        super().__init__(
            optimizer, lambda s: sgdr_rate(s, warmup=warmup, cycle=cycle, min_rate=m, t_mult=t_mult)
        )


class WSDScheduler(LRScheduler):
    name = "wsd"

    def __init__(self, optimizer, *, total_steps: int, warmup_steps: int, min_rate: float,
                 decay_ratio: float = 0.2, **options: object) -> None:
        reject_unknown("schedule", self.name, options)
        total, warmup, m = _rates(total_steps, warmup_steps, min_rate)
        decay = max(1, min(total - warmup, round(decay_ratio * total)))
        super().__init__(
            optimizer, lambda s: wsd_rate(s, warmup=warmup, total=total, decay=decay, min_rate=m)
        )


SCHEDULERS: Registry[LRScheduler] = Registry("schedule", {
    "cosine": CosineScheduler, "sgdr": SGDRScheduler, "wsd": WSDScheduler,
})

