"""The benchmark driver against a scripted engine and a fake clock: send times, concurrency
slots, records and pool sampling are exact."""

from types import SimpleNamespace

import pytest

from astrai.infer.bench.metrics import compute_metrics
from astrai.infer.bench.runner import drive
from astrai.infer.bench.workloads import BenchRequest
from astrai.infer.params import SamplingParams


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, dt):
        self.t += dt


class ScriptedEngine:
    """Each step takes 1 s (or `durations[i]` s for step i) and gives every running request
    one token; a request finishes after max_tokens tokens, or is aborted after `abort_after`
    tokens."""

    def __init__(self, clock, abort_after=None, durations=None):
        self.clock = clock
        self.durations = list(durations or [])
        self.running = {}
        self.on_step = None
        self.abort_after = abort_after
        self.pool = SimpleNamespace(prefix_query_tokens=0, prefix_hit_tokens=0,
                                    stats=lambda: SimpleNamespace(
                                        utilization=len(self.running) / 4))
        self.scheduler = SimpleNamespace(num_preemptions=0)

    def add_request(self, ids, params, request_id):
        self.running[request_id] = SimpleNamespace(params=params, times=[])
        self.pool.prefix_query_tokens += len(ids)
        self.pool.prefix_hit_tokens += 1
        return request_id

    def has_unfinished(self):
        return bool(self.running)

    def abort(self, rid):
        self.running.pop(rid, None)

    def step(self):
        dt = self.durations.pop(0) if self.durations else 1.0
        self.clock.t += dt
        now = self.clock.t
        outs = []
        for rid, r in list(self.running.items()):
            r.times.append(now)
            done = len(r.times) >= r.params.max_tokens
            reason = "length"
            if not done and self.abort_after is not None and len(r.times) >= self.abort_after:
                done, reason = True, "abort"
            metrics = SimpleNamespace(token_times=r.times, finished_time=now if done else None)
            outs.append(SimpleNamespace(request_id=rid, finished=done, metrics=metrics,
                                        finish_reason=reason if done else None))
        if self.on_step is not None:
            self.on_step(SimpleNamespace(duration=dt))  # utilization sampled after the step
        for o in outs:
            if o.finished:
                del self.running[o.request_id]
        return outs


REQS = [BenchRequest((1, 2), 2), BenchRequest((3, 4, 5), 3), BenchRequest((6,), 1)]
OFFSETS = [0.0, 0.0, 5.0]


def params(i, r):
    return SamplingParams(max_tokens=r.output_len)


def run(max_concurrency=None, **kw):
    clock = Clock()
    eng = ScriptedEngine(clock, **kw)
    seen = []
    res = drive(eng, REQS, OFFSETS, params, max_concurrency=max_concurrency,
                progress=lambda d, n: seen.append((d, n)), clock=clock, sleep=clock.sleep)
    return res, seen, eng


def test_unlimited_concurrency_sends_on_arrival_and_waits_for_late_ones():
    res, seen, eng = run()
    r0, r1, r2 = res.records
    assert (r0.start, r0.token_times, r0.end) == (0.0, [1.0, 2.0], 2.0)
    assert (r1.start, r1.token_times, r1.end) == (0.0, [1.0, 2.0, 3.0], 3.0)
    # Idle from 3 to 5: the driver sleeps until the third arrival.
    assert (r2.start, r2.token_times, r2.end) == (5.0, [6.0], 6.0)
    assert res.duration == 6.0
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert not eng.running
    m = compute_metrics(res.records, res.duration)
    assert m["peak_concurrency"] == 2
    assert m["mean_ttft_ms"] == pytest.approx(1000)


def test_max_concurrency_delays_the_send_until_a_slot_frees():
    res, _, _ = run(max_concurrency=1)
    r0, r1, r2 = res.records
    assert (r0.start, r0.end) == (0.0, 2.0)
    # Arrived at 0 but its slot freed at 2: TTFT counts from 2, as vLLM's client does.
    assert (r1.start, r1.token_times, r1.end) == (2.0, [3.0, 4.0, 5.0], 5.0)
    assert (r2.start, r2.end) == (5.0, 6.0)
    assert compute_metrics(res.records, res.duration)["peak_concurrency"] == 1


def test_pool_sampling_and_engine_counters():
    res, _, _ = run()
    # Running after steps 1..4 (sampled before finished requests leave): 2, 2, 1, 1 of 4.
    assert res.num_steps == 4
    assert res.kv_utilization_peak == pytest.approx(0.5)
    assert res.kv_utilization_mean == pytest.approx((0.5 + 0.5 + 0.25 + 0.25) / 4)
    assert res.engine["prefix_cache_query_tokens"] == 6
    assert res.engine["prefix_cache_hit_rate"] == pytest.approx(3 / 6)
    assert res.engine["num_preemptions"] == 0


def test_kv_utilization_mean_is_weighted_by_step_duration():
    """Steps of 1, 3, 0.5 and 2 s: utilization 0.5, 0.5, 0.25 (then idle until the third
    arrival at 5 s), 0.25. Weighted by duration the mean is
    (0.5*1 + 0.5*3 + 0.25*0.5 + 0.25*2) / 6.5 = 21/52; a plain mean of the steps would
    say 0.375, which is the pool's state for less of the run's time."""
    res, _, _ = run(durations=[1.0, 3.0, 0.5, 2.0])
    assert [r.end for r in res.records] == [4.0, 4.5, 7.0]
    assert res.num_steps == 4
    assert res.kv_utilization_mean == pytest.approx(21 / 52)
    assert res.kv_utilization_peak == pytest.approx(0.5)


def test_aborted_requests_are_failures():
    res, _, _ = run(abort_after=2)
    assert [r.success for r in res.records] == [True, False, True]
    m = compute_metrics(res.records, res.duration)
    assert m["completed"] == 2 and m["failed"] == 1
