"""Residual-scaled initialisation (GPT-2; docs/bf16-lockin.md).

W_o and W_down ~ N(0, std / sqrt(2L)) (zero with `zero_init_proj`, as modded-nanogpt);
every other linear and embedding weight ~ N(0, std); biases 0; norm gains 1.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from astrai.model.norm import RMSNorm
from astrai.model.transformer import Transformer

RESIDUAL_PROJECTIONS = ("o_proj", "down_proj")


def init_weights(model: Transformer, generator: torch.Generator | None = None) -> Transformer:
    std = model.config.init_std
    res_std = 0.0 if model.config.zero_init_proj else std / math.sqrt(2 * model.config.n_layers)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                s = res_std if name.rsplit(".", 1)[-1] in RESIDUAL_PROJECTIONS else std
                module.weight.normal_(0.0, s, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
    return model


def build_model(config, *, seed: int | None = None, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32) -> Transformer:
    """A freshly initialised model (deterministic given `seed`)."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    model = Transformer(config)
    init_weights(model, gen)
    return model.to(device=device, dtype=dtype)
