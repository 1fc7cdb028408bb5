"""/metrics in the Prometheus text exposition format (version 0.0.4), vLLM's metric names.

Names follow vLLM's production metrics ("Production Metrics" in the vLLM docs) wherever
vLLM has one, so dashboards and alerts written for vLLM read an astrai server unchanged;
the few without a vLLM counterpart carry an `astrai:` prefix. Every sample has the label
model_name. Histogram buckets are vLLM's.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    return repr(float(v))


class ServerMetrics:
    """Counters and histograms fed as requests finish; gauges read from the engine."""

    def __init__(self, model_name: str) -> None:
        self.label = f'model_name="{_esc(model_name)}"'
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.http: dict[tuple[str, int], int] = {}

    def request_finished(self, out: Any) -> None:
        """Called by the engine loop with each request's final output."""
        m = out.metrics
        with self._lock:
            self.prompt_tokens += out.usage.prompt_tokens
            self.generation_tokens += out.usage.completion_tokens
            reason = out.finish_reason or "abort"
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if m.ttft is not None:
                self.ttft.observe(m.ttft)
            for gap in m.itl:
                self.itl.observe(gap)
            if m.e2e is not None:
                self.e2e.observe(m.e2e)

    def http_response(self, path: str, status: int) -> None:
        with self._lock:
            self.http[(path, status)] = self.http.get((path, status), 0) + 1

    def render(self, stats: Any, in_flight: int) -> str:
        """The exposition text; `stats` is Engine.stats()."""
        lines: list[str] = []
        lab = self.label

        def family(name: str, kind: str, doc: str, samples: list[tuple[str, str, float]]
                   ) -> None:
            lines.append(f"# HELP {name} {doc}")
            lines.append(f"# TYPE {name} {kind}")
            for suffix, extra, v in samples:
                labels = lab + (f",{extra}" if extra else "")
                lines.append(f"{name}{suffix}{{{labels}}} {_fmt(v)}")

        def hist(name: str, doc: str, h: Histogram) -> None:
            rows, acc = [], 0
            for le, c in zip([*h.buckets, float("inf")], h.counts):
                acc += c
                rows.append(("_bucket", f'le="{"+Inf" if le == float("inf") else le}"', acc))
            rows += [("_sum", "", h.sum), ("_count", "", h.count)]
            family(name, "histogram", doc, rows)

        pool = stats.pool
        # (name, type, help, value) of the single-sample families.
        single = [
            ("vllm:num_requests_running", "gauge", "Requests in the running batch.",
             stats.num_running),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
             stats.num_waiting),
            ("astrai:num_requests_in_flight", "gauge",
             "Engine requests admitted by the server and not yet finished.", in_flight),
            ("astrai:peak_running_requests", "gauge",
             "Most requests the engine has run in one batch since start.", stats.peak_running),
            ("vllm:kv_cache_usage_perc", "gauge",
             "Fraction of KV pages held by requests (1 = full; cache-only pages free).",
             pool.utilization),
            ("astrai:kv_pages_free", "gauge",
             "KV pages free or held only by the prefix cache (reclaimable).",
             pool.num_pages - pool.used_pages + pool.evictable_pages),
            ("astrai:kv_pages_total", "gauge", "KV pages in the pool.", pool.num_pages),
            ("vllm:prefix_cache_queries_total", "counter",
             "Prompt tokens looked up in the prefix cache.", pool.prefix_query_tokens),
            ("vllm:prefix_cache_hits_total", "counter",
             "Prompt tokens served from the prefix cache.", pool.prefix_hit_tokens),
            ("astrai:prefix_cache_hit_rate", "gauge",
             "prefix_cache_hits / prefix_cache_queries since start.", pool.prefix_hit_rate),
            ("vllm:num_preemptions_total", "counter", "Requests preempted.",
             stats.num_preemptions),
        ]
        if getattr(stats, "speculative", None) is not None:  # vLLM's spec_decode counters
            single += [
                ("vllm:spec_decode_num_drafts_total", "counter",
                 "Verify rows run (a request's proposals checked in one step).",
                 stats.spec_drafts),
                ("vllm:spec_decode_num_draft_tokens_total", "counter",
                 "Speculative tokens proposed.", stats.spec_draft_tokens),
                ("vllm:spec_decode_num_accepted_tokens_total", "counter",
                 "Speculative tokens accepted.", stats.spec_accepted_tokens)]
        with self._lock:
            single += [
                ("vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                 self.prompt_tokens),
                ("vllm:generation_tokens_total", "counter",
                 "Generated tokens of finished requests.", self.generation_tokens)]
            for name, kind, doc, value in single:
                family(name, kind, doc, [("", "", value)])
            family("astrai:decode_path_info", "gauge",
                   "How the engine's steps run (native | graphs | static | eager; eager after "
                   "a fast path failed its first-step check).",
                   [("", f'path="{_esc(stats.decode)}"', 1)])
            family("vllm:request_success_total", "counter", "Finished requests by reason.",
                   [("", f'finished_reason="{r}"', c) for r, c in sorted(self.finished.items())])
            hist("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft)
            hist("vllm:inter_token_latency_seconds", "Gaps between output tokens.", self.itl)
            hist("vllm:e2e_request_latency_seconds", "Arrival to finish.", self.e2e)
            family("astrai:http_responses_total", "counter", "HTTP responses by path and code.",
                   [("", f'path="{_esc(p)}",status="{s}"', c)
                    for (p, s), c in sorted(self.http.items())])
        return "\n".join(lines) + "\n"
