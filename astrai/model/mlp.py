"""SwiGLU feed-forward: W_down(SiLU(W_gate x) * W_up x) (Shazeer, 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model.context import ForwardContext
from astrai.model.lora import project, project_many


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        # F.linear on the layers' weights: no nn.Module call per projection (block.py),
        # unless a layer carries a LoRA adapter (lora.py)
        gate, up = project_many(x, (self.gate_proj, self.up_proj), ctx)
        return project(F.silu(gate) * up, self.down_proj, ctx)
