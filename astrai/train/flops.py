"""MFU: model FLOPs per second achieved over the device's peak.

FLOPs per token come from astrai.model.stats (PaLM convention, 6N + 12 L H D T). The peak is
either given (--peak-tflops) or measured once per process with a large matmul on the device,
so MFU on a CPU means "fraction of what this machine's matmul reaches".
"""

from __future__ import annotations

import functools
import time

import torch

from astrai.model.config import ModelConfig
from astrai.model.stats import flops_per_token


def train_flops_per_token(config: ModelConfig, seq_len: int) -> int:
    return flops_per_token(config, seq_len, training=True)


@functools.lru_cache(maxsize=8)
def measure_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32,
                       n: int = 1024, seconds: float = 0.25) -> float:
    """FLOP/s of an n x n matmul on `device` (best of repeated runs over ~`seconds`)."""
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


def mfu(tokens_per_s: float, flops_per_tok: int, peak_flops: float) -> float:
    """Model FLOPs utilisation in [0, 1]."""
    return tokens_per_s * flops_per_tok / peak_flops if peak_flops > 0 else 0.0
