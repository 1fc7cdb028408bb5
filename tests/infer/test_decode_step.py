"""The static-shape decode step (astrai.infer.decode_step): the same tokens and logits as
the eager ragged path and as full recomputation, across model families, cache modes,
prefix sharing, preemption, bucket boundaries and int8 weights; CUDA graphs on CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.decode_step import decode_buckets
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.model import build_model
from astrai.model.quant import quantize_model

from .conftest import (
    EAGER_CASES,
    assert_equals_full_recompute,
    assert_equals_the_eager_path,
    random_prompts,
    small_config,
)
from .conftest import (
    paged_engine as engine,
)

NEW = 10
FAMILIES = {  # the switches that distinguish llama, qwen2, qwen3 and a tied-embedding model
    "llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True},
    "tied": {"tie_embeddings": True},
}


def test_buckets():
    assert decode_buckets(1) == [1]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert decode_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_static_step_equals_full_recompute(family):
    """Batches of 6, 5, ... requests (buckets 8 and 4: padding rows on every step)."""
    model = build_model(small_config(**FAMILIES[family]), seed=3).eval()
    eng = assert_equals_full_recompute(model, "static")
    assert eng.stats().decode == "static"
    assert eng.stats().pool.utilization == 0.0


@pytest.mark.parametrize("case", list(EAGER_CASES))
def test_static_step_equals_the_eager_path(model, case):
    assert assert_equals_the_eager_path(model, "static", case).stats().decode == "static"


def test_static_step_with_int8_weights(model):
    q = quantize_model(copy.deepcopy(model), "int8")
    prompts = random_prompts((7, 3, 12), seed=6)
    params = SamplingParams.greedy(NEW)
    a = engine(q, "static").generate(prompts, params)
    b = engine(q, "eager").generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_modes_the_static_step_cannot_serve_fall_back_to_eager(model, window_model):
    assert engine(window_model, "static").stats().decode == "eager"  # sliding window
    cache = CacheConfig(mode="contiguous", max_requests=2, max_context=64)
    assert Engine(model, None, cache, decode="static").stats().decode == "eager"
    # CPU: the native step where astrai's CPU kernels build, else the ragged path
    assert engine(model, "auto").stats().decode == ("native" if cpu_decode_kernels() else "eager")
    assert engine(model, "graphs").stats().decode == "static"  # no CUDA: same step, eager
    with pytest.raises(ValueError, match="decode mode"):
        engine(model, "fast")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_equal_the_eager_path():
    model = build_model(small_config(head_dim=64, dim=128), seed=2).cuda().half().eval()
    prompts = random_prompts((5, 17, 33, 1, 40, 9, 3, 70, 2), seed=7)
    params = SamplingParams.greedy(NEW)
    graphs = engine(model, "graphs", rows=16)
    assert graphs.stats().decode == "graphs"
    a = graphs.generate(prompts, params)
    b = engine(model, "eager", rows=16).generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert graphs.decode_path.fast.graphs  # at least one bucket was captured and replayed
