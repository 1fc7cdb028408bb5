"""Every preset and every model feature (astrai.model.features) through the engine's chosen
decode path: where the native CPU step takes the model its tokens and log-probabilities
equal the eager path's; where it does not, the engine runs another path and says why, naming
the feature. A feature no executor declares goes to the eager path, never to a wrong answer."""

from __future__ import annotations

import logging

import pytest

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.model import build_model, get_preset
from astrai.model import features as feats
from astrai.model.presets import PRESETS

from .conftest import VOCAB, assert_same_outputs, random_prompts

BASE = {"vocab_size": VOCAB, "n_layers": 2, "head_dim": 16, "ffn_dim": 96, "max_seq_len": 256,
        "init_std": 0.2}
PROMPTS = random_prompts((5, 11, 2), seed=6)
PARAMS = SamplingParams.greedy(6, logprobs=True)


def preset_case(name: str) -> dict:
    """The preset's features (GQA ratio, tied head, norm epsilon, RoPE base) at tiny sizes."""
    p = get_preset(name)
    ratio = p.n_heads // p.kv_heads
    kv = 1 if ratio > 2 else 2
    return {"n_heads": ratio * kv, "n_kv_heads": kv, "dim": ratio * kv * 16,
            "tie_embeddings": p.tie_embeddings, "norm_eps": p.norm_eps,
            "rope_theta": p.rope_theta}


GQA = {"n_heads": 4, "n_kv_heads": 2, "dim": 64}
CASES = {
    **{f"preset-{n}": preset_case(n) for n in PRESETS},
    "mha": {"n_heads": 4, "n_kv_heads": 4, "dim": 64},
    "gqa-4": {"n_heads": 4, "n_kv_heads": 1, "dim": 64},
    "qk-norm": {**GQA, "qk_norm": True},
    "qkv-bias": {**GQA, "qkv_bias": True},
    "tied": {**GQA, "tie_embeddings": True},
    "norm-eps": {**GQA, "norm_eps": 1e-6},
    "window-beyond-context": {**GQA, "sliding_window": 4096},
    "rope-linear": {**GQA, "rope_scaling": {"type": "linear", "factor": 2.0}},
    "rope-ntk": {**GQA, "rope_scaling": {"type": "ntk", "factor": 2.0}},
    "rope-llama3": {**GQA, "rope_scaling": {"type": "llama3", "factor": 8.0,
                                            "original_max_position_embeddings": 64}},
    "rope-yarn": {**GQA, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 64}},
}
REFUSED = {  # case -> the feature named in the refusal
    "narrow-window": ({**GQA, "sliding_window": 8}, "sliding_window=8"),
    "moe": ({**GQA, "n_experts": 4, "moe_top_k": 2}, "n_experts=4"),
    "moe-shared": ({**GQA, "n_experts": 2, "moe_top_k": 1, "n_shared_experts": 1},
                   "n_experts=2"),
}


def engine(model, decode):
    return Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4),
                  decode=decode)


def model_of(case: dict):
    return build_model(get_preset("tiny", **{**BASE, **case}), seed=1).eval()


def test_the_cases_cover_every_feature():
    """Each feature field is set off its default by some case (a new feature needs one)."""
    default = feats.forward_features(get_preset("tiny", **BASE))
    varied = set()
    for case in [*CASES.values(), *(c for c, _ in REFUSED.values())]:
        got = feats.forward_features(get_preset("tiny", **{**BASE, **case}))
        varied |= {k for k in got if got[k] != default[k]}
    assert varied >= set(default) - {"moe_layers"}  # None = every block: the MoE cases


@pytest.mark.skipif(cpu_decode_kernels() is None, reason="no CPU decode kernels here")
@pytest.mark.parametrize("case", list(CASES))
def test_native_serves_the_feature_and_equals_eager(case):
    model = model_of(CASES[case])
    eng = engine(model, "auto")
    assert eng.decode_path.name == "native"
    assert_same_outputs(eng.generate(PROMPTS, PARAMS),
                        engine(model, "eager").generate(PROMPTS, PARAMS))
    assert eng.decode_path.failure is None


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_unserved_feature_runs_another_path_and_says_which(case, caplog):
    cfg, named = REFUSED[case]
    model = model_of(cfg)
    with caplog.at_level(logging.INFO, logger="astrai.infer"):
        eng = engine(model, "auto")
    assert eng.decode_path.name == "eager"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode path")]
    assert len(lines) == 1 and named in lines[0]
    assert_same_outputs(eng.generate(PROMPTS, PARAMS),
                        engine(model, "eager").generate(PROMPTS, PARAMS))


def test_a_feature_no_executor_declares_goes_eager(monkeypatch, caplog):
    """A new field with the role `feature` (here: init_std pretending to change the
    forward) is refused by the native and static steps until they declare it."""
    monkeypatch.setitem(feats.ROLES, "init_std", "feature")
    model = model_of(GQA)
    with caplog.at_level(logging.INFO, logger="astrai.infer"):
        assert engine(model, "auto").decode_path.name == "eager"
        assert engine(model, "static").decode_path.name == "eager"
    assert "init_std=0.2 is a model feature the static decode step does not declare" \
        in caplog.text
    if cpu_decode_kernels() is not None:
        assert "init_std=0.2 is a model feature the native CPU step does not declare" \
            in caplog.text
