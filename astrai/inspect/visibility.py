"""Will the next update move the stored weight? Pure functions on tensors.

A weight stored in bf16 changes only when its update is at least half a unit in the last
place (ULP) of its value: anything smaller rounds away under round-to-nearest
(docs/bf16-lockin.md, "Stage 3"). These functions decide that per entry, exactly, by doing
the write: `(w - u).to(w.dtype) == w`. The same test holds for fp32 weights (whose ulp is
65,536 times finer), so nothing here is bf16-only.

The update of an entry is AdamW's from its moments (`adam_step`) or, for the matrices a
Muon run trains, the orthogonalised step the caller computes (astrai.train.muon); either
way the weight-decay term `lr * wd * w` is part of it.
"""

from __future__ import annotations

import math

import torch


def rounds_away(w: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """Bool mask: entries of `w` that writing `w - update` (rounded to nearest, in w's
    dtype) leaves unchanged."""
    return (w.float() - update.float()).to(w.dtype) == w


def half_ulp(w: torch.Tensor) -> torch.Tensor:
    """Half the gap to the next representable value above |w| in w's dtype (fp32 result).
    |w| = m * 2^e with m in [0.5, 1) (frexp); the ulp is 2^(e - p) for p mantissa bits
    counting the implicit one (bf16: 8, fp16: 11, fp32: 24)."""
    bits = {torch.bfloat16: 8, torch.float16: 11}.get(w.dtype, 24)
    _, e = torch.frexp(w.float())
    tiny = torch.finfo(w.dtype).tiny
    return torch.ldexp(torch.full_like(w, 0.5, dtype=torch.float32), e - bits).clamp_min(tiny)


def adam_denom(v: torch.Tensor, t: float, beta2: float, eps: float) -> torch.Tensor:
    """sqrt(v) / sqrt(1 - b2^t) + eps: the denominator of AdamW's step at step t, in fp32.
    astrai.train.adamw's optimizer takes it from here, so the write and its prediction
    share one formula."""
    return (v.float().sqrt() / math.sqrt(1 - beta2**t)).add_(eps)


def adam_step_size(lr: float, beta1: float, t: float) -> float:
    """lr / (1 - b1^t): the bias-corrected step size multiplying m / denom."""
    return lr / (1 - beta1**t)


def adam_step(w: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: float, *,
              lr: float, betas: tuple[float, float], eps: float, weight_decay: float
              ) -> torch.Tensor:
    """AdamW's next update of `w` (what `w` loses, fp32) from the moments as saved after
    `step` steps (astrai.train.adamw's formula). The next gradient is unknown, so the
    moments are taken as they are, with step + 1's bias corrections: the update a gradient
    equal to the running average would give."""
    b1, b2 = betas
    t = step + 1
    u = exp_avg.float() / adam_denom(exp_avg_sq, t, b2, eps) * adam_step_size(lr, b1, t)
    return u.add_(w.float(), alpha=lr * weight_decay)


def lr_to_move(w: torch.Tensor, update: torch.Tensor, lr: float,
               quantile: float = 0.5) -> float | None:
    """The learning rate at which `quantile` of the entries' updates reach half an ulp, for
    an update proportional to lr (AdamW's, Muon's): lr * quantile of half_ulp / |update|.
    None when no entry has a nonzero update."""
    u = update.float().abs().reshape(-1)
    keep = u > 0
    if not bool(keep.any()):
        return None
    ratio = half_ulp(w).reshape(-1)[keep] / u[keep]
    return lr * float(torch.quantile(ratio[: 1 << 24], quantile))
