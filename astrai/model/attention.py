"""Grouped-query attention (Ainslie et al., 2023). Owns projections and RoPE, not the cache."""

from __future__ import annotations

import torch
from torch import nn

from astrai.model.config import ModelConfig
from astrai.model.context import SDPA, ForwardContext
from astrai.model.rope import apply_rope


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.kv_heads, config.hdim
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        self.q_proj = nn.Linear(config.dim, H * D, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.dim, K * D, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.dim, K * D, bias=config.qkv_bias)
        self.o_proj = nn.Linear(H * D, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: ForwardContext) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, K, D)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, K, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # before any KV write
        backend = ctx.backend or SDPA
        out = backend.attend(q, k, v, self.layer, ctx)  # (B, T, H, D)
        return self.o_proj(out.reshape(B, T, self.n_heads * self.head_dim))
