"""Allocator, radix cache and page pool: reference counts, LRU eviction, no leaks."""

from __future__ import annotations

import random

import pytest
import torch

from astrai.infer.cache import KVHandle, PageAllocator, PagePool, RadixCache, build_kv_cache
from astrai.infer.config import CacheConfig


def make_pool(mode="paged", page_size=4, tokens=64, rows=4, ctx=32, radix=True):
    cfg = CacheConfig(mode=mode, page_size=page_size, max_kv_tokens=tokens, max_requests=rows,
                      radix=radix)
    return PagePool(cfg, n_layers=2, n_kv_heads=2, head_dim=4, max_context=ctx,
                    dtype=torch.float32, device="cpu")


def test_allocator_refcounts():
    a = PageAllocator(4, 2)
    p = a.alloc(3)
    assert a.num_free() == 1 and a.alloc(2) is None and a.num_free() == 1  # all or nothing
    a.incref(p[:1])
    a.decref(p)
    assert a.num_free() == 3 and a.ref[p[0]] == 1
    a.decref(p[:1])
    assert a.num_free() == 4 and a.ref == [0, 0, 0, 0]
    with pytest.raises(RuntimeError):
        a.decref([0])


def test_allocator_cached_pages_are_evictable_only_when_unused():
    a = PageAllocator(2, 2)
    (p,) = a.alloc(1)
    a.mark_cached(p)
    assert a.ref[p] == 2 and a.num_evictable() == 0
    a.decref([p])  # the request lets go: only the cache holds it
    assert a.num_evictable() == 1 and a.num_free() == 1
    a.incref([p])  # a new request locks it
    assert a.num_evictable() == 0
    a.decref([p])
    a.uncache(p)
    assert a.num_free() == 2 and a.num_evictable() == 0 and not a.cached[p]


def test_radix_match_is_page_aligned_and_prefix_exact():
    a = PageAllocator(8, 2)
    r = RadixCache(a, 2)
    pages = a.alloc(3)
    assert r.insert([1, 2, 3, 4, 5, 6, 7], pages) == 3  # 7 tokens -> 3 complete pages
    a.decref(pages)
    assert r.match([1, 2, 3, 4, 5, 6, 7, 8]) == pages
    assert r.match([1, 2, 3, 4, 5]) == pages[:2]  # only whole pages
    assert r.match([1, 2, 9, 4]) == pages[:1]
    # same tokens under another parent are not a hit: edges keep the prefix context
    assert r.match([3, 4, 5, 6]) == []
    # a duplicate insert keeps the cached page and takes no new reference
    dup = a.alloc(2)
    assert r.insert([1, 2, 3, 4], dup) == 0 and a.ref[dup[0]] == 1
    a.decref(dup)


def test_radix_evicts_least_recently_used_leaves_first():
    a = PageAllocator(8, 1)
    r = RadixCache(a, 1)
    seqs = {"A": [1, 2, 3], "B": [1, 5], "C": [7]}
    held = {}
    for name, toks in seqs.items():
        pages = r.match(toks)
        fresh = a.alloc(len(toks) - len(pages))
        a.incref(pages)
        r.insert(toks, pages + fresh)
        held[name] = pages + fresh
    for pages in held.values():
        a.decref(pages)
    assert a.num_evictable() == 5 and r.num_nodes == 5
    r.match([7])  # C is now the most recent; A's leaf [3] is the oldest
    order = []
    while r.num_nodes:
        before = {n.page for n in r._leaves()}
        r.evict(1)
        after = {n.page for n in r._leaves()} if r.num_nodes else set()
        order.append((before - after) or before)
    # A's tail (3), A's middle (2), then B's leaf (5), the shared root page (1), C (7)
    assert [held["A"][2]] == list(order[0])
    assert [held["A"][1]] == list(order[1])
    assert a.num_free() == 8


def test_radix_never_evicts_pages_in_use():
    a = PageAllocator(4, 1)
    r = RadixCache(a, 1)
    pages = a.alloc(3)
    r.insert([1, 2, 3], pages)  # the request still holds them
    assert r.evict(3) == 0 and a.num_free() == 1
    a.decref(pages)
    assert r.evict(3) == 3 and a.num_free() == 4


