"""The paper's Stage-1 variance arithmetic, and the measured residual variance."""

from __future__ import annotations

import math

import pytest
import torch

from astrai.errors import UnsupportedModelError
from astrai.inspect import variance as V
from astrai.inspect.testing import fresh_state, tiny_config, write_checkpoint
from astrai.model import get_preset


def test_closed_form_reproduces_paper_table():
    c = get_preset("1.2b")
    u, s = V.block_variance(c, scaled=False), V.block_variance(c, scaled=True)
    assert u.qkv == pytest.approx(0.6144)  # 1536 * 0.02^2
    assert u.gate == pytest.approx(0.6144)
    assert u.silu == pytest.approx(0.1831, abs=1e-4)
    assert u.product == pytest.approx(0.1125, abs=1e-4)
    assert u.attn_out == pytest.approx(0.378, abs=1e-3)
    assert u.down == pytest.approx(0.311, abs=1e-3)
    assert u.block == pytest.approx(0.689, abs=1e-3)
    assert s.block == pytest.approx(0.689 / 48, rel=1e-3)  # 0.014: scaled by 1/(2L)
    assert u.block / s.block == pytest.approx(48)
    assert V.closed_form_final(u.block, 24) == pytest.approx(17.5, abs=0.05)
    assert V.closed_form_final(s.block, 24) == pytest.approx(1.34, abs=0.01)


def test_silu_second_moment_against_monte_carlo():
    z = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for var in (0.1, 0.6144, 4.0):
        zz = z * math.sqrt(var)
        mc = float((torch.nn.functional.silu(zz) ** 2).mean()) / var
        assert V.silu_second_moment_ratio(var) == pytest.approx(mc, rel=5e-3)


@pytest.fixture
def deep_preset(monkeypatch):
    # The paper's depth (L = 24) at small width: the ratio depends on L, not on d.
    monkeypatch.setitem(V.PRESETS, "deep24", {
        "vocab_size": 1000, "dim": 64, "n_layers": 24, "n_heads": 4, "n_kv_heads": 2,
        "head_dim": 16, "ffn_dim": 192, "max_seq_len": 128})
    return "deep24"


def test_measured_contribution_ratio_is_about_2L(deep_preset):
    r = V.residual_variance(deep_preset, seq_len=32, seed=0)
    assert r.contribution_ratio("unit/") == pytest.approx(48, rel=0.2)
    s = r.get("unit/scaled")
    assert s.entry_var == pytest.approx(1.0, rel=1e-5)
    assert len(s.after) == len(s.branch) == 24
    assert r.get("scaled").entry_var == pytest.approx(0.02**2, rel=0.1)
    # from N(0, 0.02) embeddings, unscaled residuals grow the stream far faster
    assert r.get("unscaled").ratio[-1] > 10 * r.get("scaled").ratio[-1]
    d = V.variance_dict(r)
    assert d["expected_ratio"] == 48 and d["closed_form"]["ratio"] == pytest.approx(48)


def test_measurement_matches_a_naive_forward(tmp_path):
    # The per-block trace of a checkpoint equals hooking the real model's blocks.
    cfg = tiny_config(n_layers=3)
    path = write_checkpoint(tmp_path / "ck", fresh_state(cfg, seed=4), cfg)
    tokens = [1, 7, 42, 9, 300, 2, 2, 5]
    r = V.residual_variance(path, tokens=tokens, fresh=False)
    from astrai.model.checkpoint import load_checkpoint

    model, _, _ = load_checkpoint(path)
    seen = []
    for blk in model.layers:
        blk.register_forward_hook(lambda m, i, o: seen.append((i[0], o[0])))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    ck = r.get("checkpoint")
    assert ck.entry_var == pytest.approx(float(seen[0][0].double().var(unbiased=False)))
    for (x_in, x_out), after, branch in zip(seen, ck.after, ck.branch):
        assert after == pytest.approx(float(x_out.double().var(unbiased=False)), rel=1e-5)
        assert branch == pytest.approx(float((x_out - x_in).double().var(unbiased=False)),
                                       rel=1e-4)
    assert r.tokens == (1, 8)


def test_bad_targets(tmp_path):
    with pytest.raises(UnsupportedModelError, match="neither a preset"):
        V.residual_variance(tmp_path / "nope")
    cfg = tiny_config(n_layers=1)
    path = write_checkpoint(tmp_path / "ck", fresh_state(cfg), cfg)
    with pytest.raises(UnsupportedModelError, match="ids must lie"):
        V.residual_variance(path, tokens=[cfg.vocab_size])


@pytest.mark.slow
def test_paper_configuration_ratio_within_20_percent_of_2L():
    # The 1.2B preset, built one block at a time (memory stays ~ one block).
    r = V.residual_variance("1.2b", seq_len=64, seed=0)
    assert r.contribution_ratio() == pytest.approx(48, rel=0.2)
    assert r.contribution_ratio("unit/") == pytest.approx(48, rel=0.2)
    u, s = r.closed_final
    assert (round(u, 1), round(s, 2)) == (17.5, 1.34)


def test_hf_directory_target(tmp_path):
    from astrai.inspect.testing import write_hf_dir

    cfg = tiny_config(n_layers=2)
    state = fresh_state(cfg, seed=5)
    ours = V.residual_variance(write_checkpoint(tmp_path / "a", state, cfg), seq_len=8,
                               fresh=False).get("checkpoint")
    hf = V.residual_variance(write_hf_dir(tmp_path / "hf", state, cfg), seq_len=8,
                             fresh=False).get("checkpoint")
    assert hf.after == pytest.approx(ours.after, rel=1e-6)  # same weights, same tokens
