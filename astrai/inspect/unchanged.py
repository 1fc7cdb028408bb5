"""How many entries an unbiased rounding leaves unchanged between checkpoints.

Under stochastic rounding an entry whose update u is under its grid step g (its ulp) moves
by one step with probability |u| / g and otherwise stays ("Revisiting BFloat16 Training",
Zamirai et al. 2020; Gupta et al. 2015). Over n steps of one sign it never moves with
probability prod(1 - |u_t| / g) <= exp(-sum |u_t| / g). An update that changes sign can
also walk the entry away and back, so the model counts up- and down-moves apart: each
checkpoint's optimizer state predicts the entry's next update (astrai.inspect.next_update);
half of the n steps between two checkpoints are taken at each end's update, its positive
part adding n/2 |u| / g to the mean of the down-moves, its negative part to the up-moves;
the counts are Poisson and the entry is unchanged when they are equal, the Skellam mass
at zero (exp(-n |u| / g) when both ends agree in sign). Entries are counted as
independent: the number left unchanged has mean sum(p) and binomial variance
sum(p (1 - p)). Round-to-nearest instead keeps every entry whose updates stay under half
a step, whatever n: far more than the model expects, which is the signal.

A Kahan run keeps what each write rounds away in `kahan_comp` (optimizer.pt): its entries
are compared as w + kahan_comp, the value the optimizer steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from astrai.inspect.next_update import MuonStep, entry_update, states_by_name
from astrai.inspect.source import WeightSource
from astrai.inspect.update_mode import KAHAN_KEY
from astrai.inspect.visibility import half_ulp

State = tuple[dict[str, Any], dict[str, Any]]
"""(a parameter's optimizer state, its param group)."""


def unchanged_probability(up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """P(N_up = N_down) for independent Poisson move counts with means `up` and `down`
    (the Skellam distribution at 0): exp(-(up + down)) I_0(2 sqrt(up down)), computed as
    exp(-(sqrt(up) - sqrt(down))^2) i0e(2 sqrt(up down)). With one direction only it is
    exp(-up): the entry never moved."""
    up, down = up.double(), down.double()
    x = 2 * (up * down).sqrt()
    return torch.exp(-(up.sqrt() - down.sqrt()) ** 2) * torch.special.i0e(x)


@dataclass
class TensorHistory:
    """One tensor across the checkpoints, with what their optimizer states say of it."""

    name: str
    sources: list[WeightSource]
    states: list[State | None]
    steps: list[int | None]
    compensated: bool
    muon_step: MuonStep | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype compared bit for bit (fp32 for w + kahan_comp)."""
        info = self.sources[0].tensors[self.name]
        return torch.float32 if self.compensated else info.torch_dtype

    def read(self, k: int, a: int, b: int) -> torch.Tensor:
        """Rows [a, b) of checkpoint k's compared value."""
        w = self.sources[k].read_rows(self.name, a, b)
        if not self.compensated:
            return w
        info = self.sources[k].tensors[self.name]
        c = self.states[k][0][KAHAN_KEY].reshape(info.rows, info.cols)
        return w.float() + c[a:b].float()

    def expectation(self) -> tuple[float | None, float]:
        """(expected unchanged entries, its variance); (None, 0) without the states and
        increasing steps the model needs."""
        if any(s is None for s in self.states) or not _increasing(self.steps):
            return None, 0.0
        info = self.sources[0].tensors[self.name]
        values, updates = [], []
        for k in range(len(self.sources)):
            x = self.read(k, 0, info.rows).reshape(info.shape)
            st, group = self.states[k]
            found = entry_update(x, st, group, self.muon_step)
            if found is None:
                return None, 0.0
            values.append(x)
            updates.append(found[0])
        up = torch.zeros(info.shape, dtype=torch.float64)
        down = torch.zeros(info.shape, dtype=torch.float64)
        for k in range(len(values) - 1):
            # moves one grid step up (down) at the rate the two ends' updates give
            scale = (self.steps[k + 1] - self.steps[k]) / 2 / (2 * half_ulp(values[k]).double())
            for u in (updates[k], updates[k + 1]):
                down += u.double().clamp(min=0) * scale  # u is what w loses
                up += (-u.double()).clamp(min=0) * scale
        p = unchanged_probability(up, down)
        return float(p.sum()), float((p * (1 - p)).sum())


def _increasing(steps: list[int | None]) -> bool:
    return all(isinstance(s, int) for s in steps) and all(
        b > a for a, b in zip(steps, steps[1:]))


def histories(sources: list[WeightSource], optimizers: list[dict[str, Any] | None] | None,
              muon_step: MuonStep | None = None
              ) -> Callable[[str], TensorHistory | None]:
    """name -> its TensorHistory, or None when no checkpoint's optimizer state names it."""
    if not optimizers or all(o is None for o in optimizers):
        return lambda name: None
    by_name = [states_by_name(o) if o is not None else {} for o in optimizers]
    steps = [s.meta.get("step") if isinstance(s.meta.get("step"), int) else None
             for s in sources]

    def get(name: str) -> TensorHistory | None:
        states = [b.get(name) for b in by_name]
        if all(s is None for s in states):
            return None
        info = sources[0].tensors[name]
        comp = all(s is not None and KAHAN_KEY in s[0] and
                   math.prod(s[0][KAHAN_KEY].shape) == info.numel for s in states)
        return TensorHistory(name, sources, states, steps, comp, muon_step)

    return get
