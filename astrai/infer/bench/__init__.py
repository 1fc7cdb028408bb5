"""Serving benchmark (`astrai serve-bench`): workloads, arrivals, metrics and the driver.

Metric names and definitions follow vLLM's and SGLang's serving benchmarks (see
`metrics.py` and docs/serve-bench.md).
"""

from astrai.infer.bench.arrivals import arrival_offsets, parse_rate
from astrai.infer.bench.config import BenchConfig
from astrai.infer.bench.metrics import (
    RequestRecord,
    compute_metrics,
    parse_slos,
    peak_concurrency,
    summarize,
    vllm_peaks,
)
from astrai.infer.bench.serve import BenchReport, BenchRun, load_target, serve_bench
from astrai.infer.bench.workloads import (
    BenchRequest,
    jsonl_workload,
    parse_range,
    random_workload,
    shared_prefix_workload,
)

__all__ = [
    "BenchConfig", "BenchReport", "BenchRequest", "BenchRun", "RequestRecord",
    "arrival_offsets", "compute_metrics", "jsonl_workload", "load_target", "parse_range",
    "parse_rate", "parse_slos", "peak_concurrency", "random_workload", "serve_bench",
    "shared_prefix_workload", "summarize", "vllm_peaks",
]
