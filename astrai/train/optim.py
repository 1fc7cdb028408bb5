"""AdamW with weight decay on matrices only."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def decay_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: weight decay on weight matrices (attention, MLP, experts, router,
    untied lm_head); none on norm gains, biases and token embeddings.

    Why not the embeddings: decay pulls rarely seen token rows to zero between their
    updates (nanoGPT, GPT-NeoX and OLMo exclude them too); a tied lm_head is the embedding.
    """
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = name.endswith("embed_tokens.weight")
        (decay if p.ndim >= 2 and not is_embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_adamw(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                eps: float, state_dtype: torch.dtype = torch.float32) -> torch.optim.Optimizer:
    """AdamW over decay_param_groups; moments in `state_dtype`. torch's AdamW keeps moments
    in the weights' dtype, so when they differ (bf16-true weights with fp32 moments, the
    paper's advice) astrai.train.adamw.AdamW is used instead."""
    groups = decay_param_groups(model, weight_decay)
    if any(p.dtype != state_dtype for g in groups for p in g["params"]):
        from astrai.train.adamw import AdamW

        return AdamW(groups, lr=lr, betas=betas, eps=eps, state_dtype=state_dtype)
    # The fused kernel is one elementwise pass per tensor (5x faster than foreach on CPU:
    # 7 ms vs 32 ms a step for `tiny`, 40 vs 250 ms for `small`), with no reductions, so
    # runs stay bit-reproducible; FSDP2's sharded (DTensor) parameters support it too.
    params = [p for g in groups for p in g["params"]]
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)

