"""Per tensor, the share of entries whose next update rounds away: from a checkpoint's
weights and its optimizer state (optimizer.pt, which training writes with each tensor's
parameter name; docs/architecture.md "Checkpoint format").

AdamW entries take `visibility.adam_step`; the matrices of a Muon group take the step the
caller's `muon_step(momentum, group)` returns (the inspection room does not import the
trainer: the CLI passes astrai.train.muon's orthogonalisation in). Without a `muon_step`,
Muon tensors are left out and said so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from astrai.errors import CheckpointError
from astrai.inspect.source import WeightSource
from astrai.inspect.visibility import adam_step, lr_to_move, rounds_away
from astrai.model.dcp_format import is_dcp, read_optimizer

OPTIMIZER_FILE = "optimizer.pt"
MuonStep = Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]
"""muon_step(momentum buffer fp32, param group) -> the matrix step before weight decay."""


@dataclass
class TensorVisibility:
    """One tensor's next update against its ulp."""

    name: str
    optimizer: str
    """adamw | muon"""
    entries: int
    below: int
    """Entries whose next update is below half an ulp (the write would leave them)."""
    lr: float
    lr_to_move: float | None
    """The lr at which half the entries' updates would reach half an ulp."""
    peak_lr: float | None = None
    """The schedule's peak lr of the tensor's group (its `initial_lr`), when saved."""

    @property
    def fraction(self) -> float:
        return self.below / self.entries if self.entries else 0.0


@dataclass
class Visibility:
    """A checkpoint's next-update visibility (None fields: no optimizer state read)."""

    tensors: list[TensorVisibility]
    note: str | None = None
    """Why some or all tensors were left out."""

    @property
    def entries(self) -> int:
        return sum(t.entries for t in self.tensors)

    @property
    def below(self) -> int:
        return sum(t.below for t in self.tensors)

    @property
    def fraction(self) -> float:
        return self.below / self.entries if self.entries else 0.0


def read_optimizer_state(path: Path) -> dict[str, Any] | None:
    """optimizer.pt of a checkpoint directory (weights_only), or the same layout read from
    a DCP checkpoint's shards; None when it has none."""
    if path.is_dir() and not (path / OPTIMIZER_FILE).is_file() and is_dcp(path):
        return read_optimizer(path)
    f = path / OPTIMIZER_FILE if path.is_dir() else None
    if f is None or not f.is_file():
        return None
    try:
        state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{f}: unreadable optimizer state ({e})") from None
    return state if isinstance(state, dict) else None


def states_by_name(opt: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (per-parameter state, its param group) of optimizer state `opt`, through its
    `param_names` ({} when it has none)."""
    names = opt.get("param_names") or []
    out = {}
    for group in opt.get("param_groups", []):
        for idx in group.get("params", []):
            st = opt.get("state", {}).get(idx)
            if st is not None and idx < len(names):
                out[names[idx]] = (st, group)
    return out


def next_update_visibility(source: WeightSource, opt: dict[str, Any],
                           muon_step: MuonStep | None = None) -> Visibility:
    """Visibility of every optimizer-trained tensor of `source` that optimizer state `opt`
    names (its `param_names`)."""
    if not opt.get("param_names"):
        return Visibility([], f"{OPTIMIZER_FILE} holds no parameter names (written by an "
                              "older astrai): no next-update figures")
    out, skipped = [], set()
    for name, (st, group) in states_by_name(opt).items():
        if name not in source.tensors:
            continue
        tv = _tensor(source, name, st, group, muon_step)
        if tv is None:
            skipped.add(name)
        else:
            out.append(tv)
    note = (f"{len(skipped)} Muon matrices left out (no Muon step given)" if skipped else None)
    return Visibility(out, note)


def entry_update(w: torch.Tensor, st: dict[str, Any], group: dict[str, Any],
                 muon_step: MuonStep | None = None) -> tuple[torch.Tensor, str] | None:
    """(the next update of every entry of `w` (fp32, what w loses), adamw | muon) from its
    optimizer state; None for a Muon matrix without `muon_step` or an unknown state."""
    lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
    if "momentum_buffer" in st:
        if muon_step is None:
            return None
        step = muon_step(st["momentum_buffer"].float(), group)
        return step.add_(w.float(), alpha=lr * wd), "muon"
    if "exp_avg" in st:
        return adam_step(w, st["exp_avg"], st["exp_avg_sq"], float(st["step"]), lr=lr,
                         betas=tuple(group["betas"]), eps=float(group["eps"]),
                         weight_decay=wd), "adamw"
    return None


def _tensor(source: WeightSource, name: str, st: dict[str, Any], group: dict[str, Any],
            muon_step: MuonStep | None) -> TensorVisibility | None:
    info = source.tensors[name]
    w = source.read_rows(name, 0, info.rows).reshape(info.shape)
    found = entry_update(w, st, group, muon_step)
    if found is None:
        return None
    u, kind = found
    lr = float(group["lr"])
    below = int(rounds_away(w, u).sum())
    peak = group.get("initial_lr")
    return TensorVisibility(name, kind, w.numel(), below, lr, lr_to_move(w, u, lr),
                            float(peak) if isinstance(peak, (int, float)) else None)
