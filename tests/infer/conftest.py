"""Shared fixtures: a small, deliberately sharp random model and a no-cache reference.

init_std=0.2 makes logits peaked and strongly context-dependent (top-1/top-2 gaps of
1e-3 or more, versus fp32 noise around 1e-6), so greedy token equality is a sharp test of
the cache: a wrong slot, position or mask changes the tokens."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from astrai.data.assets import tiny_corpus_path
from astrai.data.testing import tiny_tokenizer
from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.hf_export import export_hf

VOCAB = 256


def small_config(**kw):
    base = {"vocab_size": VOCAB, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                "ffn_dim": 128, "max_seq_len": 256, "init_std": 0.2}
    return get_preset("tiny", **{**base, **kw})


@pytest.fixture(scope="session")
def model():
    return build_model(small_config(), seed=0).eval()


@pytest.fixture(scope="session")
def window_model():
    return build_model(small_config(sliding_window=8), seed=1).eval()


def random_prompts(lengths, seed=0, vocab=VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def naive_greedy(model, prompt, n):
    """Greedy decoding by full recomputation: no cache at all."""
    ids, out = list(prompt), []
    for _ in range(n):
        t = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(t)
        ids.append(t)
    return out


@torch.no_grad()
def naive_logprobs(model, prompt, output):
    """Raw-model log-probabilities of `output` after `prompt`, by one full forward."""
    ids = torch.tensor([list(prompt) + list(output)])
    logp = model(ids).logits[0].float().log_softmax(-1)
    P = len(prompt)
    return [float(logp[P - 1 + i, t]) for i, t in enumerate(output)]


def paged_engine(model, decode="auto", page_size=4, tokens=1024, rows=8, radix=True,
                 max_context=None, speculative=None, kv_dtype=None):
    cache = CacheConfig(page_size=page_size, max_kv_tokens=tokens, max_requests=rows,
                        radix=radix, max_context=max_context, dtype=kv_dtype)
    return Engine(model, None, cache, scheduler_config=SchedulerConfig(max_step_tokens=2048),
                  decode=decode, speculative=speculative)


def assert_same_outputs(a, b, atol=1e-4):
    """Equal tokens; log-probabilities within `atol`."""
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=atol, rtol=0)


def assert_equals_full_recompute(model, decode, new=10):
    """Six requests of mixed lengths decoded in `decode` mode give the tokens and
    log-probabilities of recomputing every sequence from scratch; returns the engine."""
    prompts = random_prompts((5, 17, 33, 1, 40, 9), seed=4)
    eng = paged_engine(model, decode)
    outs = eng.generate(prompts, SamplingParams.greedy(new, logprobs=True))
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(model, p, new)
        torch.testing.assert_close(o.logprobs, naive_logprobs(model, p, o.token_ids),
                                   atol=1e-4, rtol=0)
    return eng


EAGER_CASES = {"radix": {}, "preemption": {"tokens": 64, "max_context": 64},
               "page-size-1": {"page_size": 1}, "many-rows": {"rows": 40}}


def assert_equals_the_eager_path(model, decode, case, new=10):
    """One of EAGER_CASES decoded in `decode` mode and eagerly: the same outputs, and the
    case's own condition met (pages shared, requests preempted); returns the engine."""
    kw = EAGER_CASES[case]
    lengths = tuple(range(1, 34)) if case == "many-rows" else (5, 17, 33, 1, 40, 9)
    prompts = random_prompts(lengths, seed=5)
    if case == "radix":  # shared prefixes: pages come from the cache
        prompts = [prompts[2][:20] + p for p in prompts]
    params = SamplingParams.greedy(new, logprobs=True)
    eng = paged_engine(model, decode, **kw)
    assert_same_outputs(eng.generate(prompts, params),
                        paged_engine(model, "eager", **kw).generate(prompts, params))
    if case == "preemption":
        assert eng.stats().num_preemptions > 0
    if case == "radix":
        assert eng.stats().pool.prefix_hit_rate > 0
    return eng


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and on a shared 2-core machine
    two OpenMP threads per process spin against other processes (25x slower measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, HF export, corpus ids): 160 AdamW steps on the corpus' first 1024 tokens,
    enough to memorise them, so the greedy continuations have well-separated logits."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512)
    ids = torch.tensor(tok.encode(tiny_corpus_path().read_text())[:1024])
    cfg = get_preset("tiny", vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     head_dim=16, ffn_dim=128, max_seq_len=64)
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(160):
        starts = torch.randint(0, len(ids) - 65, (8,), generator=g)
        b = torch.stack([ids[s:s + 65] for s in starts])  # (8, 65)
        logits = model(b[:, :-1]).logits
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    root = tmp_path_factory.mktemp("q")
    ckpt = save_checkpoint(root / "ckpt", model.eval(), cfg, tokenizer_dir=tok.path)
    export_hf(ckpt, root / "hf")
    held = root / "held.jsonl"
    held.write_text("".join(json.dumps({"text": tok.decode(ids[a:a + 200].tolist())}) + "\n"
                            for a in (0, 300, 600)))
    yield ckpt, root / "hf", held, ids
    torch.set_num_threads(n)
