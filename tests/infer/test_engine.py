"""The engine end to end on CPU: cached decoding equals full recomputation token for token
in every cache mode, prefix sharing, preemption, logprobs, seeds, penalties."""

from __future__ import annotations

import random

import pytest
import torch

from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig, attn_backend

from .conftest import naive_greedy, naive_logprobs, random_prompts

LENGTHS = (5, 17, 33, 1, 40, 9)
NEW = 12


def engine(model, mode="paged", page_size=4, tokens=1024, rows=8, radix=True, step=2048,
           **kw):
    cache = CacheConfig(mode=mode, page_size=page_size, max_kv_tokens=tokens,
                        max_requests=rows, radix=radix, max_context=kw.pop("max_context", None))
    return Engine(model, None, cache, scheduler_config=SchedulerConfig(max_step_tokens=step), **kw)


@pytest.fixture(scope="module")
def reference(model):
    prompts = random_prompts(LENGTHS)
    return prompts, [naive_greedy(model, p, NEW) for p in prompts]


CONFIGS = {
    "paged+radix": {},
    "paged": {"radix": False},
    "contiguous": {"mode": "contiguous", "max_context": 64},
    "page-size-1": {"page_size": 1},
    "chunked-prefill": {"step": 7},
    "preemption": {"tokens": 64, "page_size": 4, "max_context": 64},  # 16 pages; 45 needed
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_full_recompute(model, reference, name):
    prompts, expected = reference
    eng = engine(model, **CONFIGS[name])
    outs = eng.generate(prompts, SamplingParams.greedy(NEW, logprobs=True))
    assert [o.token_ids for o in outs] == expected
    for p, o in zip(prompts, outs):
        torch.testing.assert_close(o.logprobs, naive_logprobs(model, p, o.token_ids),
                                   atol=1e-4, rtol=0)
        assert o.finish_reason == "length" and o.usage.completion_tokens == NEW
    st = eng.stats()
    if name == "preemption":
        assert st.num_preemptions > 0
    if name == "chunked-prefill":
        assert st.num_steps > NEW + 10
    assert st.num_running == st.num_waiting == 0 and st.pool.utilization == 0.0


def test_sliding_window_equals_full_recompute(window_model):
    prompts = random_prompts((3, 20, 13), seed=3)
    outs = engine(window_model, page_size=4, step=6).generate(prompts, SamplingParams.greedy(10))
    assert [o.token_ids for o in outs] == [naive_greedy(window_model, p, 10) for p in prompts]


def test_prefix_cache_hits_reuse_pages_and_match(model):
    system = random_prompts((24,), seed=5)[0]
    tails = random_prompts((3, 6, 1), seed=6)
    prompts = [system + t for t in tails]
    eng = engine(model, page_size=4)
    first = eng.generate(prompts[0], SamplingParams.greedy(8))[0]
    assert first.usage.cached_tokens == 0
    rest = eng.generate(prompts[1:], SamplingParams.greedy(8))
    assert [o.usage.cached_tokens for o in rest] == [24, 24]  # six whole pages each
    st = eng.stats().pool
    assert st.prefix_hit_tokens == 48 and st.prefix_query_tokens == sum(map(len, prompts))
    cold = engine(model, radix=False).generate(prompts, SamplingParams.greedy(8))
    assert [o.token_ids for o in [first, *rest]] == [o.token_ids for o in cold]
    # a repeated prompt hits everything but its last page
    again = eng.generate(prompts[0], SamplingParams.greedy(8))[0]
    assert again.usage.cached_tokens == 24 and again.token_ids == first.token_ids
    assert eng.reset_prefix_cache() > 0
    assert eng.pool.allocator.num_free() == eng.pool.num_pages
    assert eng.generate(prompts[1], SamplingParams.greedy(8))[0].usage.cached_tokens == 0


def test_no_leaks_over_random_streams_with_aborts(model):
    rng = random.Random(0)
    eng = engine(model, tokens=64, page_size=4, rows=4, max_context=48, step=16)
    live = []
    for i in range(60):
        if rng.random() < 0.6:
            n = rng.randint(1, 30)
            shared = [7] * rng.choice((0, 8, 16))
            p = (shared + [rng.randrange(256) for _ in range(n)])[:40]
            live.append(eng.add_request(p, SamplingParams(max_tokens=rng.randint(1, 12),
                                                          temperature=0.8, seed=i)))
        if live and rng.random() < 0.1:
            eng.abort(live.pop(rng.randrange(len(live))))
        eng.step()
    while eng.has_unfinished():
        eng.step()
    a = eng.pool.allocator
    assert a.num_free() + a.num_evictable() == a.num_pages
    eng.pool.radix.clear()
    assert a.num_free() == a.num_pages and all(r == 0 for r in a.ref)


def test_seeded_sampling_is_reproducible_per_request(model):
    prompts = random_prompts((6, 11, 4), seed=9)
    params = [SamplingParams(max_tokens=10, temperature=1.0, top_k=50, top_p=0.9, seed=s)
              for s in (1, 2, 3)]
    batch = engine(model).generate(prompts, params)
    alone = engine(model, step=5).generate(prompts[1], params[1])[0]
    assert alone.token_ids == batch[1].token_ids  # batch composition and chunking irrelevant
    other = engine(model).generate(prompts[1], SamplingParams(max_tokens=10, seed=99))[0]
    assert other.token_ids != batch[1].token_ids
    # unseeded requests follow the engine seed
    a = engine(model, seed=5).generate(prompts, SamplingParams(max_tokens=10))
    b = engine(model, seed=5).generate(prompts, SamplingParams(max_tokens=10))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_seeded_sampling_survives_preemption(model):
    prompts = random_prompts((10, 14, 12, 9), seed=4)
    params = [SamplingParams(max_tokens=16, temperature=0.9, seed=i) for i in range(4)]
    roomy = engine(model).generate(prompts, params)
    tight = engine(model, tokens=40, max_context=40)
    squeezed = tight.generate(prompts, params)
    assert tight.stats().num_preemptions > 0
    assert [o.token_ids for o in roomy] == [o.token_ids for o in squeezed]


# The float32 edge: the smallest subnormal, a subnormal, the smallest normal float32 and
# the next float32 above it: logits / t overflows to inf, whose softmax is NaN.
TINY_TEMPERATURES = (1e-45, 1e-40, 1.1754944e-38, 1.1754945e-38)


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_tiny_temperatures_decode_greedily(model, reference, temperature):
    prompts, expected = reference
    params = SamplingParams(max_tokens=NEW, temperature=temperature, seed=3)
    outs = engine(model).generate(prompts, params)
    assert [o.token_ids for o in outs] == expected


@torch.no_grad()
def test_repetition_penalty_matches_naive_loop(model):
    prompt = random_prompts((8,), seed=2)[0]
    p = SamplingParams.greedy(10, repetition_penalty=1.5, frequency_penalty=0.3,
                              presence_penalty=0.2)
    eng = engine(model)
    out = eng.generate(prompt, p)[0].token_ids
    assert not eng.sampler._penalties  # the sampler forgets a request when it ends
    ids, ref = list(prompt), []
    for _ in range(10):
        lg = model(torch.tensor([ids])).logits[0, -1].clone()
        for t in set(ids):
            lg[t] = lg[t] / 1.5 if lg[t] > 0 else lg[t] * 1.5
        for t in set(ref):
            lg[t] -= 0.3 * ref.count(t) + 0.2
        ref.append(int(lg.argmax()))
        ids.append(ref[-1])
    assert out == ref


def test_top_logprobs_and_stop_token_ids(model, reference):
    prompts, expected = reference
    stop_at = expected[1][4]
    out = engine(model).generate(prompts[1], SamplingParams.greedy(
        NEW, stop_token_ids=[stop_at], top_logprobs=3))[0]
    cut = expected[1].index(stop_at) + 1
    assert out.token_ids == expected[1][:cut] and out.finish_reason == "stop"
    assert out.stop_reason == stop_at


def test_explicit_backend_choices(model, reference):
    prompts, expected = reference
    with attn_backend("torch_native"):
        outs = engine(model).generate(prompts[:2], SamplingParams.greedy(NEW))
    assert [o.token_ids for o in outs] == expected[:2]
    eng = engine(model, backend="torch_native")
    assert eng.backend().name == "torch_native"


def test_engine_follows_in_place_weight_updates():
    """GRPO rollouts share the policy: after an optimizer step the engine must use the new
    weights (the fused forward reads them live; the CPU head copy tracks _version)."""
    from astrai.model import build_model

    from .conftest import small_config

    m = build_model(small_config(), seed=11).eval()
    eng = engine(m)
    prompt = random_prompts((9,), seed=12)[0]
    before = eng.generate(prompt, SamplingParams.greedy(8))[0].token_ids
    assert before == naive_greedy(m, prompt, 8)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    eng.reset_prefix_cache()
    after = eng.generate(prompt, SamplingParams.greedy(8))[0].token_ids
    assert after == naive_greedy(m, prompt, 8) != before
