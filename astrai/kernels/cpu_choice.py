"""Who serves a one-row fp32 product, decided without timing anything at start-up.

One fp32 row times a weight matrix (decoding a lone request) can run on astrai's kernel or on
torch's own GEMV (MKL's sgemv on x86): both compute the same dot products to within
rounding, and which is faster depends on the CPU — on an Intel Xeon (Ice Lake) the kernel,
reading several streams at once, runs about 1.09x MKL's sgemv (30 matrices of 2304 x 768,
weights from memory), on an AMD EPYC MKL reaches about half the kernel's bandwidth. The
choice also decides whether the engine keeps a transposed copy of an fp32 LM head
(astrai/infer/runner.py). A choice made by timing at start-up would hang the numerics and
the memory of a run on how busy the machine was that second, so it is made, in this order, by

1. `ASTRAI_FP32_ONE_ROW=kernel|torch`, where set;
2. a calibration the user ran once (`astrai kernels --calibrate`: both timed, interleaved,
   median of many rounds), cached beside the kernel library it measured and trusted only for
   that build on a CPU of the same model name;
3. the rule: the kernel (never far behind, and far ahead where torch's GEMV is not MKL's).

`astrai kernels` prints the choice and where it came from.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch

from astrai.atomic import write_json_atomic
from astrai.errors import ConfigError
from astrai.jsonfile import read_json_object

CHOICES = ("kernel", "torch")
ENV = "ASTRAI_FP32_ONE_ROW"
FILE = "calibration.json"


class Choice(NamedTuple):
    server: str
    """"kernel" or "torch"."""
    source: str
    """Where it came from: "rule", "calibration" or ENV."""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; "unknown" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def one_row_fp32(build_dir: Path) -> Choice:
    """Who serves one fp32 row for the kernel library built in `build_dir` (module
    docstring). An unknown ENV value is an error a user sees, never a silent default."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced:
        if forced not in CHOICES:
            raise ConfigError(f"{ENV}={forced!r}: use one of {', '.join(CHOICES)}")
        return Choice(forced, ENV)
    cal = read_calibration(build_dir)
    if cal is not None:
        return Choice(cal["fp32_one_row"], "calibration")
    return Choice("kernel", "rule")


def read_calibration(build_dir: Path) -> dict | None:
    """The calibration stored for this build, or None when there is none or it was measured
    on another CPU model (or is unreadable: a calibration is an optimisation, never a reason
    to fail)."""
    path = build_dir / FILE
    if not path.is_file():
        return None
    try:
        cal = read_json_object(path)
    except ConfigError:  # damaged: fall back to the rule
        return None
    if cal.get("cpu") != cpu_model() or cal.get("fp32_one_row") not in CHOICES:
        return None
    return cal


def calibrate(gemv, build_dir: Path, rounds: int = 31) -> dict:
    """Time one fp32 row against 16 MB of 768 x 768 matrices (out of L2, as a model's are)
    on the kernel (`gemv`, fast_path.DecodeKernels.float_gemv's contract) and on torch,
    alternating each round; store and return the medians and the choice."""
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(768, 768, generator=g) for _ in range(7)]
    x = torch.randn(1, 768, generator=g)
    runs: dict[str, list[float]] = {"kernel": [], "torch": []}
    paths = (("kernel", lambda w: gemv(x, w, None)),
             ("torch", lambda w: torch.nn.functional.linear(x, w)))
    with torch.inference_mode():
        for r in range(rounds):
            for name, f in paths if r % 2 == 0 else paths[::-1]:
                t0 = time.perf_counter()
                for w in ws:
                    f(w)
                runs[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in runs.items()}
    cal = {"cpu": cpu_model(), "fp32_one_row": min(med, key=med.get),
           "median_us": {k: round(v * 1e6, 1) for k, v in med.items()}, "rounds": rounds,
           "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json_atomic(build_dir / FILE, cal)
    return cal
