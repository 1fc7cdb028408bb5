"""A step's loss, unit count and strategy metrics, summed on the device.

The trainer never reads a micro-batch's figures on the host (docs/train.md "Host reads"):
they are summed here as float64 tensors on the model's device, reduced over ranks with one
collective of one stacked tensor, and read with one transfer, only on logged steps. A step
that is not logged reads one boolean: the fused finite check of loss and gradient norm.

float64 keeps the sums exactly what the host sums of python floats were (a float32 figure
widens exactly; products and sums round once, as in python), so logged values do not
depend on where they were added up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

F64 = torch.float64


def as_count(units: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    """A loss-unit count (a tensor on any device, or a host int) as a float64 0-dim tensor
    on `device`, copied without waiting for the device."""
    if torch.is_tensor(units):
        return units.to(device=device, dtype=F64, non_blocking=True)
    return torch.full((), float(units), dtype=F64, device=device)


class StepSums:
    """Sums of one window on this rank: loss, loss units, unit-weighted metrics."""

    def __init__(self, units: Sequence[torch.Tensor | int], device: torch.device) -> None:
        self.units = [as_count(u, device) for u in units]
        self.total_units = torch.stack(self.units).sum()
        self.loss = torch.zeros((), dtype=F64, device=device)
        self.metrics: dict[str, torch.Tensor] = {}

    def add(self, index: int, loss: torch.Tensor,
            metrics: Mapping[str, torch.Tensor | float]) -> None:
        """Micro-batch `index`'s (window-normalised) loss and its per-unit metrics, tensors
        or python floats, weighted by its units."""
        self.loss = self.loss + loss.detach().to(F64)
        n = self.units[index]
        for k, v in metrics.items():
            term = v.detach().to(device=n.device, dtype=F64) * n if torch.is_tensor(v) \
                else n * float(v)
            self.metrics[k] = self.metrics[k] + term if k in self.metrics else term

    def reduce(self, executor) -> StepFigures:
        """The step's figures over all ranks: one all-reduce of the stacked sums."""
        keys = list(self.metrics)
        stack = torch.stack([self.loss, self.total_units, *(self.metrics[k] for k in keys)])
        stack = executor.all_reduce_tensor(stack)
        units = stack[1]
        return StepFigures(loss=stack[0] / executor.dp_size, units=units,
                           metrics=stack[2:] / units.clamp(min=1), keys=keys)


@dataclass(frozen=True)
class StepFigures:
    """The step's reduced figures, still on the device."""

    loss: torch.Tensor
    """Mean loss over the step's loss units (all ranks)."""
    units: torch.Tensor
    """Loss units of the step (all ranks)."""
    metrics: torch.Tensor
    """[len(keys)] unit-weighted means over the window and the ranks."""
    keys: list[str]

    def vector(self, grad_norm: torch.Tensor) -> torch.Tensor:
        """[loss, grad_norm, units, *metrics] as one float64 tensor (one read)."""
        g = grad_norm.detach().to(device=self.loss.device, dtype=F64)
        return torch.cat([torch.stack([self.loss, g, self.units]), self.metrics])

    def finite(self, grad_norm: torch.Tensor) -> bool:
        """The fused finite check: one host read of one boolean."""
        g = grad_norm.detach().to(device=self.loss.device, dtype=F64)
        return bool(torch.isfinite(torch.stack([self.loss, g])).all())


@dataclass(frozen=True)
class HostFigures:
    """A logged step's figures on the host."""

    loss: float
    grad_norm: float
    units: int
    metrics: dict[str, float]

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


def read_figures(figures: StepFigures, grad_norm: torch.Tensor) -> HostFigures:
    """Every figure of the step in one device-to-host transfer."""
    loss, g, units, *metrics = figures.vector(grad_norm).tolist()
    return HostFigures(loss=loss, grad_norm=g, units=round(units),
                       metrics=dict(zip(figures.keys, metrics)))
