"""The optimizer's parameter groups: which tensors take weight decay, and which hidden
matrices Muon trains. Both optimizers (astrai.train.optim) and --dry-run read them."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

# Linear weights inside a decoder block's attention or FFN (experts included): the hidden
# matrices. The router maps to a handful of expert logits, an output layer, so it is not.
_HIDDEN = re.compile(r"(?:^|\.)layers\.\d+\.(?:attn|mlp)\.(?!router\.).*weight$")


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """Whether parameter `name` is trained by Muon: a 2-D weight of a block's attention or
    MLP (q/k/v/o, gate/up/down, experts). Anything 3-D or more would take AdamW."""
    return p.ndim == 2 and _HIDDEN.search(name) is not None


def decay_param_groups(model: nn.Module, weight_decay: float, *,
                       exclude: set[int] = frozenset()) -> list[dict[str, Any]]:
    """Two AdamW groups: weight decay on weight matrices (attention, MLP, experts, router,
    untied lm_head); none on norm gains, biases and token embeddings. Parameters whose id
    is in `exclude` (Muon's) are left out.

    Why not the embeddings: decay pulls rarely seen token rows to zero between their
    updates (nanoGPT, GPT-NeoX and OLMo exclude them too); a tied lm_head is the embedding.
    """
    decay, no_decay, seen = [], [], set(exclude)
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = name.endswith("embed_tokens.weight")
        (decay if p.ndim >= 2 and not is_embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "adamw"},
              {"params": no_decay, "weight_decay": 0.0, "name": "adamw-no-decay"}]
    return [g for g in groups if g["params"]]


def muon_param_groups(model: nn.Module, *, lr: float, muon_lr: float,
                      weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups first (decay on the remaining matrices, none on embeddings, norms and
    biases: decay_param_groups), then one Muon group of the hidden
    matrices at `muon_lr`. Each group is named for --dry-run. Muon's decay is the same
    decoupled `weight_decay` (Moonshot 2025 reuses AdamW's with match_rms_adamw)."""
    hidden = [p for n, p in model.named_parameters()
              if p.requires_grad and is_hidden_matrix(n, p)]
    skip = {id(p) for p in hidden}
    groups = decay_param_groups(model, weight_decay, exclude=skip)
    for g in groups:
        g.update(lr=lr, muon=False)
    if hidden:
        groups.append({"params": hidden, "lr": muon_lr, "weight_decay": weight_decay,
                       "muon": True, "name": "muon"})
    return groups
