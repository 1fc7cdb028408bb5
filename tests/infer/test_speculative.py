"""Speculative decoding (astrai.infer.speculative): greedy output equal to plain decoding
for every model family, with the radix cache, preemption, stop conditions and
log-probabilities; prompt lookup against a naive loop; a draft model (the model itself:
every proposal kept; another model: output unchanged); and the sampled rule keeping the
target distribution (chi-squared tests at fixed seeds)."""

from __future__ import annotations

import types

import pytest
import torch

from astrai.errors import ConfigError
from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.infer.config import SpeculativeConfig
from astrai.infer.request import Request
from astrai.infer.sampler import Sampler
from astrai.infer.scheduler import Chunk
from astrai.infer.speculative.accept import greedy_accept
from astrai.infer.speculative.ngram import propose_ngram
from astrai.infer.speculative.speculator import Speculator, refusal
from astrai.model import build_model

from .conftest import naive_greedy, naive_logprobs, small_config

NEW = 24
FAMILIES = {  # llama, qwen2 (qkv bias), qwen3 (q/k norm), mistral (sliding window), tied
    "llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True},
    "mistral": {"sliding_window": 8}, "tied": {"tie_embeddings": True},
}
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=4)


def engine(model, speculative=None, page_size=4, tokens=2048, rows=8, radix=True,
           max_context=None, draft_model=None, decode="auto"):
    cache = CacheConfig(page_size=page_size, max_kv_tokens=tokens, max_requests=rows,
                        radix=radix, max_context=max_context)
    return Engine(model, None, cache, scheduler_config=SchedulerConfig(max_step_tokens=512),
                  speculative=speculative, draft_model=draft_model, decode=decode)


def repeating_prompts(n, seed=0, vocab=256):
    """Prompts that repeat a segment (prompt lookup finds matches), of mixed lengths."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        seg = torch.randint(0, vocab, (3 + i % 4,), generator=g).tolist()
        tail = torch.randint(0, vocab, (i % 3,), generator=g).tolist()
        out.append(seg * (2 + i % 3) + tail + seg[:2])
    return out


def naive_ngram(tokens, k, n_max, n_min):
    L = len(tokens)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        hits = [i for i in range(L - n) if tokens[i:i + n] == tokens[L - n:]]
        if hits:
            full = [i for i in hits if i + n + k <= L]
            i = full[-1] if full else hits[0]
            return tokens[i + n:i + n + k]
    return []


def test_ngram_equals_the_naive_loop():
    g = torch.Generator().manual_seed(0)
    for trial in range(400):
        L = 1 + trial % 40
        toks = torch.randint(0, 2 + trial % 5, (L,), generator=g).tolist()
        for k, n_max, n_min in ((4, 4, 1), (3, 2, 2), (6, 5, 3), (1, 1, 1)):
            assert propose_ngram(toks, k, n_max, n_min) == naive_ngram(toks, k, n_max, n_min)
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 3) == [7, 1]  # the latest
    assert propose_ngram([4, 5, 6, 7, 5, 5, 5], 3, 1) == [6, 7, 5]  # a full continuation
    assert propose_ngram([5, 6, 7], 3, 4) == []
    # 256's bytes (00 01 00 00) lie across the boundary of 2**24 and 0: not a match
    assert propose_ngram([2**24, 0, 7, 256], 2, 1) == naive_ngram([2**24, 0, 7, 256], 2, 1, 1) == []
    assert propose_ngram([2**24, 0, 256, 3, 256], 1, 1) == [3]


def test_greedy_accept():
    assert greedy_accept([1, 2, 3, 4], [1, 2, 3]) == [1, 2, 3, 4]
    assert greedy_accept([1, 5, 3, 4], [1, 2, 3]) == [1, 5]
    assert greedy_accept([7, 2], [1]) == [7]


def test_config_is_checked():
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        SpeculativeConfig.from_dict({"prompt_lookup_min": 5, "prompt_lookup_max": 2})
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 0})
    with pytest.raises(ConfigError, match="needs a draft model"):
        engine(build_model(small_config(), seed=0), SpeculativeConfig(method="draft"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ngram_greedy_equals_plain_decoding(family):
    """Every family: the tokens and log-probabilities of full recomputation, with most
    steps verifying proposals (the sharp random model falls into loops prompt lookup
    predicts)."""
    model = build_model(small_config(**FAMILIES[family]), seed=3).eval()
    prompts = repeating_prompts(6, seed=4)
    eng = engine(model, NGRAM)
    outs = eng.generate(prompts, SamplingParams.greedy(NEW, logprobs=True))
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(model, p, NEW)
        assert len(o.logprobs) == NEW
        torch.testing.assert_close(o.logprobs, naive_logprobs(model, p, o.token_ids),
                                   atol=1e-4, rtol=0)
    st = eng.stats()
    assert st.speculative == "ngram" and st.spec_draft_tokens > 0
    assert 0 < st.spec_accepted_tokens <= st.spec_draft_tokens
    assert st.generated_tokens == NEW * len(prompts)
    assert st.pool.utilization == 0.0  # every page given back (rejected ones trimmed)


@pytest.fixture(scope="module")
def looping():
    """A random model whose greedy outputs fall into loops: prompt lookup gets proposals
    right as well as wrong."""
    return build_model(small_config(), seed=3).eval()


def radix_paths(radix):
    """Token sequences of every root-to-leaf path of the radix cache."""
    out, stack = [], [(radix.root, [])]
    while stack:
        node, path = stack.pop()
        if not node.children and path:
            out.append(path)
        for key, child in node.children.items():
            stack.append((child, path + list(key)))
    return out


@pytest.mark.parametrize("case", ["radix", "preemption", "page-size-1", "static"])
def test_ngram_with_cache_and_preemption(looping, case):
    """Shared prefixes served from the radix cache, twice (the second round reads what the
    first cached), a pool so small requests are preempted, one-slot pages, and the static
    decode step beside verify steps: the tokens of plain decoding; the radix cache holds
    only prefixes of the requests' final tokens (never a rejected proposal)."""
    kw = {"radix": {}, "preemption": {"tokens": 64, "max_context": 64},
          "page-size-1": {"page_size": 1}, "static": {"decode": "static"}}[case]
    prompts = repeating_prompts(8, seed=5)
    prompts = [prompts[2][:9] + p for p in prompts]
    params = SamplingParams.greedy(NEW)
    spec, plain = engine(looping, NGRAM, **kw), engine(looping, None, **kw)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    for _ in range(2):
        assert [o.token_ids for o in spec.generate(prompts, params)] == want
    if case == "preemption":
        assert spec.stats().num_preemptions > 0
    if case == "radix":
        assert spec.stats().pool.prefix_hit_rate > 0
    full = [p + w for p, w in zip(prompts, want)]
    for path in radix_paths(spec.pool.radix):
        assert any(f[:len(path)] == path for f in full)
    assert spec.stats().spec_accepted_tokens > 0


