"""Mixture-of-experts FFN: top-k softmax routing over SwiGLU experts, optional shared experts.

Load balancing (Switch Transformer, Fedus et al. 2021, generalised to top-k):
    L_aux = E * sum_i f_i * P_i
where f_i is the fraction of the N*k routing slots assigned to expert i (not differentiable)
and P_i the mean router probability of expert i over the N tokens (differentiable).
Uniform routing gives L_aux = 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model.config import ModelConfig
from astrai.model.context import ForwardContext
from astrai.model.mlp import SwiGLU


def load_balancing_loss(probs: torch.Tensor, topk_idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """probs [N, E] router softmax, topk_idx [N, k] chosen experts -> scalar aux loss."""
    N, k = topk_idx.shape
    counts = torch.zeros(n_experts, device=probs.device, dtype=probs.dtype)
    counts.scatter_add_(0, topk_idx.reshape(-1), torch.ones(N * k, device=probs.device, dtype=probs.dtype))
    f = counts / (N * k)  # (E,)
    P = probs.mean(dim=0)  # (E,)
    return n_experts * torch.sum(f * P)


class MoE(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = config.n_experts, config.moe_top_k
        self.router = nn.Linear(config.dim, config.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(config.dim, config.ffn_dim) for _ in range(config.n_experts))
        self.shared = nn.ModuleList(SwiGLU(config.dim, config.ffn_dim) for _ in range(config.n_shared_experts))

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        probs = F.softmax(self.router(flat).float(), dim=-1)  # (N, E)
        weights, idx = probs.topk(self.top_k, dim=-1)  # (N, k)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(idx == e, as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(flat[token], ctx) * weights[token, slot, None])
        for expert in self.shared:
            out = out + expert(flat, ctx)
        aux = load_balancing_loss(probs, idx, self.n_experts)
        return out.view(B, T, C), aux
