"""MFU: model FLOPs per second achieved over the device's peak.

FLOPs per token come from astrai.model.stats (PaLM convention, 6N + 12 L H D T). The peak is
either given (--peak-tflops) or measured with a large matmul on the device at the thread count
in use, so MFU on a CPU means "fraction of what this machine's matmul reaches". On a machine
shared with other work the moment of measurement may be slow; a step that then appears to beat
the peak has the peak measured again (`DevicePeak`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from astrai.model.config import ModelConfig
from astrai.model.stats import flops_per_token


def train_flops_per_token(config: ModelConfig, seq_len: int) -> int:
    return flops_per_token(config, seq_len, training=True)


def measure_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32,
                       n: int = 1024, seconds: float = 0.25) -> float:
    """FLOP/s of an n x n matmul on `device` (best of repeated runs over ~`seconds`), at the
    current intra-op thread count; cached per process for each set of arguments."""
    return _timed_matmul(device, dtype, n, seconds, torch.get_num_threads())


@functools.lru_cache(maxsize=16)
def _timed_matmul(device: str, dtype: torch.dtype, n: int, seconds: float,
                  threads: int) -> float:
    return time_matmul(device, dtype, n, seconds)


def time_matmul(device: str = "cpu", dtype: torch.dtype = torch.float32,
                n: int = 1024, seconds: float = 0.25) -> float:
    """FLOP/s of an n x n matmul on `device`, best of repeated runs over ~`seconds`."""
    dev = torch.device(device)
    a = torch.randn(n, n, device=dev, dtype=dtype, generator=None)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


class DevicePeak:
    """The peak FLOP/s MFU divides by: `flops`, given or measured, and `measure` to take it
    again (None for a given peak, which is never re-measured).

    A measured peak that a step's achieved FLOP/s exceeds was taken at a slow moment (other
    work on the machine): it is measured again, at most `remeasure` times per run, and the
    larger value kept. An MFU above 1 then survives only if a fresh measurement is still
    slower than the model's own step, which points at a wrong FLOP count, not at load.
    """

    def __init__(self, flops: float, measure: Callable[[], float] | None = None,
                 remeasure: int = 3) -> None:
        self.flops, self.measure = flops, measure
        self.remeasures_left = remeasure if measure is not None else 0

    def mfu(self, achieved_flops: float) -> float:
        """achieved / peak, measuring the peak again first when achieved exceeds it."""
        while achieved_flops > self.flops and self.remeasures_left > 0:
            self.remeasures_left -= 1
            self.flops = max(self.flops, self.measure())
        return achieved_flops / self.flops if self.flops > 0 else 0.0
