"""The run's optimizer: AdamW with weight decay on matrices only, or Muon + AdamW
(astrai.train.muon), over the groups of astrai.train.param_groups."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from astrai.train.adamw import AdamW
from astrai.train.muon import MuonAdamW
from astrai.train.param_groups import decay_param_groups, muon_param_groups


def build_adamw(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                eps: float, state_dtype: torch.dtype = torch.float32,
                bf16_update: str = "nearest", rounding_seed: int = 0) -> torch.optim.Optimizer:
    """AdamW over decay_param_groups; moments in `state_dtype`. torch's AdamW keeps moments
    in the weights' dtype and rounds bf16 weights to nearest, so when they differ (bf16-true
    weights with fp32 moments, the paper's advice) or another write of bf16 weights is asked
    for (astrai.train.bf16_update) astrai.train.adamw.AdamW is used instead. LoRA adapters
    are fp32 over any base, so they keep torch's fused AdamW in every --bf16-update mode."""
    groups = decay_param_groups(model, weight_decay)
    params = [p for g in groups for p in g["params"]]
    rounds = bf16_update != "nearest" and any(p.dtype == torch.bfloat16 for p in params)
    if rounds or any(p.dtype != state_dtype for p in params):
        return AdamW(groups, lr=lr, betas=betas, eps=eps, state_dtype=state_dtype,
                     bf16_update=bf16_update, rounding_seed=rounding_seed)
    # The fused kernel is one elementwise pass per tensor (faster than foreach on CPU; figures
    # in docs/train.md "Measured"), with no reductions, so runs stay bit-reproducible;
    # FSDP2's sharded (DTensor) parameters support it too.
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def build_optimizer(model: nn.Module, config: Any, state_dtype: torch.dtype = torch.float32,
                    *, rounding_seed: int = 0) -> torch.optim.Optimizer:
    """The optimizer `config` (a TrainConfig) asks for, over `model`'s trainable
    parameters: AdamW (build_adamw), or Muon on the hidden matrices + AdamW on the rest;
    bf16 weights written as config.precision.update_mode says, stochastic rounding seeded
    by `rounding_seed` (astrai.train.bf16_update.rounding_seed)."""
    o = config.optimizer
    betas = (o.adam_beta1, o.adam_beta2)
    update = config.precision.update_mode
    if o.name == "adamw":
        return build_adamw(model, lr=o.max_lr, weight_decay=o.weight_decay,
                           betas=betas, eps=o.adam_eps, state_dtype=state_dtype,
                           bf16_update=update, rounding_seed=rounding_seed)
    groups = muon_param_groups(model, lr=o.max_lr, muon_lr=o.muon_lr_value,
                               weight_decay=o.weight_decay)
    return MuonAdamW(groups, lr=o.max_lr, weight_decay=o.weight_decay, betas=betas,
                     eps=o.adam_eps, momentum=o.muon_momentum,
                     adjust_lr=o.muon_adjust_lr, state_dtype=state_dtype,
                     bf16_update=update, rounding_seed=rounding_seed)


def describe_groups(optimizer_or_groups: Any) -> list[dict[str, Any]]:
    """One row per param group for --dry-run: name, optimizer, tensors, parameters, peak
    lr, weight decay (and Muon's lr scale)."""
    groups = getattr(optimizer_or_groups, "param_groups", optimizer_or_groups)
    rows = []
    for g in groups:
        row = {"name": g.get("name", "adamw"), "optimizer": "muon" if g.get("muon") else "adamw",
               "tensors": len(g["params"]), "params": sum(p.numel() for p in g["params"]),
               "lr": g.get("initial_lr", g.get("lr")), "weight_decay": g["weight_decay"]}
        if g.get("muon"):
            row["adjust_lr"] = g.get("adjust_lr")
        rows.append(row)
    return rows


def planned_groups(model_config: Any, config: Any, prepare_model: Any) -> list[dict[str, Any]]:
    """describe_groups of the optimizer the run will build, over the model it will train
    built on the meta device (no weights allocated): what --dry-run shows."""
    from astrai.model.transformer import Transformer

    with torch.device("meta"):
        model = prepare_model(Transformer(model_config), config)
    return describe_groups(build_optimizer(model, config))
