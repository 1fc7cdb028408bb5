"""BF16 arithmetic behind lock-in (docs/bf16-lockin.md, "Stage 3: BF16 dead zone").

BF16 keeps 8 significand bits (7 stored), so the spacing of representable values (ULP) at
a magnitude |w| in [2^e, 2^(e+1)) is 2^(e-7): 2^-7 = 0.0078125 at w = 1.0. With
round-to-nearest, an update smaller than half that spacing rounds back to w — the weight
cannot move. These are pure functions, tested against BF16 arithmetic and the paper's figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# The exponent-histogram layout is defined beside the census that fills it.
from astrai.inspect.chunks import EXP_BINS, EXP_OFFSET, Scratch  # noqa: F401 - re-exported

BF16_MANTISSA_BITS = 7
"""Stored significand bits of bfloat16."""
BF16_MIN_NORMAL_EXP = -126
"""Exponent of the smallest normal bfloat16 (same range as fp32)."""
BF16_SUBNORMAL_ULP_EXP = BF16_MIN_NORMAL_EXP - BF16_MANTISSA_BITS
"""Spacing below the smallest normal is the fixed subnormal step 2^-133."""

_MANTISSA_BITS = {
    torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52,
}
_MIN_NORMAL_EXP = {
    torch.bfloat16: -126, torch.float16: -14, torch.float32: -126, torch.float64: -1022,
}


def ulp_exponent(binade: int | torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    """log2 of the ULP for values whose floor(log2|w|) is `binade` (subnormals included)."""
    bits, emin = _MANTISSA_BITS[dtype], _MIN_NORMAL_EXP[dtype]
    if isinstance(binade, torch.Tensor):
        return torch.clamp(binade, min=emin) - bits
    return max(binade, emin) - bits


def ulp(w: float | torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    """Spacing of `dtype` values at magnitude |w| (2^-7 at 1.0 for bf16); nan for inf/nan.

    Zero gets the subnormal step: any update moves a zero weight."""
    if isinstance(w, torch.Tensor):
        x = w.detach().to(torch.float64).abs()
        _, e = torch.frexp(x)  # x = m * 2^e, m in [0.5, 1) -> floor(log2 x) = e - 1
        binade = torch.where(x > 0, e - 1, torch.full_like(e, _MIN_NORMAL_EXP[dtype]))
        out = torch.exp2(ulp_exponent(binade, dtype).to(torch.float64))
        return torch.where(torch.isfinite(x), out, torch.full_like(out, math.nan))
    x = abs(float(w))
    if not math.isfinite(x):
        return math.nan
    binade = math.frexp(x)[1] - 1 if x > 0 else _MIN_NORMAL_EXP[dtype]
    return 2.0 ** ulp_exponent(binade, dtype)


def dead_zone_mask(w: torch.Tensor, lr: float) -> torch.Tensor:
    """True where an update of size `lr` is under half a BF16 ULP at |w| (the weight stays)."""
    return lr < 0.5 * ulp(w)


def dead_zone_min_binade(lr: float) -> int:
    """The lowest binade e (|w| in [2^e, 2^(e+1))) whose weights an update of size `lr`
    cannot move in BF16: the smallest e with lr < 2^(e - 7) / 2."""
    if lr <= 0:
        raise ValueError(f"learning rate must be positive, got {lr}")
    # lr < 2^(e-8)  <=>  e > log2(lr) + 8
    e = math.floor(math.log2(lr)) + BF16_MANTISSA_BITS + 1
    while 2.0 ** ulp_exponent(e) / 2 <= lr:
        e += 1
    while e > -160 and 2.0 ** ulp_exponent(e - 1) / 2 > lr:  # below: subnormals, all dead
        e -= 1
    return e


def dead_zone_threshold(lr: float) -> float:
    """|w| at and above which a step of `lr` rounds away in BF16 (2^dead_zone_min_binade)."""
    return 2.0 ** dead_zone_min_binade(lr)


def exponent_histogram(x: torch.Tensor) -> torch.Tensor:
    """Counts of normal finite entries per binade: bin EXP_OFFSET + floor(log2|x|).

    Read straight from the exponent bits (no float conversion), so one cheap pass per tensor
    gives the dead-zone fraction for any learning rate. Zeros and subnormals are left out:
    no learning rate above 2^-134 is under half their spacing."""
    x = x.detach().reshape(-1)
    return Scratch(x.numel(), x.dtype).exponent_census(x)[0]


def dead_zone_count(hist: torch.Tensor, lr: float) -> int:
    """Entries of an exponent histogram that an update of size `lr` cannot move in BF16."""
    first = dead_zone_min_binade(lr) + EXP_OFFSET
    first = min(max(first, 0), hist.numel())
    return int(hist[first:].sum())


def update_to_ulp_ratio(update: float, w: float = 1.0) -> float:
    """How many times smaller an update is than the BF16 ULP at w (paper: >= 1000 at 1.0)."""
    return ulp(w) / abs(update)


@dataclass(frozen=True)
class ClippedSpike:
    """What global L2 clipping does to one huge gradient entry among many ordinary ones."""

    total_norm: float
    """The global gradient L2 norm before clipping."""
    scale: float
    """The clip factor max_norm / total_norm (1.0 when no clipping happens)."""
    spike_after: float
    """The spike's magnitude after clipping."""
    background_after: float
    """Each ordinary entry's magnitude after clipping."""


def clipped_spike(spike: float, n_params: float, background: float = 1.0,
                  max_norm: float = 1.0) -> ClippedSpike:
    """Global L2 clipping of one spike among n_params - 1 entries of size `background`.

    The paper's example (§Stage 3): spike 1e4, 1.2e9 parameters of unit gradient give
    ||g|| = sqrt(1e8 + 1.2e9) ~ 36056; after clipping the spike is still ~0.28 while every
    other entry is ~2.8e-5 — clipping keeps the outlier and silences the rest."""
    total = math.sqrt(spike**2 + (n_params - 1) * background**2)
    scale = min(1.0, max_norm / total)
    return ClippedSpike(total, scale, spike * scale, background * scale)
