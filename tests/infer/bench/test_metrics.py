"""Serving metrics on synthetic timestamps, against values computed by hand."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from astrai.errors import ConfigError
from astrai.infer.bench.metrics import (
    RequestRecord,
    compute_metrics,
    meets_slos,
    parse_slos,
    peak_concurrency,
    summarize,
    vllm_peaks,
)


def rec(prompt_len, start, times, end=None, success=True):
    return RequestRecord(prompt_len, start, list(times), times[-1] if end is None and times
                         else end, success)


# Three requests over a 10 s run:
#   A: prompt 10, sent 0, tokens at 1, 2, 4 (end 4)    TTFT 1, E2E 4, TPOT (4-1)/2 = 1.5
#   B: prompt 20, sent 1, tokens at 3, 3.5  (end 3.5)  TTFT 2, E2E 2.5, TPOT 0.5/1 = 0.5
#   C: prompt 30, sent 2, token at 7        (end 7)    TTFT 5, E2E 5, no TPOT (1 token)
RECORDS = [rec(10, 0.0, [1.0, 2.0, 4.0]), rec(20, 1.0, [3.0, 3.5]), rec(30, 2.0, [7.0])]


def test_per_request_definitions():
    a, b, c = RECORDS
    assert (a.ttft, a.latency, a.tpot, a.itl, a.output_len) == (1.0, 4.0, 1.5, [1.0, 2.0], 3)
    assert (b.ttft, b.latency, b.tpot, b.itl) == (2.0, 2.5, 0.5, [0.5])
    assert (c.ttft, c.latency, c.tpot, c.itl) == (5.0, 5.0, None, [])


def test_tpot_uses_latency_not_last_token():
    # vLLM: (latency - ttft) / (n - 1); a request that ends after its last token counts that.
    r = RequestRecord(5, 0.0, [1.0, 2.0], end=4.0)
    assert r.tpot == 3.0


def test_throughputs_and_counts():
    m = compute_metrics(RECORDS, duration=10.0)
    assert m["completed"] == 3 and m["failed"] == 0
    assert m["total_input_tokens"] == 60 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == pytest.approx(0.3)
    assert m["input_throughput"] == pytest.approx(6.0)
    assert m["output_throughput"] == pytest.approx(0.6)
    assert m["total_token_throughput"] == pytest.approx(6.6)
    assert m["request_goodput"] is None


def test_latency_statistics_in_ms():
    m = compute_metrics(RECORDS, duration=10.0)
    # TTFT [1, 2, 5] s: mean 8/3, median 2, numpy linear p90 = 2 + 0.8*(5-2) = 4.4,
    # p99 = 2 + 0.98*3 = 4.94; population std sqrt(((1-8/3)^2+(2-8/3)^2+(5-8/3)^2)/3).
    assert m["mean_ttft_ms"] == pytest.approx(8000 / 3)
    assert m["median_ttft_ms"] == pytest.approx(2000)
    assert m["p90_ttft_ms"] == pytest.approx(4400)
    assert m["p99_ttft_ms"] == pytest.approx(4940)
    std = math.sqrt(((1 - 8 / 3) ** 2 + (2 - 8 / 3) ** 2 + (5 - 8 / 3) ** 2) / 3)
    assert m["std_ttft_ms"] == pytest.approx(1000 * std)
    # TPOT excludes the first token and single-token requests: [1.5, 0.5].
    assert m["mean_tpot_ms"] == pytest.approx(1000)
    assert m["median_tpot_ms"] == pytest.approx(1000)
    assert m["p90_tpot_ms"] == pytest.approx(1400)  # 0.5 + 0.9 * 1.0
    # ITL pools every gap: [1, 2, 0.5] -> sorted [0.5, 1, 2]; p90 = 1 + 0.8 * 1 = 1.8.
    assert m["mean_itl_ms"] == pytest.approx(3500 / 3)
    assert m["median_itl_ms"] == pytest.approx(1000)
    assert m["p90_itl_ms"] == pytest.approx(1800)
    assert m["p99_itl_ms"] == pytest.approx(1980)
    # E2E [4, 2.5, 5]: mean 11.5/3, median 4, p99 = 4 + 0.98 * 1 = 4.98.
    assert m["mean_e2el_ms"] == pytest.approx(11500 / 3)
    assert m["median_e2el_ms"] == pytest.approx(4000)
    assert m["p99_e2el_ms"] == pytest.approx(4980)


def test_concurrency():
    m = compute_metrics(RECORDS, duration=10.0)
    # Intervals [0,4] [1,3.5] [2,7]: all three overlap on [2, 3.5].
    assert m["peak_concurrency"] == 3
    assert m["mean_concurrency"] == pytest.approx(11.5 / 10)


def test_peak_concurrency_touching_intervals_do_not_overlap():
    assert peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1
    assert peak_concurrency([(0, 2), (1, 3), (2, 4)]) == 2
    assert peak_concurrency([]) == 0


def test_failed_requests_are_excluded():
    records = RECORDS + [RequestRecord(99, 0.0, [0.5], end=0.6, success=False)]
    m = compute_metrics(records, duration=10.0)
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_input_tokens"] == 60
    assert m["median_ttft_ms"] == pytest.approx(2000)


def test_goodput_counts_requests_meeting_every_slo():
    # TTFT <= 2 s keeps A and B; TPOT <= 1 s then drops A (1.5 s); C has TPOT 0 (vLLM).
    assert compute_metrics(RECORDS, 10.0, {"ttft": 2000})["request_goodput"] == pytest.approx(0.2)
    assert compute_metrics(RECORDS, 10.0, {"ttft": 2000, "tpot": 1000}
                           )["request_goodput"] == pytest.approx(0.1)
    assert compute_metrics(RECORDS, 10.0, {"tpot": 1000})["request_goodput"] == pytest.approx(0.2)
    assert meets_slos(RECORDS[2], {"tpot": 1})
    assert not meets_slos(RECORDS[0], {"e2el": 3999})


def test_summarize_empty_and_custom_percentiles():
    assert summarize([]) == {"mean": None, "median": None, "std": None, "p90": None,
                             "p99": None}
    s = summarize([1.0, 2.0, 3.0, 4.0], percentiles=(50, 99.9), scale=1.0)
    assert s["median"] == 2.5 and s["p50"] == 2.5
    assert s["p99.9"] == pytest.approx(3.997)


def test_empty_run_has_no_latencies():
    m = compute_metrics([], duration=1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] is None and m["peak_concurrency"] == 0


def test_parse_slos():
    assert parse_slos("ttft:200,tpot:50") == {"ttft": 200.0, "tpot": 50.0}
    assert parse_slos(None) == {}
    for bad in ("ttft", "ttft:-1", "latency:3", "tpot:x"):
        with pytest.raises(ConfigError, match="goodput SLO"):
            parse_slos(bad)


def vllm_calculate_peaks(outputs):
    """vLLM benchmarks `calculate_metrics`: max_output_tokens_per_s and
    max_concurrent_requests, as written there (outputs carry start_time, ttft, itl,
    latency, success)."""
    max_output_tokens_per_s, max_concurrent_requests = 0.0, 0
    successful_outputs = [o for o in outputs if o.success]
    if successful_outputs:
        min_start_time = min(o.start_time for o in successful_outputs)
        max_end_time = max(o.start_time + o.latency for o in successful_outputs)
        duration_seconds = int(np.ceil(max_end_time - min_start_time)) + 1
        tokens_per_second = np.zeros(duration_seconds)
        concurrent_requests_per_second = np.zeros(duration_seconds)
        for o in successful_outputs:
            token_times = [o.start_time + o.ttft]
            current_time = token_times[0]
            for itl_value in o.itl:
                current_time += itl_value
                token_times.append(current_time)
            for token_time in token_times:
                second_bucket = int(token_time - min_start_time)
                if 0 <= second_bucket < duration_seconds:
                    tokens_per_second[second_bucket] += 1
            request_start_second = int(o.start_time - min_start_time)
            request_end_second = int((o.start_time + o.latency) - min_start_time)
            for second in range(request_start_second, request_end_second + 1):
                concurrent_requests_per_second[second] += 1
        max_output_tokens_per_s = float(np.max(tokens_per_second))
        max_concurrent_requests = int(np.max(concurrent_requests_per_second))
    return max_output_tokens_per_s, max_concurrent_requests


def as_vllm(r):
    return SimpleNamespace(start_time=r.start, ttft=r.ttft, itl=r.itl, latency=r.latency,
                           success=r.success)


def test_vllm_peaks_by_hand():
    # buckets from t=0: A spans seconds 0-4, B 1-3, C 2-7 -> at most 3 at once (seconds 2, 3);
    # tokens: second 1 holds A@1, second 2 holds A@2, second 3 holds B@3 and B@3.5.
    m = compute_metrics(RECORDS, duration=10.0)
    assert m["max_concurrent_requests"] == 3 and m["max_output_tokens_per_s"] == 2.0
    # one long request and many short ones in other seconds: vLLM's count is per bucket,
    # astrai's peak is exact
    recs = [rec(1, 0.0, [0.5, 3.9]), rec(1, 1.1, [1.2]), rec(1, 1.5, [1.6])]
    m = compute_metrics(recs, duration=4.0)
    assert m["peak_concurrency"] == 2 and m["max_concurrent_requests"] == 3


def test_vllm_peaks_equal_vllm_loop_and_ignore_failures():
    rng = np.random.default_rng(0)
    recs = []
    for i in range(60):
        start = float(rng.uniform(0, 20))
        times = list(start + np.cumsum(rng.exponential(0.07, size=int(rng.integers(1, 40)))))
        recs.append(rec(int(rng.integers(1, 50)), start, times, success=bool(i % 7)))
    m = compute_metrics(recs, duration=30.0)
    want = vllm_calculate_peaks([as_vllm(r) for r in recs])
    assert (m["max_output_tokens_per_s"], m["max_concurrent_requests"]) == want
    assert vllm_peaks([r for r in recs if not r.success]) == (0.0, 0)
    # failed requests count in astrai's exact peak but not in vLLM's buckets
    failed = [rec(1, 0.0, [0.1], success=False) for _ in range(5)]
    m = compute_metrics([rec(1, 0.0, [0.2]), *failed], duration=1.0)
    assert m["max_concurrent_requests"] == 1 and m["peak_concurrency"] == 6
