"""Grouped-query attention (Ainslie et al., 2023). Owns projections and RoPE, not the cache."""

from __future__ import annotations

import torch
from torch import nn

from astrai.model.config import ModelConfig
from astrai.model.context import SDPA, ForwardContext
from astrai.model.lora import project, project_many
from astrai.model.norm import RMSNorm, rms_norm
from astrai.model.rope import rotate


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
        # QK-norm (Qwen3; Dehghani et al. 2023): per-head RMSNorm of q and k before RoPE
        self.q_norm = RMSNorm(D, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(D, config.norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                ctx: ForwardContext) -> torch.Tensor:
        """x [B, T, C]; rope = `rope_factors` of the tokens' positions -> [B, T, C]."""
        B, T, _ = x.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        # F.linear on the layers' parameters: no nn.Module call per projection (block.py),
        # unless a layer carries a LoRA adapter (lora.py); a decode kernel takes the three
        # in one call (fast_path.py)
        q, k, v = project_many(x, (self.q_proj, self.k_proj, self.v_proj), ctx)
        q = q.view(B, T, H, D)  # (B, T, H, D)
        k = k.view(B, T, K, D)  # (B, T, K, D)
        v = v.view(B, T, K, D)  # (B, T, K, D)
        if self.q_norm is not None:  # over D, per head, as HF Qwen3
            q = rms_norm(q, self.q_norm.weight, self.q_norm.eps, ctx.kernels)
            k = rms_norm(k, self.k_norm.weight, self.k_norm.eps, ctx.kernels)
        # q and k rotated in one pass, before any KV write
        q, k = rotate(torch.cat((q, k), dim=2), *rope).split_with_sizes((H, K), dim=2)
        backend = ctx.backend or SDPA
        out = backend.attend(q, k, v, self.layer, ctx)  # (B, T, H, D)
        return project(out.reshape(B, T, H * D), self.o_proj, ctx)  # (B, T, C)
