"""Shared helpers for the model room's tests: tiny fp32 configs and randomised models."""

from __future__ import annotations

import pytest
import torch

from astrai.model import ModelConfig, build_model


def small_config(**overrides) -> ModelConfig:
    base = {"vocab_size": 97, "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
            "ffn_dim": 48, "max_seq_len": 64}
    return ModelConfig(**{**base, **overrides})


def random_model(config: ModelConfig, seed: int = 0):
    """A model with non-trivial norm gains and biases, so no weight kind hides behind 1 or 0."""
    model = build_model(config, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture
def make_config():
    return small_config


@pytest.fixture
def make_model():
    return random_model
