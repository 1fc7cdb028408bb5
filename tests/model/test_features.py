"""Every ModelConfig field has a declared role in the forward pass (astrai.model.features),
and an executor refuses a model feature it does not declare."""

from __future__ import annotations

import pytest

from astrai.model import get_preset
from astrai.model.config import ModelConfig, RopeScaling
from astrai.model.features import (
    ANY,
    ROLES,
    ROPE_SCALING_FIELDS,
    forward_features,
    only,
    refusal,
    window_covers_context,
)


def test_every_config_field_has_a_role():
    """A field added to ModelConfig without a role fails here: classify it (and, if it
    changes the forward, teach each executor or let it refuse)."""
    assert set(ModelConfig.model_fields) == set(ROLES)
    assert set(ROLES.values()) <= {"shape", "rope", "feature", "init", "training"}
    assert set(RopeScaling.model_fields) == ROPE_SCALING_FIELDS


def test_forward_features_are_the_feature_fields():
    cfg = get_preset("tiny", qk_norm=True, sliding_window=64)
    f = forward_features(cfg)
    assert f["qk_norm"] is True and f["sliding_window"] == 64
    assert "dim" not in f and "init_std" not in f and "rope_scaling" not in f


def test_refusal_names_the_undeclared_or_unserved_feature():
    cfg = get_preset("tiny", n_experts=4, moe_top_k=2)
    declared = {name: ANY for name in forward_features(cfg)}
    assert refusal(cfg, declared, 1024, "x") is None
    assert refusal(cfg, {**declared, "n_experts": only(0)}, 1024, "x step") == \
        "n_experts=4 is not served by the x step"
    del declared["qk_norm"]
    assert refusal(cfg, declared, 1024, "x step") == \
        "qk_norm=False is a model feature the x step does not declare"


@pytest.mark.parametrize("window, context, ok", [(None, 100, True), (100, 100, True),
                                                  (99, 100, False)])
def test_a_window_covering_the_context_is_full_attention(window, context, ok):
    assert window_covers_context(window, context) is ok


@pytest.mark.parametrize("where", ["gguf", "hf"])
def test_the_exporters_read_the_model_through_their_declaration(where, monkeypatch):
    """An exporter whose declaration lacks a feature refuses the model naming it (it would
    otherwise write a file that drops it); a declared but refused value gives the
    exporter's own line."""
    from astrai.errors import UnsupportedModelError
    from astrai.model import gguf_names, hf_config

    module, table, export = ((gguf_names, "GGUF_FEATURES", gguf_names.gguf_arch)
                             if where == "gguf" else
                             (hf_config, "HF_FEATURES", hf_config.config_to_hf))
    export(get_preset("tiny", qk_norm=True))  # served as declared
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        export(get_preset("tiny", n_experts=4, moe_top_k=2))
    monkeypatch.delitem(getattr(module, table), "qk_norm")
    with pytest.raises(UnsupportedModelError, match="qk_norm=True is a model feature the "
                       f"{'GGUF' if where == 'gguf' else 'HF'} export does not declare"):
        export(get_preset("tiny", qk_norm=True))
