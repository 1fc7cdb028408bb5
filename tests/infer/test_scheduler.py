"""The scheduler alone (pure Python, no model): admission, ragged and chunked prefill,
decode batching, preemption, stops and cancellation. Each step ends as the engine's does:
`postprocess` advances the requests, `output.detokenize` decides which end, `finish`
ends them."""

from __future__ import annotations

import torch

from astrai.infer import output
from astrai.infer.cache import PagePool
from astrai.infer.config import CacheConfig, SchedulerConfig
from astrai.infer.params import SamplingParams
from astrai.infer.request import Request, Status
from astrai.infer.scheduler import Scheduler


def setup(pages=16, page_size=4, rows=4, ctx=64, step_tokens=64, radix=True, watermark=0.0):
    cfg = CacheConfig(page_size=page_size, max_kv_tokens=pages * page_size, max_requests=rows,
                      radix=radix)
    pool = PagePool(cfg, n_layers=1, n_kv_heads=1, head_dim=2, max_context=ctx,
                    dtype=torch.float32, device="cpu")
    sched = Scheduler(pool, SchedulerConfig(max_step_tokens=step_tokens, watermark=watermark), ctx)
    return pool, sched


def req(i, n, max_tokens=8, stop_ids=(), base=0):
    return Request(f"r{i}", [(base + i * 31 + j) % 97 for j in range(n)],
                   SamplingParams.greedy(max_tokens), 0.0, frozenset(stop_ids))


def advance(sched, batch, tokens, now=1.0):
    """The engine's postprocess without a model: advance, then end what ends."""
    sched.postprocess(batch, tokens, now)
    for req, tok in zip(batch.sampled, tokens):
        _text, end = output.detokenize(req, tok, sched.max_context)
        if end is not None:
            sched.finish(req, end[0], now, end[1])


def run_step(sched, token=5):
    batch = sched.schedule()
    if batch is None:
        return None
    advance(sched, batch, [token] * len(batch.sampled))
    return batch


def drain(sched, limit=500):
    steps = []
    while sched.has_work() and len(steps) < limit:
        steps.append(run_step(sched))
    assert not sched.has_work()
    return steps


def test_ragged_prefill_of_mixed_lengths_in_one_step():
    _pool, s = setup()
    rs = [req(i, n) for i, n in enumerate((3, 11, 1, 7))]
    for r in rs:
        s.add(r)
    b = s.schedule()
    assert [(c.req.id, c.start, c.n, c.sample) for c in b.chunks] == [
        ("r0", 0, 3, True), ("r1", 0, 11, True), ("r2", 0, 1, True), ("r3", 0, 7, True)]
    advance(s, b, [5, 5, 5, 5])
    b2 = s.schedule()
    assert b2.is_decode and [c.start for c in b2.chunks] == [3, 11, 1, 7]


def test_chunked_prefill_and_decodes_share_the_budget():
    _pool, s = setup(step_tokens=8)
    a, long = req(0, 2), req(1, 20)
    s.add(a)
    run_step(s)  # a prefilled, now decoding
    s.add(long)
    shapes = []
    while long.num_output == 0:
        b = run_step(s)
        shapes.append([(c.req.id, c.n, c.sample) for c in b.chunks])
    # every step: a's decode first, then as much of the long prompt as the budget allows
    assert shapes == [[("r0", 1, True), ("r1", 7, False)], [("r0", 1, True), ("r1", 7, False)],
                      [("r0", 1, True), ("r1", 6, True)]]


def test_admission_respects_rows_and_pages():
    pool, s = setup(pages=6, page_size=4, rows=3)
    rs = [req(i, 9) for i in range(4)]  # 3 pages each
    for r in rs:
        s.add(r)
    b = s.schedule()
    assert [c.req.id for c in b.chunks] == ["r0", "r1"]  # the third does not fit in 6 pages
    assert pool.allocator.num_free() == 0 and len(s.waiting) == 2


def test_preemption_requeues_and_everything_completes():
    pool, s = setup(pages=6, page_size=4, rows=4, radix=True)
    rs = [req(i, 6, max_tokens=12) for i in range(3)]
    for r in rs:
        s.add(r)
    drain(s)
    assert s.num_preemptions > 0
    assert all(r.finish_reason == "length" and r.num_output == 12 for r in rs)
    assert any(r.num_preemptions for r in rs)
    pool.radix.clear()
    assert pool.allocator.num_free() == 6 and pool.req_to_token.num_free() == 4


