"""Attention backends against plain causal attention, and backend selection."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from astrai.errors import ConfigError
from astrai.infer.backends import (
    BackendChain,
    BackendUnsupported,
    TorchNativeBackend,
    attn_backend,
    backend_status,
    requested_backend,
    select_backend,
)
from astrai.infer.backends.flash import FlashAttnBackend
from astrai.infer.cache import build_kv_cache
from astrai.model.context import ForwardContext


def reference_attention(q, k, v, window=None):
    """q [T, H, D] at the last T of the S positions of k, v [S, K, D]: naive softmax."""
    T, H, D = q.shape
    S, K = k.shape[0], k.shape[1]
    k = k.repeat_interleave(H // K, dim=1)
    v = v.repeat_interleave(H // K, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
    i = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    mask = j <= i
    if window is not None:
        mask &= j > i - window
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def make_step(prefix_lens, qo_lens, page_size, H=4, K=2, D=8, L=2, seed=0, host_pages=False,
              consecutive=False):
    """A pool with shuffled pages holding random prefix K/V, and the step's new q/k/v."""
    g = torch.Generator().manual_seed(seed)
    seq = [p + q for p, q in zip(prefix_lens, qo_lens)]
    C = max(seq) + page_size
    n_pages = sum(-(-s // page_size) for s in seq) + 3
    perm = torch.randperm(n_pages, generator=g).tolist()
    if consecutive:
        perm = list(range(n_pages))[::-1]  # pages 0, 1, 2, ... in position order
    kb = torch.randn(L, n_pages * page_size, K, D, generator=g)
    vb = torch.randn(L, n_pages * page_size, K, D, generator=g)
    table = torch.zeros(len(seq) + 1, C, dtype=torch.int32)
    rows = [len(seq) - b for b in range(len(seq))]  # rows out of order on purpose
    pages = [[] for _ in seq]
    for b, s in enumerate(seq):
        for pos in range(s):
            if pos % page_size == 0:
                pages[b].append(perm.pop())
            table[rows[b], pos] = pages[b][-1] * page_size + pos % page_size
    rec = build_kv_cache(kb, vb, table, rows, prefix_lens, qo_lens, page_size,
                         pages if host_pages else None)
    N = sum(qo_lens)
    q = torch.randn(1, N, H, D, generator=g)
    k = torch.randn(1, N, K, D, generator=g)
    v = torch.randn(1, N, K, D, generator=g)
    return rec, q, k, v


def check_backend(backend, rec, q, k, v, layer=1, window=None, atol=1e-5):
    kb0, vb0 = rec.k_buf.clone(), rec.v_buf.clone()
    ctx = ForwardContext(positions=rec.positions[None], cache=rec, backend=backend,
                         sliding_window=window)
    out = backend.attend(q, k, v, layer, ctx)
    assert out.shape == q.shape
    # the new k/v sit at out_cache_loc of this layer; nothing else changed
    loc = rec.out_cache_loc
    torch.testing.assert_close(rec.k_buf[layer, loc], k[0])
    torch.testing.assert_close(rec.v_buf[layer, loc], v[0])
    kb0[layer, loc], vb0[layer, loc] = k[0], v[0]
    assert torch.equal(rec.k_buf, kb0) and torch.equal(rec.v_buf, vb0)
    qo = rec.qo_indptr.tolist()
    kv = rec.kv_indptr.tolist()
    for b in range(len(qo) - 1):
        slots = rec.kv_indices[kv[b]:kv[b + 1]].long()
        ref = reference_attention(q[0, qo[b]:qo[b + 1]], rec.k_buf[layer, slots],
                                  rec.v_buf[layer, slots], window)
        torch.testing.assert_close(out[0, qo[b]:qo[b + 1]], ref, atol=atol, rtol=1e-4)


CASES = [
    ([0, 0, 0], [5, 1, 9], 4),  # fresh prompts of mixed lengths (one single-token)
    ([7, 12, 3, 30], [1, 1, 1, 1], 4),  # pure decode batch of mixed lengths
    ([7, 0, 16, 5], [1, 6, 4, 1], 4),  # mixed: decodes, a prompt, a chunk with a prefix
    ([9, 2], [1, 1], 1),  # page size 1 (token-granular)
    ([3, 40], [1, 1], 64),  # one page covers everything (the contiguous-mode shape)
    ([21], [1], 4),  # a lone decode: its positions sliced out, no mask
]


@pytest.mark.parametrize("prefix,qo,page", CASES)
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("host_pages", [False, True])
def test_torch_native_matches_causal_attention(prefix, qo, page, window, host_pages):
    rec, q, k, v = make_step(prefix, qo, page, host_pages=host_pages)
    check_backend(TorchNativeBackend(), rec, q, k, v, window=window)


@pytest.mark.parametrize("page", [4, 64])
def test_torch_native_reads_consecutive_pages_in_place(page):
    rec, q, k, v = make_step([37], [1], page, host_pages=True, consecutive=True)
    check_backend(TorchNativeBackend(), rec, q, k, v)
    assert rec.plans["torch_native"][0].first_page == 0


def test_torch_native_plan_is_shared_by_layers():
    rec, q, k, v = make_step([7, 0], [1, 6], 4)
    be = TorchNativeBackend()
    ctx = ForwardContext(cache=rec, backend=be)
    be.attend(q, k, v, 0, ctx)
    plan = rec.plans["torch_native"]
    be.attend(q, k, v, 1, ctx)
    assert rec.plans["torch_native"] is plan


def test_torch_native_without_cache_is_the_training_path():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, h, 8, generator=g) for h in (4, 2, 2))
    out = TorchNativeBackend().attend(q, k, v, 0, ForwardContext())
    for b in range(2):
        torch.testing.assert_close(out[b], reference_attention(q[b], k[b], v[b]))


