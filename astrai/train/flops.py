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
from typing import NamedTuple

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


class DeviceSpec(NamedTuple):
    """A GPU's vendor-datasheet ceilings: dense bf16 tensor-core TFLOP/s (without the
    structured-sparsity doubling the datasheets print beside it) and HBM bandwidth in GB/s."""

    name: str
    bf16_tflops: float
    hbm_gbs: float
    source: str


# Matched against torch.cuda.get_device_name() in order, first hit wins (so the PCIe / NVL
# parts come before the plain names that are substrings of theirs). Figures from the vendor
# datasheets named in `source`; "dense" = the sparsity figure halved.
DEVICE_SPECS: tuple[tuple[str, DeviceSpec], ...] = (
    ("H200 NVL", DeviceSpec("H200 NVL", 835.0, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet")),
    ("H200", DeviceSpec("H200 SXM", 989.5, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet")),
    ("H100 NVL", DeviceSpec("H100 NVL", 835.0, 3900.0, "NVIDIA H100 Tensor Core GPU datasheet")),
    ("H100 PCIe", DeviceSpec("H100 PCIe", 756.5, 2000.0,
                             "NVIDIA H100 Tensor Core GPU datasheet")),
    ("H100", DeviceSpec("H100 SXM", 989.5, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet")),
    ("A100-SXM4-40GB", DeviceSpec("A100 SXM 40GB", 312.0, 1555.0,
                                  "NVIDIA A100 Tensor Core GPU datasheet")),
    ("A100-PCIE-40GB", DeviceSpec("A100 PCIe 40GB", 312.0, 1555.0,
                                  "NVIDIA A100 Tensor Core GPU datasheet")),
    ("A100 80GB PCIe", DeviceSpec("A100 PCIe 80GB", 312.0, 1935.0,
                                  "NVIDIA A100 Tensor Core GPU datasheet")),
    ("A100", DeviceSpec("A100 SXM 80GB", 312.0, 2039.0, "NVIDIA A100 Tensor Core GPU datasheet")),
)


def device_spec(device_name: str) -> DeviceSpec | None:
    """The datasheet ceilings of a GPU named as torch.cuda.get_device_name() names it (e.g.
    'NVIDIA H100 80GB HBM3', 'NVIDIA H200', 'NVIDIA A100-SXM4-80GB'); None when unknown."""
    for key, spec in DEVICE_SPECS:
        if key.lower() in device_name.lower():
            return spec
    return None
