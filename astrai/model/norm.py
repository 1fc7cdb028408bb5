"""RMSNorm (Zhang & Sennrich, 2019), computed in fp32 as HF Llama does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model import fast_path


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) in fp32, cast back to x's dtype, then times the gain
    (HF LlamaRMSNorm). F.rms_norm is that formula as one op (on CPU the same products in
    the same order, bit for bit, forward and backward); fp32 input takes the gain in it.
    A few rows without gradient go to a CPU decode kernel, where `kernels` has one
    (fast_path.py)."""
    out = fast_path.rms_norm(x, weight, eps, kernels)
    if out is not None:
        return out
    if x.dtype is torch.float32 and weight.dtype is torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    """Holds the gain; the model calls `rms_norm` with it (no nn.Module call per norm)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