def _fake_flash_attn(monkeypatch):
    """A stand-in for flash_attn with its varlen signature (bottom-right causal)."""
    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
               window_size):
        assert causal and cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        w = None if window_size[0] < 0 else window_size[0] + 1
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        return torch.cat([reference_attention(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]],
                                              v[ck[b]:ck[b + 1]], w)
                          for b in range(len(cq) - 1)])

    monkeypatch.setitem(sys.modules, "flash_attn",
                        types.SimpleNamespace(flash_attn_varlen_func=varlen))
    monkeypatch.setattr(FlashAttnBackend, "devices", ("cpu",))
    monkeypatch.setattr(FlashAttnBackend, "dtypes", (torch.float32,))


@pytest.mark.parametrize("window", [None, 4])
def test_flash_adapter_against_a_stand_in(monkeypatch, window):
    _fake_flash_attn(monkeypatch)
    rec, q, k, v = make_step([7, 0, 16], [1, 6, 4], 4)
    check_backend(FlashAttnBackend(), rec, q, k, v, window=window)


def test_flash_refuses_what_it_cannot_serve():
    rec, q, _, _ = make_step([0], [3], 4)
    be = FlashAttnBackend.__new__(FlashAttnBackend)  # no flash_attn here; only supports()
    assert "cpu" in be.supports(q, ForwardContext(cache=rec))
    assert be.supports(q, ForwardContext()) is not None


def test_selection_context_env_and_errors(monkeypatch):
    monkeypatch.delenv("ASTRAI_BACKEND", raising=False)
    assert requested_backend() is None
    with attn_backend("torch_native"):
        assert requested_backend() == "torch_native"
        assert select_backend().name == "torch_native" and select_backend().explicit
    assert requested_backend() is None
    monkeypatch.setenv("ASTRAI_BACKEND", "flash")
    assert requested_backend() == "flash"
    with attn_backend("torch_native"):  # the context manager beats the environment
        assert requested_backend() == "torch_native"
    monkeypatch.setenv("ASTRAI_BACKEND", "tpu")
    with pytest.raises(ConfigError, match="ASTRAI_BACKEND"):
        requested_backend()
    with pytest.raises(ConfigError, match="unknown attention backend"), attn_backend("nope"):
        pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectations")
