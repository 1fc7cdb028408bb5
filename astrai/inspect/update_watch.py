"""Which share of the stored low-precision weights one optimizer step actually changed.

Before the step, a fixed sample of entries of every bf16/fp16 parameter is copied (at most
`per_tensor` entries each, the same positions every time, drawn once from a seeded
generator); after it, the sample is compared with the new values. The share that changed,
per optimizer parameter group, is the visible-update fraction: under round-to-nearest an
update below half an ulp leaves the entry as it was (docs/bf16-lockin.md). A sample of n
entries estimates a fraction p with standard error sqrt(p (1 - p) / n): with 4,096 per
tensor, under 0.8% for one tensor and less for a group.

The copies and comparisons stay on the device; `fractions` reads one small tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from astrai.inspect.visibility import adam_step, lr_to_move, rounds_away

LOW_PRECISION = (torch.bfloat16, torch.float16)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2); the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


@dataclass
class UpdateWatch:
    """Samples taken before a step, compared after it."""

    per_tensor: int = 4096
    seed: int = 0
    _index: dict[int, torch.Tensor] = field(default_factory=dict)
    _before: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list)

    def take(self, optimizer: Any) -> None:
        """Copy the sample of every low-precision parameter of `optimizer`'s groups."""
        self._before = []
        for i, group in enumerate(getattr(optimizer, "param_groups", [])):
            name = str(group.get("name", f"group_{i}"))
            for p in group["params"]:
                flat = _local(p.detach()).reshape(-1)
                if flat.dtype in LOW_PRECISION and flat.numel():
                    idx = self._positions(p, flat)
                    self._before.append((name, p, idx, flat[idx].clone()))

    def fractions(self) -> dict[str, float]:
        """Per group, the sampled share of entries the step changed ({} without a sample)."""
        if not self._before:
            return {}
        names = list(dict.fromkeys(n for n, *_ in self._before))
        sums = torch.zeros(len(names), 2, dtype=torch.float64,
                           device=self._before[0][3].device)
        for name, p, idx, old in self._before:
            changed = (_local(p.detach()).reshape(-1)[idx] != old).sum()
            row = sums[names.index(name)]
            row[0] += changed
            row[1] += idx.numel()
        self._before = []
        host = sums.cpu().tolist()  # the one host read
        return {n: c / t for n, (c, t) in zip(names, host) if t}

    def _positions(self, p: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        idx = self._index.get(id(p))
        if idx is None or idx.numel() > flat.numel():
            n = flat.numel()
            if n <= self.per_tensor:
                idx = torch.arange(n, device=flat.device)
            else:
                g = torch.Generator().manual_seed(self.seed + len(self._index))
                idx = torch.randperm(n, generator=g)[: self.per_tensor].to(flat.device)
            self._index[id(p)] = idx
        return idx


def group_updates(optimizer: Any, group_name: str, per_tensor: int = 4096
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For an AdamW group, (a sample of its low-precision weights, their next updates per
    unit of lr) from the moments (astrai.inspect.visibility); None for other groups, groups
    without low-precision weights, or without state."""
    for i, group in enumerate(getattr(optimizer, "param_groups", [])):
        if str(group.get("name", f"group_{i}")) != group_name or "betas" not in group:
            continue
        ws, us = [], []
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            if "exp_avg" not in st or "momentum_buffer" in st or p.dtype not in LOW_PRECISION:
                continue
            w = _local(p.detach()).reshape(-1)[:per_tensor]
            m = _local(st["exp_avg"]).reshape(-1)[:per_tensor]
            v = _local(st["exp_avg_sq"]).reshape(-1)[:per_tensor]
            ws.append(w)
            us.append(adam_step(w, m, v, float(st["step"]), lr=1.0, betas=group["betas"],
                                eps=group["eps"], weight_decay=group["weight_decay"]))
        if ws:
            return torch.cat(ws), torch.cat(us)
    return None


def lr_for_visible(optimizer: Any, group_name: str, per_tensor: int = 4096) -> float | None:
    """For an AdamW group, the lr at which half of a sample of its low-precision entries'
    next updates reach half an ulp; None for other groups or without state."""
    found = group_updates(optimizer, group_name, per_tensor)
    # the update per unit of lr, so lr_to_move at lr 1 is the lr itself
    return lr_to_move(*found, 1.0) if found is not None else None


def rounds_away_share(optimizer: Any, group_name: str, lr: float,
                      per_tensor: int = 4096) -> float | None:
    """For an AdamW group, the share of a sample of its low-precision entries whose next
    update at learning rate `lr`, written to nearest, leaves them unchanged."""
    found = group_updates(optimizer, group_name, per_tensor)
    if found is None:
        return None
    w, u = found
    return float(rounds_away(w, u * lr).float().mean())


def peak_lr(optimizer: Any, group_name: str) -> tuple[float | None, float | None]:
    """(the schedule's peak lr, the current lr) of a group: its `initial_lr` (which the
    schedule scales, astrai.train.schedule) and `lr`."""
    for i, group in enumerate(getattr(optimizer, "param_groups", [])):
        if str(group.get("name", f"group_{i}")) == group_name:
            lr = group.get("lr")
            return group.get("initial_lr", lr), lr
    return None, None
