"""What the kernels look like on this machine: CUDA sources, compiler, targets, device,
library; and the CPU decode kernels' code path and library.

`kernel_status()` inspects without building; `kernel_status(build=True)` builds (or reuses) the
library first. `astrai kernels` renders the result.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from astrai.kernels import build as _build
from astrai.kernels import cpu_build as _cpu_build
from astrai.kernels import library as _lib

OPS = {
    "paged_decode": ("fp16, bf16, fp32", "32, 64, 128"),
    "paged_prefill": ("fp16, bf16", "32, 64, 128"),
    "rotary_": ("fp16, bf16, fp32", "any even"),
}
"""Each op's kernel coverage (dtypes, head dims); anything else runs the torch reference."""


@dataclass
class KernelStatus:
    """The kernels' state here; `ready` says whether CUDA tensors will run them."""

    sources: str
    """Folder of the CUDA sources."""
    sources_found: bool
    """All of csrc/'s translation units are there."""
    nvcc: str | None
    """Path of nvcc, None when absent."""
    nvcc_version: str | None
    """e.g. "13.0"."""
    archs: list[str]
    """Requested targets (ASTRAI_CUDA_ARCHS or the default)."""
    cuda_available: bool
    """torch sees a CUDA device."""
    device: str | None
    """Name and compute capability of device 0."""
    library: str | None
    """The library used (or that a build would produce)."""
    built: bool
    """The library file exists."""
    built_archs: list[str]
    """Targets the existing library holds machine code for."""
    ready: bool
    """Built, loadable, a CUDA device present and covered by the targets."""
    reasons: list[str] = field(default_factory=list)
    """Why not ready (no nvcc / no CUDA device / build error / ...)."""
    build_seconds: float | None = None
    """Wall time of the build this call made, if any."""
    ops: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(OPS))
    """Kernel coverage per op (dtypes, head dims)."""
    cpu: dict = field(default_factory=dict)
    """The CPU decode kernels (astrai.kernels.cpu_build.cpu_status)."""

    def to_dict(self) -> dict:
        return asdict(self)


def _device() -> tuple[str | None, str | None]:
    if not torch.cuda.is_available():
        return None, None
    major, minor = torch.cuda.get_device_capability(0)
    return f"{torch.cuda.get_device_name(0)} (sm_{major}{minor})", f"{major}{minor}"


def _covers(built: list[str], cap: str) -> bool:
    # Machine code runs on the same major version at an equal or higher minor; PTX of the newest
    # target (always embedded) compiles for anything newer.
    nums = [a.rstrip("af") for a in built]
    return any(a[:-1] == cap[:-1] and int(a) <= int(cap) for a in nums) or (
        bool(nums) and int(cap) >= max(int(a) for a in nums))


def kernel_status(build: bool = False, force: bool = False,
                  archs: list[str] | None = None) -> KernelStatus:
    """Inspect (and with `build`, build) the kernels. Never raises for a missing toolchain."""
    reasons: list[str] = []
    root = _build.csrc_dir()
    found = all((root / s).is_file() for s in _build.SOURCES)
    if not found:
        reasons.append(f"CUDA sources not found in {root} (an installed wheel ships none)")
    nvcc = _build.find_nvcc()
    version = _build.nvcc_version(nvcc) if nvcc else None
    try:
        archs = archs or _build.requested_archs()
    except ValueError as e:
        reasons.append(str(e))
        archs = []
    device, cap = _device()
    env_lib = os.environ.get("ASTRAI_KERNELS_LIB")
    lib_path: Path | None = Path(env_lib) if env_lib else None
    seconds = None
    if lib_path is None and nvcc and archs and found:
        if build:
            try:
                res = _build.build(archs, force=force, nvcc=nvcc)
                seconds = 0.0 if res.cached else res.seconds
            except _build.KernelBuildError as e:
                reasons.append(f"build error: {e}")
        lib_path = _build.library_path(archs, nvcc)
    if nvcc is None and lib_path is None:
        reasons.append("no nvcc: install the CUDA toolkit, or set ASTRAI_KERNELS_LIB to a built "
                       "library")
    built = bool(lib_path and lib_path.is_file())
    built_archs: list[str] = []
    if built:
        meta = lib_path.parent / "build.json"
        built_archs = json.loads(meta.read_text())["archs"] if meta.is_file() else ["?"]
    elif nvcc and found and archs:
        reasons.append("not built yet: `astrai kernels --build` (or first use on a GPU builds it)")
    if device is None:
        reasons.append("no CUDA device: the ops run their torch references")
    loadable = False
    if built and device is not None:
        try:
            _lib.load_library(str(lib_path))
            loadable = True
        except OSError as e:
            reasons.append(f"cannot load {lib_path}: {e}")
        if loadable and "?" not in built_archs and not _covers(built_archs, cap):
            reasons.append(f"the library has no code for sm_{cap}: set ASTRAI_CUDA_ARCHS={cap}")
            loadable = False
    return KernelStatus(
        sources=str(root), sources_found=found, nvcc=nvcc, nvcc_version=version, archs=archs,
        cuda_available=device is not None, device=device,
        library=str(lib_path) if lib_path else None, built=built, built_archs=built_archs,
        ready=loadable, reasons=reasons, build_seconds=seconds,
        cpu=_cpu_build.cpu_status(build=build))