def test_pool_open_reserve_close_paged():
    pool = make_pool()
    h = pool.open([1, 2, 3, 4, 5, 6])
    assert h.cached_len == 0 and pool.reserve(h, 6) and len(h.pages) == 2
    slots = pool.req_to_token.table[h.row, :6].tolist()
    P = pool.page_size
    assert slots == [h.pages[p // P] * P + p % P for p in range(6)]
    pool.close(h, [1, 2, 3, 4, 5, 6])  # one complete page goes to the cache
    assert pool.stats().cached_pages == 1 and pool.allocator.num_free() == 15
    h2 = pool.open([1, 2, 3, 4, 9, 9])
    assert h2.cached_len == 4 and pool.req_to_token.table[h2.row, :4].tolist() == slots[:4]
    pool.close(h2)


def test_pool_open_leaves_the_last_token_to_compute():
    pool = make_pool()
    h = pool.open(list(range(8)))
    pool.reserve(h, 8)
    pool.close(h, list(range(8)))
    h2 = pool.open(list(range(8)))  # fully cached prompt: still recompute its last page
    assert h2.cached_len == 4
    pool.close(h2)


def test_pool_contiguous_is_linear():
    pool = make_pool(mode="contiguous", rows=3, ctx=16)
    assert pool.page_size == 16 and pool.radix is None
    h = pool.open([1, 2])
    assert pool.reserve(h, 16) and not pool.reserve(h, 17)
    assert pool.req_to_token.table[h.row].tolist() == list(range(h.row * 16, h.row * 16 + 16))
    hs = [pool.open([1]) for _ in range(2)]
    assert pool.open([1]) is None  # rows exhausted
    for x in [h, *hs]:
        pool.close(x)
    assert pool.allocator.num_free() == 3


def test_pool_property_random_streams_never_leak():
    rng = random.Random(0)
    pool = make_pool(page_size=2, tokens=40, rows=5, ctx=16)
    live: list[tuple[KVHandle, list[int]]] = []
    for _ in range(600):
        if live and (rng.random() < 0.35 or len(live) == 5):
            h, toks = live.pop(rng.randrange(len(live)))
            pool.close(h, toks[: rng.randint(0, len(toks))])
            continue
        toks = [rng.randint(0, 3) for _ in range(rng.randint(1, 12))]  # collide often
        h = pool.open(toks)
        if h is None:
            continue
        if pool.reserve(h, len(toks)):
            live.append((h, toks))
            if rng.random() < 0.5:
                pool.cache(h, toks)
        else:
            pool.close(h)
        # invariant: every page's count equals its holders
        holders = [0] * pool.num_pages
        for hh, _ in live:
            for p in hh.pages:
                holders[p] += 1
        for p in range(pool.num_pages):
            assert pool.allocator.ref[p] == holders[p] + pool.allocator.cached[p]
    for h, toks in live:
        pool.close(h, toks)
    pool.radix.clear()
    a = pool.allocator
    assert a.num_free() == a.num_pages and all(r == 0 for r in a.ref)
    assert pool.req_to_token.num_free() == 5


def test_build_kv_cache_fields():
    pool = make_pool(page_size=4, tokens=64, rows=4, ctx=32)
    hs = [pool.open([0] * n) for n in (5, 9)]
    for h, n in zip(hs, (5, 9)):
        pool.reserve(h, n)
    st = pool.storage
    rec = build_kv_cache(st.k, st.v, pool.req_to_token.table, [h.row for h in hs],
                         prefix_lens=[3, 0], qo_lens=[2, 9], page_size=4)
    t = pool.req_to_token.table
    assert rec.seq_lens.tolist() == [5, 9] and rec.qo_indptr.tolist() == [0, 2, 11]
    assert rec.kv_indptr.tolist() == [0, 5, 14] and not rec.is_decode
    assert rec.kv_indices.tolist() == t[hs[0].row, :5].tolist() + t[hs[1].row, :9].tolist()
    assert rec.positions.tolist() == [3, 4] + list(range(9))
    assert rec.out_cache_loc.tolist() == t[hs[0].row, 3:5].tolist() + t[hs[1].row, :9].tolist()
    assert rec.kv_indices.dtype == torch.int32 and rec.out_cache_loc.dtype == torch.int64
    # the host-side builder (page lists known) gives the same record
    rec2 = build_kv_cache(st.k, st.v, pool.req_to_token.table, [h.row for h in hs],
                          prefix_lens=[3, 0], qo_lens=[2, 9], page_size=4,
                          pages=[h.pages for h in hs])
    for f in ("req_pool_indices", "seq_lens", "qo_indptr", "kv_indptr", "kv_indices",
              "out_cache_loc", "positions"):
        a, b = getattr(rec, f), getattr(rec2, f)
        assert a.dtype == b.dtype and torch.equal(a, b), f


def test_cache_and_scheduler_configs_refuse_bad_values_in_one_line():
    from astrai.errors import ConfigError
    from astrai.infer.config import CacheConfig, SchedulerConfig

    with pytest.raises(ConfigError, match=r"^cache: page_size: .*greater than or equal to 1"):
        CacheConfig.from_dict({"page_size": 0})
    with pytest.raises(ConfigError, match=r"^cache: mode: "):
        CacheConfig.from_dict({"mode": "ring"})
    with pytest.raises(ConfigError, match=r"^scheduler: watermark: .*less than 1"):
        SchedulerConfig.from_dict({"watermark": 1.0})
    with pytest.raises(ConfigError, match=r"^scheduler: max_step_tokens: expected a number"):
        SchedulerConfig.from_dict({"max_step_tokens": True})
    with pytest.raises(ConfigError, match="max_context=64 exceeds the model's max_seq_len=32"):
        CacheConfig(max_context=64).check(32)