def test_preempted_request_goes_back_to_the_front():
    _pool, s = setup(pages=4, page_size=4, rows=4, radix=False)
    a, b = req(0, 7, max_tokens=20), req(1, 7, max_tokens=20)
    s.add(a)
    s.add(b)
    s.add(req(2, 3))
    while not b.num_preemptions:
        run_step(s)
    assert s.waiting[0] is b and b.kv is None and b.num_computed == 0
    assert b.status is Status.WAITING and a.status is Status.RUNNING


def test_stops_eos_max_tokens_and_context():
    _pool, s = setup(ctx=12)
    eos = req(0, 3, stop_ids=[5])
    mx = req(1, 3, max_tokens=2)
    ctx = req(2, 9, max_tokens=100)
    for r in (eos, mx, ctx):
        s.add(r)
    drain(s)
    assert (eos.finish_reason, eos.stop_reason, eos.num_output) == ("stop", 5, 1)
    assert (mx.finish_reason, mx.num_output) == ("length", 2)
    assert (ctx.finish_reason, len(ctx.tokens)) == ("length", 12)


def test_abort_frees_kv_at_once():
    pool, s = setup(radix=False)
    a, b = req(0, 9), req(1, 5)
    s.add(a)
    s.add(b)
    run_step(s)
    used = pool.allocator.num_used()
    assert s.abort(a, 2.0) and a.finish_reason == "abort" and a.kv is None
    assert pool.allocator.num_used() == used - 3 and a not in s.running
    assert not s.abort(a, 2.0)
    c = req(2, 4)
    s.add(c)
    assert s.abort(c, 2.0) and not s.waiting


def test_prefix_hits_skip_cached_pages_and_are_counted():
    pool, s = setup(page_size=4)
    shared = list(range(40, 52))  # three pages
    r1 = Request("a", shared + [1, 2], SamplingParams.greedy(2), 0.0)
    s.add(r1)
    drain(s)
    r2 = Request("b", shared + [3], SamplingParams.greedy(2), 0.0)
    s.add(r2)
    b = s.schedule()
    assert (b.chunks[0].start, b.chunks[0].n) == (12, 1) and r2.cached_tokens == 12
    st = pool.stats()
    assert (st.prefix_query_tokens, st.prefix_hit_tokens) == (14 + 13, 12)


def test_in_batch_prefix_sharing_defers_the_twin():
    _pool, s = setup(page_size=4, step_tokens=64)
    shared = list(range(60, 72))
    a = Request("a", shared + [1], SamplingParams.greedy(3), 0.0)
    b = Request("b", shared + [2], SamplingParams.greedy(3), 0.0)
    c = Request("c", [9, 9, 9], SamplingParams.greedy(3), 0.0)
    for r in (a, b, c):
        s.add(r)
    first = s.schedule()
    assert [ch.req.id for ch in first.chunks] == ["a", "c"]  # b waits for a's pages
    advance(s, first, [5, 5])
    second = s.schedule()
    twin = next(ch for ch in second.chunks if ch.req is b)
    assert twin.start == 12 and b.cached_tokens == 12


def test_cached_prefixes_go_first_but_nobody_starves():
    from astrai.infer.scheduler import AGE_LIMIT

    _pool, s = setup(pages=64, page_size=4, rows=2, step_tokens=8)
    shared = list(range(20, 36))  # four pages
    warm = Request("warm", shared + [1], SamplingParams.greedy(1), 0.0)
    s.add(warm)
    drain(s)
    cold = Request("cold", [90] * 12, SamplingParams.greedy(1), 0.0)
    s.add(cold)
    for i in range(AGE_LIMIT + 1):
        s.add(Request(f"hit{i}", shared + [50 + i], SamplingParams.greedy(1), 0.0))
    first = s.schedule()
    assert [c.req.id for c in first.chunks] == ["hit0", "hit1"]  # hits jump the queue
    advance(s, first, [5] * len(first.sampled))
    assert cold.passed_over == 1
    # keep the rows busy with hits: cold is passed over until it has waited AGE_LIMIT rounds
    _s2_pool, s2 = setup(pages=64, page_size=4, rows=1, step_tokens=16)
    s2.add(Request("warm", shared + [1], SamplingParams.greedy(1), 0.0))
    drain(s2)
    cold2 = Request("cold", [90] * 12, SamplingParams.greedy(1), 0.0)
    s2.add(cold2)
    order = []
    for i in range(AGE_LIMIT + 3):
        s2.add(Request(f"hit{i}", shared + [50 + i], SamplingParams.greedy(1), 0.0))
    while cold2.status is Status.WAITING:
        order.append(run_step(s2).chunks[0].req.id)
    assert order == [f"hit{i}" for i in range(AGE_LIMIT)] + ["cold"]
