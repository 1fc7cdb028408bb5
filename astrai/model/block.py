"""Pre-norm decoder block: h = x + Attn(Norm(x)); out = h + FFN(Norm(h))."""

from __future__ import annotations

import torch
from torch import nn

from astrai.model.attention import Attention
from astrai.model.config import ModelConfig
from astrai.model.context import ForwardContext
from astrai.model.mlp import SwiGLU
from astrai.model.moe import MoE
from astrai.model.norm import RMSNorm, rms_norm


class DecoderBlock(nn.Module):
    """Attention and the FFN are called as modules (hooks, activation checkpointing and
    compilation target them); norms and linear layers as functions of their parameters:
    an nn.Module call per leaf layer is a measurable share of a small model's decode step
    on CPU."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(config.dim, config.norm_eps)
        self.is_moe = config.is_moe_layer(layer)
        self.mlp = MoE(config) if self.is_moe else SwiGLU(config.dim, config.ffn_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, C]; rope = `rope_factors` of the positions -> (out [B, T, C], MoE aux)."""
        n1, n2 = self.attn_norm, self.mlp_norm
        k = ctx.kernels
        h = x + self.attn(rms_norm(x, n1.weight, n1.eps, k), rope, ctx)
        if self.is_moe:
            ffn, aux = self.mlp(rms_norm(h, n2.weight, n2.eps, k), ctx)
            return h + ffn, aux
        return h + self.mlp(rms_norm(h, n2.weight, n2.eps, k), ctx), None
