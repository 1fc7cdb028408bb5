"""How a run wrote its low-precision weights: the fact that decides whether small updates are
lost (lock-in) or carried.

    fp32        no bf16/fp16 weight in the checkpoint (fp32 runs; bf16-mixed keeps fp32
                master weights): nothing rounds.
    nearest     bf16 weights written round-to-nearest: an update under half an ulp is lost,
                every step, for good (docs/bf16-lockin.md "Stage 3").
    stochastic  bf16 weights written with stochastic rounding: unbiased, E[round(x)] = x, so
                small updates move the weight on average ("Revisiting BFloat16 Training",
                Zamirai et al. 2020).
    kahan       bf16 weights with a Kahan compensation buffer (`kahan_comp` in optimizer.pt):
                what a write rounds away is kept and added back (Kahan 1965).

The mode is read from the checkpoint: a `kahan_comp` buffer in its optimizer state, else
meta.json's train config (`precision.mode`, `precision.bf16_update`, `auto` resolved as the
trainer does). bf16 weights with no such record are taken as nearest — what torch's own
optimizers do to bf16 parameters — and the report says it assumed so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

KAHAN_KEY = "kahan_comp"
"""astrai.train.bf16_update's compensation buffer name (the inspection room does not import
the trainer)."""
LOW_PRECISION = {"bfloat16", "float16", "BF16", "F16"}
UNBIASED = ("stochastic", "kahan")


@dataclass(frozen=True)
class UpdateMode:
    """The write mode of a checkpoint's weights and where that was read."""

    mode: str
    """fp32 | nearest | stochastic | kahan"""
    source: str
    """meta.json:train_config.precision | optimizer.pt:kahan_comp | weights (fp32) |
    assumed (no record)"""

    @property
    def loses_updates(self) -> bool:
        """Round-to-nearest bf16: updates under half an ulp are lost."""
        return self.mode == "nearest"

    @property
    def assumed(self) -> bool:
        return self.source.startswith("assumed")


def detect_mode(dtypes: list[str], meta: dict[str, Any],
                optimizer: dict[str, Any] | None) -> UpdateMode:
    """The UpdateMode of a checkpoint from its weights' dtypes, meta.json and optimizer.pt."""
    if not any(d in LOW_PRECISION or d.removeprefix("torch.") in LOW_PRECISION
               for d in dtypes):
        return UpdateMode("fp32", "weights (no bf16/fp16 tensor)")
    if optimizer is not None and any(KAHAN_KEY in st for st in
                                     optimizer.get("state", {}).values()
                                     if isinstance(st, dict)):
        return UpdateMode("kahan", f"optimizer.pt:{KAHAN_KEY}")
    prec = _precision_section(meta)
    if prec is not None:
        update = prec.get("bf16_update", "nearest")  # saved before --bf16-update: nearest
        if update == "auto":
            update = "stochastic" if prec.get("mode") == "bf16-true" else "nearest"
        if update in ("nearest", "stochastic", "kahan"):
            return UpdateMode(update, "meta.json:train_config.precision")
    return UpdateMode("nearest", "assumed (bf16 weights, no record of the update mode)")


def _precision_section(meta: dict[str, Any]) -> dict[str, Any] | None:
    """meta.json's train config precision section (nested `precision: {mode, bf16_update}`)."""
    cfg = meta.get("train_config", meta)
    prec = cfg.get("precision") if isinstance(cfg, dict) else None
    return prec if isinstance(prec, dict) else None


def compensated(w: torch.Tensor, state: dict[str, Any] | None) -> torch.Tensor:
    """The value a Kahan run's optimizer works on: w + kahan_comp in fp32 (w itself, in its
    dtype, when the state holds no compensation)."""
    c = state.get(KAHAN_KEY) if state else None
    if c is None or tuple(c.shape) != tuple(w.shape):
        return w
    return w.float() + c.float()
