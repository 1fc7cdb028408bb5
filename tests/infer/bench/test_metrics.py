"""Serving metrics on synthetic timestamps, against values computed by hand."""

import math

import pytest

from astrai.errors import ConfigError
from astrai.infer.bench.metrics import (
    RequestRecord,
    compute_metrics,
    meets_slos,
    parse_slos,
    peak_concurrency,
    summarize,
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
