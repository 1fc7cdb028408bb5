"""RoPE: rotate-half layout, relative-position property, scaled frequencies vs transformers."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.model.config import ModelConfig, RopeScaling
from astrai.model.hf_config import config_from_hf, config_to_hf
from astrai.model.rope import apply_rope, rope_inv_freq, rope_table

SCALINGS = {
    "none": RopeScaling(),
    "linear": RopeScaling(type="linear", factor=4.0),
    "ntk": RopeScaling(type="ntk", factor=4.0),
    "llama3": RopeScaling(type="llama3", factor=8.0, original_max_position_embeddings=64),
    "yarn": RopeScaling(type="yarn", factor=4.0, original_max_position_embeddings=64),
}


def rotate(x: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One D-vector rotated to position `pos`."""
    c, s = cos[pos].view(1, 1, -1), sin[pos].view(1, 1, -1)
    return apply_rope(x.view(1, 1, 1, -1), c, s).view(-1)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_dot_product_depends_only_on_relative_position(kind):
    D = 32
    cos, sin = rope_table(D, 512, 10000.0, SCALINGS[kind])
    cos, sin = cos.double(), sin.double()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(D, generator=g).double(), torch.randn(D, generator=g).double()
    for i, j in [(5, 2), (40, 1), (300, 299), (17, 17)]:
        ref = rotate(q, i, cos, sin) @ rotate(k, j, cos, sin)
        for shift in (1, 13, 150):
            got = rotate(q, i + shift, cos, sin) @ rotate(k, j + shift, cos, sin)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)  # fp32 table
    # ...and it does depend on the offset, so the check above is not vacuous.
    d1 = rotate(q, 5, cos, sin) @ rotate(k, 2, cos, sin)
    d2 = rotate(q, 9, cos, sin) @ rotate(k, 2, cos, sin)
    assert abs(d1 - d2) > 1e-3


def test_rotate_half_layout_matches_hf_llama():
    hf = pytest.importorskip("transformers.models.llama.modeling_llama")
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 6, 3, 16
    x = torch.randn(B, T, H, D, generator=g)
    cos, sin = rope_table(D, T, 10000.0)
    pos = torch.arange(T).expand(B, T)
    ours = apply_rope(x, cos[pos], sin[pos])
    # HF: x [B, H, T, D] with cos/sin [B, T, D] duplicated over both halves.
    c2, s2 = torch.cat([cos[pos]] * 2, -1), torch.cat([sin[pos]] * 2, -1)
    theirs, _ = hf.apply_rotary_pos_emb(x.transpose(1, 2), x.transpose(1, 2), c2, s2)
    torch.testing.assert_close(ours, theirs.transpose(1, 2))


HF_ROPE = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-betas": {"rope_type": "yarn", "factor": 16.0, "beta_fast": 16, "beta_slow": 2,
                   "original_max_position_embeddings": 128},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                    "original_max_position_embeddings": 64},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("name", list(HF_ROPE))
@pytest.mark.parametrize("head_dim", [32, 128])
def test_inv_freq_equals_transformers_rope_init(name, head_dim):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**HF_ROPE[name], "rope_theta": 50000.0}
    hf_cfg = transformers.LlamaConfig(
        hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
        max_position_embeddings=1024, rope_parameters=dict(params))
    want, want_attn = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_cfg, "cpu")
    ours_cfg, _ = config_from_hf(hf_cfg.to_dict())
    got, got_attn = rope_inv_freq(head_dim, ours_cfg.rope_theta, ours_cfg.rope_scaling)
    torch.testing.assert_close(got, want.float())
    assert got_attn == pytest.approx(want_attn, rel=1e-6)
    # The HF config astrai exports reproduces the same frequencies in transformers.
    back = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(ours_cfg).items()
                                       if k not in ("architectures", "model_type")})
    rtype = back.rope_parameters["rope_type"]
    if rtype != "default":
        again, again_attn = ROPE_INIT_FUNCTIONS[rtype](back, "cpu")
        torch.testing.assert_close(again, want.float())
        assert again_attn == pytest.approx(want_attn, rel=1e-6)


def test_ntk_exports_as_an_exact_base_change():
    c = ModelConfig(dim=256, n_heads=4, rope_scaling={"type": "ntk", "factor": 4.0})
    hf = config_to_hf(c)
    assert hf["rope_scaling"] is None
    assert hf["rope_theta"] == pytest.approx(10000.0 * 4.0 ** (64 / 62))
    got, _ = rope_inv_freq(64, c.rope_theta, c.rope_scaling)
    plain, _ = rope_inv_freq(64, hf["rope_theta"])
    torch.testing.assert_close(got, plain)


def test_yarn_attention_factor_scales_the_table():
    s = RopeScaling(type="yarn", factor=4.0, original_max_position_embeddings=64)
    cos, sin = rope_table(16, 8, 10000.0, s)
    assert torch.allclose(cos[0], torch.full((8,), 0.1 * math.log(4.0) + 1.0))
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, (0.1 * math.log(4.0) + 1.0) ** 2))
