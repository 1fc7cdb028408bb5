"""ModelConfig validation, presets and JSON round trip."""

from __future__ import annotations

import pytest

from astrai.errors import ConfigError
from astrai.model import PRESETS, ModelConfig, get_preset


def test_dim_not_divisible_by_heads_names_the_fields():
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_dict({"dim": 100, "n_heads": 8}, source="my.json")
    msg = str(e.value)
    assert "my.json" in msg and "dim (100)" in msg and "n_heads (8)" in msg
    assert "\n" not in msg


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(ConfigError, match=r"n_heads \(6\) is not divisible by n_kv_heads \(4\)"):
        ModelConfig.from_dict({"dim": 96, "n_heads": 6, "n_kv_heads": 4})


def test_explicit_head_dim_allows_non_dividing_dim():
    c = ModelConfig.from_dict({"dim": 100, "n_heads": 4, "head_dim": 16})
    assert c.hdim == 16 and c.kv_heads == 4


@pytest.mark.parametrize("bad, field", [
    ({"head_dim": 7, "n_heads": 1, "dim": 7}, "head_dim"),
    ({"n_experts": 2, "moe_top_k": 3}, "moe_top_k"),
    ({"n_experts": 2, "moe_layers": [9]}, "moe_layers"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"bogus": 1}, "bogus"),
])
def test_invalid_fields_are_config_errors(bad, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict(bad)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        get_preset("7b")
    assert "'7b'" in str(e.value) and all(name in str(e.value) for name in PRESETS)


def test_preset_overrides_and_paper_shape():
    c = get_preset("1.2b")
    assert (c.vocab_size, c.dim, c.n_layers, c.n_heads, c.kv_heads, c.hdim, c.ffn_dim,
            c.max_seq_len, c.norm_eps, c.rope_theta) == (
        100000, 1536, 24, 24, 4, 64, 6912, 2048, 1e-5, 10000.0)
    assert get_preset("tiny", vocab_size=500).vocab_size == 500
    with pytest.raises(ConfigError, match="preset 'tiny'"):
        get_preset("tiny", n_kv_heads=3)


def test_json_round_trip(tmp_path):
    c = ModelConfig(dim=64, n_heads=4, n_kv_heads=1, rope_scaling={"type": "yarn", "factor": 4},
                    sliding_window=16, n_experts=4, moe_layers=[0], qkv_bias=True)
    c.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == c
