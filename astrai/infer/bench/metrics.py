"""Serving metrics with the names and definitions of vLLM's and SGLang's serving benchmarks.

Pure functions over per-request records (timestamps in seconds). Definitions
(vLLM `benchmarks/benchmark_serving.py` `calculate_metrics`, SGLang `bench_serving.py`):

- TTFT: first output token time - request send time.
- TPOT: (end-to-end latency - TTFT) / (output tokens - 1), only for requests with more than
  one output token: the mean time per token *after* the first.
- ITL: every gap between consecutive output tokens, pooled over all requests.
- E2E latency: finish time - send time.
- request / input / output / total token throughput: completed requests, their prompt
  tokens, their output tokens, and prompt + output tokens, each divided by the duration.
- goodput: completed requests meeting every SLO (TTFT, TPOT, E2E in ms), per second.
- max_concurrent_requests and max_output_tokens_per_s (vLLM's names and definitions): time
  is cut into 1-second buckets from the first successful request's send; a successful
  request counts in every bucket from its send's to its finish's, each output token in the
  bucket it arrived in; the largest bucket of each. Failed requests are left out.
- peak concurrency (astrai's own): the exact most requests in flight at once, failed ones
  included, from their [send, end] intervals; mean concurrency (SGLang "Concurrency"): sum
  of E2E latencies / duration.

Latencies are reported in milliseconds; each gets mean, median, std and percentiles
(numpy's linear interpolation, as both peers use).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from astrai.errors import ConfigError

PERCENTILES = (90, 99)
"""Percentiles reported for every latency metric (besides mean, median and std)."""
LATENCIES = ("ttft", "tpot", "itl", "e2el")
SLO_NAMES = ("ttft", "tpot", "e2el")


@dataclass
class RequestRecord:
    """What the client saw of one request (perf_counter seconds)."""

    prompt_len: int
    start: float
    """When the request was sent (after waiting for a concurrency slot)."""
    token_times: list[float] = field(default_factory=list)
    """When each output token arrived; len(token_times) is the output length."""
    end: float | None = None
    """When the request finished (its last token, or its abort)."""
    success: bool = True
    error: str = ""

    @property
    def output_len(self) -> int:
        return len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output_len - 1); None with fewer than two tokens."""
        if self.output_len < 2 or self.end is None:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)  # type: ignore[operator]

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]


def summarize(values: Sequence[float], percentiles: Iterable[float] = PERCENTILES,
              scale: float = 1000.0) -> dict[str, float | None]:
    """mean, median, std and p<q> of `values` times `scale` (seconds -> ms); None when empty."""
    qs = list(percentiles)
    keys = ["mean", "median", "std"] + [f"p{_pname(q)}" for q in qs]
    if not len(values):
        return dict.fromkeys(keys)
    a = np.asarray(values, dtype=np.float64) * scale
    out = {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std())}
    for q in qs:
        out[f"p{_pname(q)}"] = float(np.percentile(a, q))
    return out


def _pname(q: float) -> str:
    return str(int(q)) if float(q).is_integer() else str(q)


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Most intervals [start, end] open at once; one ending when another starts does not
    overlap it (its slot is free again)."""
    events = []
    for s, e in intervals:
        events.append((s, 1))
        events.append((e, -1))
    events.sort(key=lambda x: (x[0], x[1]))  # ends (-1) before starts (+1) at equal times
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def vllm_peaks(records: Sequence[RequestRecord]) -> tuple[float, int]:
    """(max_output_tokens_per_s, max_concurrent_requests) as vLLM's `calculate_metrics`
    computes them, over the successful requests in 1-second buckets."""
    ok = [r for r in records if r.success and r.end is not None]
    if not ok:
        return 0.0, 0
    t0 = min(r.start for r in ok)
    n = int(np.ceil(max(r.end for r in ok) - t0)) + 1  # type: ignore[operator]
    tokens = np.zeros(n)
    requests = np.zeros(n)
    for r in ok:
        if r.token_times:
            # vLLM rebuilds the arrival times from start + TTFT + the running sum of ITLs
            t = r.start + r.ttft  # type: ignore[operator]
            for gap in [0.0, *r.itl]:
                t += gap
                b = int(t - t0)
                if 0 <= b < n:
                    tokens[b] += 1
        first, last = int(r.start - t0), int(r.start + r.latency - t0)  # type: ignore[operator]
        requests[first:min(last, n - 1) + 1] += 1
    return float(tokens.max()), int(requests.max())


def parse_slos(spec: str | None) -> dict[str, float]:
    """'ttft:200,tpot:50' -> {'ttft': 200.0, 'tpot': 50.0} (milliseconds)."""
    if not spec:
        return {}
    out: dict[str, float] = {}
    for part in spec.replace(" ", ",").split(","):
        if not part:
            continue
        name, _, value = part.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if name not in SLO_NAMES or not ms > 0 or not math.isfinite(ms):
            raise ConfigError(f"goodput SLO '{part}': use NAME:MS with NAME one of "
                              f"{', '.join(SLO_NAMES)} and MS > 0, e.g. ttft:200,tpot:50")
        out[name] = ms
    return out


def meets_slos(rec: RequestRecord, slos: dict[str, float]) -> bool:
    """Every SLO (ms) is met; a request with one output token has TPOT 0 (as in vLLM)."""
    vals = {"ttft": rec.ttft, "tpot": rec.tpot or 0.0, "e2el": rec.latency}
    return all(vals[k] is not None and vals[k] * 1000.0 <= ms for k, ms in slos.items())


def compute_metrics(records: Sequence[RequestRecord], duration: float,
                    slos: dict[str, float] | None = None,
                    percentiles: Iterable[float] = PERCENTILES) -> dict[str, Any]:
    """The benchmark's metrics from the records of one run lasting `duration` seconds.

    Keys follow vLLM's JSON: completed, total_input_tokens, total_output_tokens,
    request_throughput, input_throughput, output_throughput, total_token_throughput,
    request_goodput (None without SLOs), {mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms,
    max_concurrent_requests, max_output_tokens_per_s (vLLM's 1-second buckets), and
    astrai's peak_concurrency, mean_concurrency, failed, duration.
    """
    if duration <= 0:
        raise ValueError("duration must be > 0")
    qs = list(percentiles)
    ok = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    series = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [g for r in ok for g in r.itl],
        "e2el": [r.latency for r in ok if r.latency is not None],
    }
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": (sum(meets_slos(r, slos) for r in ok) / duration) if slos else None,
        "input_throughput": total_in / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    for name in LATENCIES:
        for stat, v in summarize(series[name], qs).items():
            out[f"{stat}_{name}_ms"] = v
    out["max_output_tokens_per_s"], out["max_concurrent_requests"] = vllm_peaks(records)
    done = [r for r in records if r.end is not None]
    out["peak_concurrency"] = peak_concurrency((r.start, r.end) for r in done)
    out["mean_concurrency"] = sum(r.latency for r in ok if r.latency is not None) / duration
    return out
