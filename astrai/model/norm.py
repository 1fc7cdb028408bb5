"""RMSNorm (Zhang & Sennrich, 2019), computed in fp32 as HF Llama does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / sqrt(mean(x^2) + eps) in fp32, cast back, then the gain (HF LlamaRMSNorm).
        # F.rms_norm is that formula as one op (on CPU the same products in the same
        # order, bit for bit, forward and backward); fp32 input takes the gain in it too.
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
