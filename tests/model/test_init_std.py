"""Residual-scaled init: W_o, W_down ~ N(0, 0.02/sqrt(2L)); other weights N(0, 0.02)."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.model import ModelConfig, build_model


@pytest.mark.parametrize("init_std", [0.02, 0.01])
def test_std_per_weight_kind(init_std):
    L = 8
    c = ModelConfig(vocab_size=1024, dim=256, n_layers=L, n_heads=4, n_kv_heads=2, ffn_dim=512,
                    qkv_bias=True, init_std=init_std)
    model = build_model(c, seed=0)
    residual = init_std / math.sqrt(2 * L)
    kinds = set()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
            kinds.add("norm")
        elif name.endswith(".bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
            kinds.add("bias")
        else:
            want = residual if name.endswith(("o_proj.weight", "down_proj.weight")) else init_std
            # tensors have >= 65k entries: the sample std is within ~1% of the true one
            assert p.std().item() == pytest.approx(want, rel=0.03), name
            assert abs(p.mean().item()) < 0.05 * want, name
            kinds.add("residual" if want == residual else "plain")
    assert kinds == {"norm", "bias", "residual", "plain"}


def test_init_is_deterministic_given_seed():
    c = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, ffn_dim=48)
    a, b, other = build_model(c, seed=3), build_model(c, seed=3), build_model(c, seed=4)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), other.parameters()):
        assert torch.equal(p, q), n
        if not n.endswith("norm.weight"):
            assert not torch.equal(p, r), n


def test_zero_init_proj_zeroes_only_the_residual_projections():
    """modded-nanogpt's zero-initialised projections: W_o and W_down start at zero (each block
    is the identity on the residual stream), every other weight draws what it draws without
    the option (same RNG stream); q/k norm gains (qk_norm) start at one."""
    c = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, ffn_dim=48, qk_norm=True)
    plain = build_model(c, seed=0)
    zero = build_model(c.model_copy(update={"zero_init_proj": True}), seed=0)
    for (n, p), q in zip(zero.named_parameters(), plain.parameters()):
        if n.endswith(("o_proj.weight", "down_proj.weight")):
            assert not p.any() and q.any(), n
        else:
            assert torch.equal(p, q), n
    assert torch.equal(zero.layers[0].attn.q_norm.weight, torch.ones(8))
    x = torch.randint(0, 64, (1, 5))
    h = zero.embed_tokens(x)
    torch.testing.assert_close(zero(x).logits, zero.lm_head(torch.nn.functional.rms_norm(
        h, (32,), zero.norm.weight, zero.norm.eps)))