def test_stop_conditions_apply_to_each_kept_token(model):
    """A stop token met inside a step's kept tokens ends the output there, as plain
    decoding does; max_tokens is exact; batch beside plain prefill chunks."""
    prompts = repeating_prompts(4, seed=6)
    plain = engine(model).generate(prompts, SamplingParams.greedy(NEW))
    stops = [o.token_ids[NEW // 2] for o in plain]
    for i, p in enumerate(prompts):
        params = SamplingParams.greedy(NEW, stop_token_ids=[stops[i]])
        a = engine(model).generate(p, params)[0]
        b = engine(model, NGRAM).generate(p, params)[0]
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason == "stop"
    for n in (1, 2, 5):
        b = engine(model, NGRAM).generate(prompts, SamplingParams.greedy(n))
        assert [o.token_ids for o in b] == [o.token_ids[:n] for o in plain]


def test_draft_model_itself_keeps_every_proposal(model):
    """The draft is the target: every greedy proposal is kept."""
    prompts = repeating_prompts(5, seed=7)
    spec = SpeculativeConfig(method="draft", num_speculative_tokens=3)
    eng = engine(model, spec, draft_model=model)
    outs = eng.generate(prompts, SamplingParams.greedy(NEW))
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(model, p, NEW)
    st = eng.stats()
    assert st.speculative == "draft" and st.spec_draft_tokens > 0
    assert st.spec_accepted_tokens == st.spec_draft_tokens


@pytest.mark.parametrize("case", ["plain", "preemption"])
def test_another_draft_model_leaves_the_output_unchanged(model, case):
    draft = build_model(small_config(dim=32, n_layers=1, ffn_dim=64, head_dim=8), seed=9)
    kw = {"plain": {}, "preemption": {"tokens": 64, "max_context": 64}}[case]
    prompts = repeating_prompts(6, seed=8)
    spec = SpeculativeConfig(method="draft", num_speculative_tokens=4)
    eng = engine(model, spec, draft_model=draft.eval(), **kw)
    want = engine(model, **kw).generate(prompts, SamplingParams.greedy(NEW))
    got = eng.generate(prompts, SamplingParams.greedy(NEW))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert eng.stats().spec_draft_tokens > 0
    assert eng.speculator.draft.pool.stats().used_pages == 0  # finished: the draft's KV freed
    assert eng.stats().pool.utilization == 0.0


def test_draft_model_must_share_the_vocabulary(model):
    other = build_model(small_config(vocab_size=128), seed=0)
    with pytest.raises(ConfigError, match="vocab_size"):
        engine(model, SpeculativeConfig(method="draft"), draft_model=other)


def test_seeded_sampling_is_reproducible(model):
    prompts = repeating_prompts(3, seed=9)
    params = SamplingParams(max_tokens=NEW, temperature=0.8, top_k=20, seed=123,
                            frequency_penalty=0.3)
    a = engine(model, NGRAM).generate(prompts, params)
    b = engine(model, NGRAM).generate(prompts[::-1], params)[::-1]
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(len(o.token_ids) == NEW for o in a)


def test_constrained_rows_do_not_speculate():
    assert refusal(SamplingParams()) is None
    constrained = types.SimpleNamespace(structured_outputs={"json": {}})
    assert "constrained" in refusal(constrained)


# -- the sampled rule keeps the target distribution -------------------------------------
def chi_squared_p(counts, probs):
    """p-value of Pearson's chi-squared test of `counts` against `probs` (bins with an
    expected count under 5 merged into one), via the regularised upper incomplete gamma."""
    n = counts.sum()
    exp = probs * n
    small = exp < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    e = torch.cat([exp[~small], exp[small].sum()[None]])
    keep = e > 0
    obs, e = obs[keep], e[keep]
    stat = ((obs - e) ** 2 / e).sum()
    df = torch.tensor(float(len(e) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


TRIALS = 4000


@pytest.mark.parametrize("proposal", ["point-mass", "draft-distribution"])
def test_sampled_rule_keeps_the_target_distribution(proposal):
    """4000 verify steps of a tiny model (vocabulary 12) with two proposed tokens each,
    temperature 0.9, top-k 10 and a frequency penalty. The first emitted token is compared
    with the target's processed softmax at that position; the second, on the steps that
    kept the first proposal d0, with the softmax one position on (its penalty counting
    d0), for each d0 kept at least 300 times. Pearson's chi-squared test, p > 1e-3, fixed
    seeds. Proposals are point masses (prompt lookup's case: the likeliest token, the
    second, and one top-k removes) or draws from a distribution q half the target's, half
    unrelated (a draft model's)."""
    V, prompt = 12, [1, 4, 2, 7, 3]
    model = build_model(small_config(vocab_size=V, init_std=0.3), seed=1).eval()
    params = SamplingParams(temperature=0.9, top_k=10, frequency_penalty=0.4, max_tokens=8)
    spec = Speculator(NGRAM, Sampler("cpu", seed=5), 64, 512)
    req, ref = Request("r", prompt, params, 0.0), Sampler("cpu")

    @torch.no_grad()
    def target(context, drafts):
        logits = model(torch.tensor([context])).logits[0, -1 - len(drafts):].float()
        return ref.warp(ref.penalize_rows(logits, req, drafts),
                        [params] * (1 + len(drafts))).softmax(-1)[-1].double()

    p0 = target(prompt, [])
    order = p0.argsort(descending=True).tolist()
    guesses = [order[0], order[1], order[-1]]  # order[-1]: outside the top 10, p = 0
    g = torch.Generator().manual_seed(11)
    other = torch.softmax(2 * torch.randn(2, V, generator=torch.Generator().manual_seed(2)), -1)
    q = torch.stack([0.5 * p0.float() + 0.5 * other[0], other[1]])
    firsts = torch.zeros(V, dtype=torch.float64)
    seconds: dict[int, torch.Tensor] = {}
    rows: dict[tuple[int, int], torch.Tensor] = {}
    with torch.no_grad():
        for t in range(TRIALS):
            if proposal == "point-mass":
                d, spec._q = [guesses[t % 3], 6], {}
            else:
                d = [int(torch.multinomial(q[j], 1, generator=g)) for j in range(2)]
                spec._q = {"r": list(q)}
            if tuple(d) not in rows:
                rows[tuple(d)] = model(torch.tensor([prompt + d])).logits[0, 4:].float()
            picks = spec.verify(rows[tuple(d)], Chunk(req, 4, 1, True, d))
            firsts[picks[0].token] += 1
            if len(picks) > 1:
                seconds.setdefault(d[0], torch.zeros(V, dtype=torch.float64))
                seconds[d[0]][picks[1].token] += 1
    assert chi_squared_p(firsts, p0) > 1e-3
    tested = [d0 for d0, counts in seconds.items() if counts.sum() >= 300]
    for d0 in tested:
        assert chi_squared_p(seconds[d0], target(prompt + [d0], [d0])) > 1e-3
    assert tested and order[-1] not in seconds  # a removed token is never kept
    assert spec.stats()[1] == 2 * TRIALS
