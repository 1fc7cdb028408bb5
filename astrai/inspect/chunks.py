"""Scratch buffers reused across the chunks of one tensor, and streaming moments.

Allocating a fresh chunk-sized temporary for every operation costs more than the arithmetic
(each large allocation is mapped and page-faulted anew), so the passes over a tensor write into
a few buffers allocated once per tensor and reused for every chunk.
"""

from __future__ import annotations

import math

import torch

EXP_OFFSET = 1100
"""Offset that keeps frexp exponents of any float (fp64 included) non-negative as bin indices."""
EXP_BINS = 2200

_FIELDS = {  # (int view, exponent shift, exponent mask, bias) of each float layout
    torch.bfloat16: (torch.int16, 7, 0xFF, 127), torch.float16: (torch.int16, 10, 0x1F, 15),
    torch.float32: (torch.int32, 23, 0xFF, 127), torch.float64: (torch.int64, 52, 0x7FF, 1023),
}


class Scratch:
    """Chunk-sized buffers on one device (a float copy, a float temporary, a mask, ints),
    each allocated on first use."""

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.numel, self.dtype = numel, dtype
        self.device: torch.device | None = None  # taken from the first chunk seen
        self.fdtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        self._bufs: dict[str, torch.Tensor] = {}

    def _buf(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        if name not in self._bufs:  # allocated on first use, then reused for every chunk
            self._bufs[name] = torch.empty(self.numel, dtype=dtype, device=self.device)
        return self._bufs[name]

    @property
    def tmp(self) -> torch.Tensor:
        return self._buf("tmp", self.fdtype)

    @property
    def mask(self) -> torch.Tensor:
        return self._buf("mask", torch.bool)

    def as_float(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, cols) as fp32/fp64 — a copy into the buffer for bf16/fp16, x itself else."""
        self.device = self.device or x.device
        if self.fdtype == x.dtype:
            return x
        out = self._buf("xf", self.fdtype)[: x.numel()].view(x.shape)
        out.copy_(x)
        return out

    def like(self, buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return buf[: x.numel()].view(x.shape)

    def exponent_census(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(per-binade counts of normal entries, inf/nan count) from the exponent bits."""
        self.device = self.device or x.device
        ity, shift, mask, bias = _FIELDS[x.dtype]
        bits = x.contiguous().view(ity).reshape(-1)
        field = self._buf("bits", ity)[: bits.numel()]
        torch.bitwise_right_shift(bits, shift, out=field)
        torch.bitwise_and(field, mask, out=field)
        counts = torch.bincount(field, minlength=mask + 1).cpu()
        hist = torch.zeros(EXP_BINS, dtype=torch.int64)
        # fields 1..mask-1 are normal numbers of binade field - bias (0: zero or subnormal,
        # mask: inf or nan) — the layout bf16.exponent_histogram documents
        hist[1 - bias + EXP_OFFSET: mask - bias + EXP_OFFSET] = counts[1:mask]
        return hist, int(counts[mask])

    def count(self, op, x: torch.Tensor, value: float) -> int:
        """Entries where op(x, value) holds (torch.eq / gt / lt), without allocating."""
        m = self.like(self.mask, x)
        op(x, value, out=m)
        return int(torch.count_nonzero(m))


class Moments:
    """Streaming mean and M2 (Chan et al. merge): two-pass per chunk in the scratch buffer."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: torch.Tensor, scratch: Scratch | None = None) -> None:
        n = x.numel()
        if not n:
            return
        mu = float(x.sum()) / n  # cascade summation: accurate in fp32
        if math.isfinite(mu):
            d = (scratch.like(scratch.tmp, x) if scratch is not None and x.dim() == 2
                 and x.dtype == scratch.tmp.dtype else torch.empty_like(x))
            torch.sub(x, mu, out=d)
            corr = float(d.sum()) / n  # refines mu (the corrected two-pass algorithm)
            d.mul_(d)
            m2 = float(d.sum()) - n * corr * corr
            mu += corr
        if not (math.isfinite(mu) and math.isfinite(m2)):  # |x| ~ 1e19+ overflows fp32 sums
            xd = x.double()
            mu = float(xd.mean())
            m2 = float((xd - mu).square().sum())
        tot = self.n + n
        delta = mu - self.mean
        self.mean += delta * n / tot
        self.m2 += m2 + delta * delta * self.n * n / tot
        self.n = tot

    @property
    def std(self) -> float:
        return math.sqrt(max(self.m2, 0.0) / self.n) if self.n else math.nan
