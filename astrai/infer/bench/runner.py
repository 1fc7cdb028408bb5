"""Drive an Engine with a timed stream of requests and measure what a client would see.

One loop plays client and server: requests are submitted when their arrival time has come
(and a concurrency slot is free), and the engine is stepped while it has work. A request
that arrives during a step is only seen after it, exactly as a serving engine's loop would;
its send time is still its arrival time (or the moment its slot freed), so that wait counts
in its TTFT, as it does for vLLM's client.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from astrai.infer.bench.metrics import RequestRecord
from astrai.infer.bench.workloads import BenchRequest
from astrai.infer.params import SamplingParams

Progress = Callable[[int, int], None]
"""progress(done, total): a measured request finished."""


@dataclass
class DriveResult:
    records: list[RequestRecord]
    duration: float
    """Seconds from the first send to the last finish."""
    kv_utilization_mean: float
    """KV pool utilization after each step, weighted by the step's duration."""
    kv_utilization_peak: float
    num_steps: int
    engine: dict[str, Any] = field(default_factory=dict)
    """Engine counters over the run: prefix hits, preemptions, speculative proposals."""


def _finished(rec: RequestRecord, out: Any, clock: Callable[[], float]) -> RequestRecord:
    """A request's record completed from its final output."""
    m = out.metrics
    rec.token_times = list(m.token_times)
    rec.end = m.finished_time if m.finished_time is not None else clock()
    rec.success = out.finish_reason != "abort"
    if not rec.success:
        rec.error = f"finished with reason {out.finish_reason}"
    return rec


def drive(engine: Any, requests: Sequence[BenchRequest], offsets: Sequence[float],
          params: Callable[[int, BenchRequest], SamplingParams], *,
          max_concurrency: int | None = None, progress: Progress | None = None,
          clock: Callable[[], float] = time.perf_counter,
          sleep: Callable[[float], None] = time.sleep,
          lora: Callable[[int], str | None] | None = None) -> DriveResult:
    """Submit request i at offsets[i] seconds after the start (under LoRA adapter
    `lora(i)` when given); step until all finish."""
    n = len(requests)
    pool = engine.pool
    q0, h0 = pool.prefix_query_tokens, pool.prefix_hit_tokens
    p0 = engine.scheduler.num_preemptions
    spec = getattr(engine, "speculator", None)
    s0 = spec.stats() if spec is not None else (0, 0, 0)
    util = {"sum": 0.0, "time": 0.0, "peak": 0.0, "steps": 0}

    def on_step(info: Any) -> None:
        u = pool.stats().utilization
        util["sum"] += u * info.duration
        util["time"] += info.duration
        util["peak"] = max(util["peak"], u)
        util["steps"] += 1

    records: list[RequestRecord | None] = [None] * n
    inflight: dict[str, int] = {}
    t0 = clock()
    # Free concurrency slots, as the times they became free (a heap); None: unlimited.
    slots: list[float] | None = [t0] * max_concurrency if max_concurrency else None
    nxt = done = 0
    prev_hook, engine.on_step = engine.on_step, on_step
    try:
        while nxt < n or inflight:
            now = clock()
            while nxt < n and t0 + offsets[nxt] <= now and (slots is None or slots):
                send = t0 + offsets[nxt]
                if slots is not None:
                    send = max(send, heapq.heappop(slots))
                req = requests[nxt]
                kw = {} if lora is None else {"lora": lora(nxt)}
                rid = engine.add_request(list(req.prompt_ids), params(nxt, req),
                                         request_id=f"bench-{nxt}", **kw)
                inflight[rid] = nxt
                records[nxt] = RequestRecord(req.prompt_len, send)
                nxt += 1
            if not engine.has_unfinished():
                if inflight:
                    raise RuntimeError(f"the engine lost requests {sorted(inflight)}")
                if nxt < n:
                    sleep(max(0.0, t0 + offsets[nxt] - clock()))
                continue
            for out in engine.step():
                i = inflight.pop(out.request_id, None) if out.finished else None
                if i is None:
                    continue
                rec = _finished(records[i], out, clock)
                if slots is not None:
                    heapq.heappush(slots, rec.end)
                done += 1
                if progress is not None:
                    progress(done, n)
        duration = clock() - t0
    finally:
        engine.on_step = prev_hook
        for rid in inflight:  # an error mid-run: leave the engine clean
            engine.abort(rid)
    queried = pool.prefix_query_tokens - q0
    hits = pool.prefix_hit_tokens - h0
    counters = {"prefix_cache_hit_rate": hits / queried if queried else 0.0,
                "prefix_cache_hit_tokens": hits, "prefix_cache_query_tokens": queried,
                "num_preemptions": engine.scheduler.num_preemptions - p0,
                **spec_counters(spec, s0)}
    return DriveResult(
        records=[r for r in records if r is not None], duration=duration,
        kv_utilization_mean=util["sum"] / util["time"] if util["time"] else 0.0,
        kv_utilization_peak=util["peak"], num_steps=util["steps"],
        engine=counters,
    )


def spec_counters(spec: Any, before: tuple[int, int, int]) -> dict[str, Any]:
    """Speculative decoding over the run: verify rows, tokens proposed and kept ({} when
    the engine does not speculate)."""
    if spec is None:
        return {}
    drafts, proposed, kept = (b - a for a, b in zip(before, spec.stats()))
    return {"spec_drafts": drafts, "spec_draft_tokens": proposed, "spec_accepted_tokens": kept,
            "spec_acceptance_rate": kept / proposed if proposed else 0.0}


def warm_up(engine: Any, requests: Sequence[BenchRequest]) -> None:
    """Run unmeasured requests to completion (first-call allocations, lazy imports)."""
    if requests:
        engine.generate([list(r.prompt_ids) for r in requests],
                        [SamplingParams(max_tokens=r.output_len, temperature=0.0,
                                        ignore_eos=True) for r in requests])