def test_auto_selection_on_cpu(monkeypatch):
    monkeypatch.delenv("ASTRAI_BACKEND", raising=False)
    status = backend_status()
    assert status["torch_native"] is None
    assert status["cuda"] is not None and status["flash"] is not None  # reasons, not crashes
    chain = select_backend()
    assert [b.name for b in chain.backends] == ["torch_native"] and not chain.explicit
    with pytest.raises(ConfigError, match="'flash' is not available"):
        select_backend("flash")


class _Refuses:
    name = "picky"

    def __init__(self, how):
        self.how = how

    def supports(self, q, ctx):
        return "no thanks" if self.how == "supports" else None

    def attend(self, q, k, v, layer, ctx):
        raise BackendUnsupported("dtype")


@pytest.mark.parametrize("how", ["supports", "raises"])
def test_fall_through_unless_explicit(how):
    rec, q, k, v = make_step([3, 0], [1, 4], 4)
    ctx = ForwardContext(cache=rec)
    out = BackendChain([_Refuses(how), TorchNativeBackend()]).attend(q, k, v, 0, ctx)
    rec2, *_ = make_step([3, 0], [1, 4], 4)
    ref = TorchNativeBackend().attend(q, k, v, 0, ForwardContext(cache=rec2))
    torch.testing.assert_close(out, ref)
    with pytest.raises(ConfigError, match="'picky' cannot serve"):
        BackendChain([_Refuses(how)], explicit=True).attend(q, k, v, 0, ctx)


class _Accelerated:
    """A stand-in for an unproven accelerated backend: torch_native's attention, then
    `damage` applied to it."""

    def __init__(self, name, damage):
        from astrai.infer.backends.torch_native import TorchNativeBackend

        self.name, self.inner, self.damage = name, TorchNativeBackend(), damage

    def attend(self, q, k, v, layer, ctx):
        return self.damage(self.inner.attend(q, k, v, layer, ctx))


def _boom(out):
    raise RuntimeError("illegal memory access")


@pytest.mark.parametrize("damage, dropped", [
    (lambda out: out, False),                      # right: kept after its checks
    (lambda out: out.roll(1, dims=-2), True),      # heads swapped: a wrong kernel
    (lambda out: torch.zeros_like(out), True),     # nothing computed
    (_boom, True),                                 # a crash
])
def test_an_automatic_chain_checks_each_accelerated_backend_once(damage, dropped, caplog):
    """On its first decode call and its first prefill call an accelerated backend is
    compared with torch_native; a wrong or crashing one is dropped with one warning and the
    engine's tokens stay torch_native's."""
    import logging

    from astrai.infer import CacheConfig, Engine, SamplingParams
    from astrai.infer.backends.registry import BackendChain
    from astrai.infer.backends.torch_native import TorchNativeBackend
    from astrai.model import build_model

    from .conftest import random_prompts, small_config

    model = build_model(small_config(), seed=2).eval()
    prompts, params = random_prompts((6, 3, 9), seed=1), SamplingParams.greedy(6)
    cache = CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4)
    ref = Engine(model, None, cache, TorchNativeBackend(), kernels=None).generate(prompts, params)
    chain = BackendChain([_Accelerated("fast", damage), TorchNativeBackend()])
    with caplog.at_level(logging.WARNING, logger="astrai.infer"):
        out = Engine(model, None, cache, chain, kernels=None).generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    warned = [r for r in caplog.records if "switched off" in r.getMessage()]
    assert ("fast" in chain.dropped) is dropped and len(warned) == int(dropped)
    assert [b.name for b in chain.backends] == ["torch_native"] if dropped else ["fast",
                                                                                 "torch_native"]
    if not dropped:
        assert chain.checked == {("fast", True), ("fast", False)}
