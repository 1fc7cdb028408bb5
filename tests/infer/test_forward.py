"""The fused inference forward equals Transformer.forward, feature by feature."""

from __future__ import annotations

import pytest
import torch

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.forward import forward_hidden, supports
from astrai.model import ForwardContext, build_model

from .conftest import random_prompts, small_config

FEATURES = {
    "base": {},
    "bias+tied": {"qkv_bias": True, "tie_embeddings": True},
    "window": {"sliding_window": 5},
    "moe": {"n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1},
    "yarn": {"rope_scaling": {"type": "yarn", "factor": 2.0,
                              "original_max_position_embeddings": 64}},
    "mha": {"n_kv_heads": 4},
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_forward_hidden_equals_the_model(name):
    model = build_model(small_config(**FEATURES[name]), seed=4).eval()
    if name == "bias+tied":
        with torch.no_grad():
            for layer in model.layers:
                layer.attn.q_proj.bias.normal_(0, 0.5)
                layer.attn.k_proj.bias.normal_(0, 0.5)
    assert supports(model)
    ids = torch.tensor(random_prompts((21,), seed=1)[0])
    with torch.inference_mode():
        ref = model(ids[None], return_hidden=True).hidden[0]
        ours = forward_hidden(model, ids, torch.arange(21), ForwardContext())
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_bf16_forward_is_close():
    model = build_model(small_config(), seed=4, dtype=torch.bfloat16).eval()
    ids = torch.tensor(random_prompts((9,), seed=1)[0])
    with torch.inference_mode():
        ref = model(ids[None], return_hidden=True).hidden[0].float()
        ours = forward_hidden(model, ids, torch.arange(9), ForwardContext()).float()
    torch.testing.assert_close(ours, ref, atol=2e-2, rtol=2e-2)


def test_engine_paths_agree_and_other_models_fall_back(model):
    prompts = random_prompts((6, 19), seed=7)
    p = SamplingParams.greedy(10, logprobs=True)
    fast = Engine(model, None, CacheConfig(max_kv_tokens=1024)).generate(prompts, p)
    plain_engine = Engine(model, None, CacheConfig(max_kv_tokens=1024), fast_forward=False)
    assert not plain_engine.runner.fast
    plain = plain_engine.generate(prompts, p)
    for a, b in zip(fast, plain):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)

    class Subclass(type(model)):
        pass

    assert not supports(Subclass(model.config))
