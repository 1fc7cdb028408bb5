"""The engine runs the model's own forward: every model feature, through the paged cache,
gives the tokens and log-probabilities of a full recomputation without any cache."""

from __future__ import annotations

import pytest
import torch

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.model import build_model
from astrai.model.transformer import ModelOutput, Transformer

from .conftest import naive_greedy, naive_logprobs, random_prompts, small_config

FEATURES = {
    "bias+tied": {"qkv_bias": True, "tie_embeddings": True},
    "moe": {"n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1},
    "yarn": {"rope_scaling": {"type": "yarn", "factor": 2.0,
                              "original_max_position_embeddings": 64}},
    "mha": {"n_kv_heads": 4},
    "qk-norm": {"qk_norm": True},
}
NEW = 8


def engine(model):
    return Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=1024, max_requests=4))


@pytest.mark.parametrize("name", list(FEATURES))
def test_every_feature_equals_full_recompute(name):
    model = build_model(small_config(**FEATURES[name]), seed=4).eval()
    if name == "bias+tied":
        with torch.no_grad():  # biases start at zero: make them matter
            for layer in model.layers:
                layer.attn.q_proj.bias.normal_(0, 0.5)
                layer.attn.k_proj.bias.normal_(0, 0.5)
    if name == "qk-norm":
        with torch.no_grad():  # gains start at one: make the per-head norms matter
            for layer in model.layers:
                layer.attn.q_norm.weight.normal_(1, 0.5)
                layer.attn.k_norm.weight.normal_(1, 0.5)
    prompts = random_prompts((21, 6), seed=1)
    outs = engine(model).generate(prompts, SamplingParams.greedy(NEW, logprobs=True))
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(model, p, NEW)
        torch.testing.assert_close(o.logprobs, naive_logprobs(model, p, o.token_ids),
                                   atol=1e-4, rtol=0)


def test_bf16_model_is_close_to_its_recompute():
    model = build_model(small_config(), seed=4, dtype=torch.bfloat16).eval()
    prompt = random_prompts((9,), seed=1)[0]
    out = engine(model).generate(prompt, SamplingParams.greedy(4, logprobs=True))[0]
    ref = naive_logprobs(model, prompt, out.token_ids)
    torch.testing.assert_close(out.logprobs, ref, atol=0.1, rtol=0)


class Negated(Transformer):
    """A model that changes its own forward (final hidden states negated, so the logits
    are too: the head has no bias): the engine must run exactly that forward."""

    def forward(self, input_ids, ctx=None, **kw):
        out = super().forward(input_ids, ctx, **kw)
        neg = lambda t: None if t is None else -t
        return ModelOutput(neg(out.logits), out.aux_loss, neg(out.hidden))


def test_the_engine_runs_the_model_s_own_forward():
    base = build_model(small_config(), seed=6).eval()
    model = Negated(base.config).eval()
    model.load_state_dict(base.state_dict())
    prompt = random_prompts((11,), seed=3)[0]
    out = engine(model).generate(prompt, SamplingParams.greedy(NEW))[0]
    assert out.token_ids == naive_greedy(model, prompt, NEW)
    assert out.token_ids != naive_greedy(base, prompt, NEW)
