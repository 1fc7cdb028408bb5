"""CPU intra-op threads: a fixed count, or `auto` (the faster of one thread and all, measured).

On an idle machine all cores win. On a CPU shared with other work, OpenMP threads that wait at
every parallel region for a descheduled sibling can make all-core runs several times slower
than one thread (measured on a busy 2-core machine: serve-bench 55 against 400 output tok/s,
training 766 against 1,140 tok/s). `auto` times a probe at each candidate count and keeps the
faster, so a command adapts to the machine it finds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Literal

import torch

from astrai.errors import ConfigError

Threads = int | Literal["auto"] | None
"""None: leave torch's default (all cores); N: exactly N; 'auto': measured."""


def parse_threads(value: str | int | None, field: str = "--threads") -> Threads:
    """'auto', a positive integer (as text or int), or None; anything else is a ConfigError."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1:
        raise ConfigError(f"{field} {value}: give a positive number of threads or 'auto'")
    return n


def fastest_threads(probe: Callable[[], float], candidates: tuple[int, ...] | None = None
                    ) -> tuple[int, float]:
    """(threads, seconds) of the candidate count whose `probe()` (seconds of a representative
    piece of work) is smallest; default candidates: the current count and 1. The thread count
    is left as it was found."""
    current = torch.get_num_threads()
    candidates = candidates or tuple(dict.fromkeys((current, 1)))
    times = {}
    try:
        for n in candidates:
            torch.set_num_threads(n)
            times[n] = probe()
    finally:
        torch.set_num_threads(current)
    best = min(times, key=times.get)
    return best, times[best]


def probe_seconds(repeats: int = 5) -> float:
    """Median seconds of a small fixed workload shaped like a small model's step: matmuls of a
    few sizes with elementwise work between them, many short parallel regions (where a
    descheduled thread costs the most)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=gen)
    w = [torch.randn(512, 512, generator=gen) / 23, torch.randn(512, 2048, generator=gen) / 23,
         torch.randn(2048, 512, generator=gen) / 45]

    def work() -> None:
        h = x
        for _ in range(8):
            h = torch.nn.functional.silu((h @ w[0]) @ w[1]) @ w[2]
            h = h / (h.norm(dim=-1, keepdim=True) + 1e-6)

    work()  # warm-up: allocations, thread pool start
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def apply_threads(threads: Threads, probe: Callable[[], float] = probe_seconds) -> int:
    """Set torch's intra-op thread count as asked and return it (None: unchanged; 'auto':
    the faster of the current count and 1 by `probe`). A fixed count is also exported as
    OMP_NUM_THREADS, so worker processes a launcher spawns use it too; with 'auto' they keep
    the launcher's split of the cores."""
    if threads == "auto":
        threads, _ = fastest_threads(probe)
    elif threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
