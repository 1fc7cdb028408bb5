"""Build csrc/cpu/decode_gemv.cpp for the CPU found, at first use, cached like the CUDA kernels.

The code path is picked at compile time by the -m flags, which follow the CPU's flags in
/proc/cpuinfo: `avx512` (avx512f/bw/vl/dq + FMA; `-mavx512vnni` and `-mavx512bf16` too where the CPU
has avx512_vnni / avx512_bf16, for the int8 and bf16 dots) or `avx2` (avx2 + fma). ASTRAI_CPU_ISA=avx512|avx2|none
forces a path (a lower one than the CPU's, or none: the torch fallback).

A build that fails is retried one tier down (`tiers`): AVX-512 with the CPU's extensions,
AVX-512 without them (an older compiler may not know -mavx512bf16), then AVX2; torch serves
decode only when every tier fails (astrai/kernels/cpu_linear.py warns once, naming why).

torch.utils.cpp_extension builds it (`-O3`, OpenMP for at::parallel_for; ~8 s on two cores:
only torch/library.h and ATen's core headers) into `cache_root()/cpu-<isa>-<hash>/`, one
folder per hash of (source, flags, torch version), and loads it as torch ops in the
namespace `astrai_cpu_<isa>`; a cached build loads without a compiler.
ASTRAI_BUILD_KERNELS=0 never compiles (a cached build still loads). A machine without a C++
compiler, or a failed build, gives CpuKernelUnavailable.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import torch

from astrai.errors import ConfigError
from astrai.kernels.build import cache_root, csrc_dir
from astrai.kernels.cpu_choice import one_row_fp32

log = logging.getLogger("astrai.kernels")

SOURCE = "cpu/decode_gemv.cpp"
HEADERS = ("cpu/decode_layers.h", "cpu/work_share.h")
"""Files the source includes (their text is part of the build's cache key)."""
ISAS = ("avx512", "avx2")
"""Code paths, best first."""
_NEEDS = {"avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"),
          "avx2": ("avx2", "fma")}
_FLAGS = {"avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma",
                     "-mf16c"],
          "avx2": ["-mavx2", "-mfma", "-mf16c"]}
_EXTRAS = {"avx512": (("avx512_vnni", "-mavx512vnni"), ("avx512_bf16", "-mavx512bf16"))}
"""CPU flags a path uses where the CPU has them, and their -m flag."""
BASE_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast")


class CpuKernelUnavailable(RuntimeError):
    """The CPU decode kernels cannot be built or loaded here; the message says why."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The `flags` of the first processor in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def best_isa(flags: frozenset[str] | None = None) -> str | None:
    """The best code path this CPU runs, or None (not x86 with AVX2 and FMA)."""
    flags = cpu_flags() if flags is None else flags
    return next((isa for isa in ISAS if all(f in flags for f in _NEEDS[isa])), None)


def requested_isa() -> str | None:
    """ASTRAI_CPU_ISA (avx512, avx2, none), else the best path of this CPU. A path the CPU
    lacks is refused (its code would fault)."""
    want = os.environ.get("ASTRAI_CPU_ISA", "").strip().lower()
    best = best_isa()
    if not want:
        return best
    if want == "none":
        return None
    if want not in ISAS:
        raise CpuKernelUnavailable(f"ASTRAI_CPU_ISA={want}: use one of {', '.join(ISAS)} or none")
    if best is None or ISAS.index(want) < ISAS.index(best):
        raise CpuKernelUnavailable(f"ASTRAI_CPU_ISA={want}: this CPU lacks it (best: {best})")
    return want


def compile_flags(isa: str, flags: frozenset[str] | None = None) -> list[str]:
    """-O3 and the -m flags of `isa` (+ VNNI / BF16 where the CPU has them, on the avx512
    path)."""
    flags = cpu_flags() if flags is None else flags
    out = [*BASE_FLAGS, *_FLAGS[isa], f"-DASTRAI_CPU_NS=astrai_cpu_{isa}"]
    return out + [m for flag, m in _EXTRAS.get(isa, ()) if flag in flags]


def tiers(isa: str, flags: frozenset[str] | None = None) -> list[tuple[str, frozenset[str]]]:
    """The builds to try from `isa` down, best first, as (path, CPU flags its -m flags
    follow): `isa` with the CPU's extensions, `isa` without them, then each lower path."""
    flags = cpu_flags() if flags is None else flags
    out = []
    for lower in ISAS[ISAS.index(isa):]:
        extras = frozenset(f for f, _ in _EXTRAS.get(lower, ()))
        out.append((lower, flags))
        if flags & extras:
            out.append((lower, flags - extras))
    return out


def find_cxx() -> str | None:
    """The compiler cpp_extension will call ($CXX, else c++), or None when it is absent."""
    return shutil.which(os.environ.get("CXX", "c++"))


def build_dir(isa: str, flags: frozenset[str] | None = None) -> Path:
    """Cache folder of this source + flags + torch version."""
    h = hashlib.sha256((csrc_dir() / SOURCE).read_bytes())
    for extra in HEADERS:
        h.update((csrc_dir() / extra).read_bytes())
    h.update(repr((compile_flags(isa, flags), torch.__version__)).encode())
    return cache_root() / f"cpu-{isa}-{h.hexdigest()[:16]}"


def lib_name(isa: str, flags: frozenset[str] | None = None) -> str:
    """The library's name: the path and its extensions (astrai_cpu_avx512_vnni_bf16). One
    name per set of flags, so a retry without the extensions is a build of its own name."""
    flags = cpu_flags() if flags is None else flags
    return "_".join([f"astrai_cpu_{isa}", *(f.split("_")[1] for f, _ in _EXTRAS.get(isa, ())
                                             if f in flags)])


def library_path(isa: str, flags: frozenset[str] | None = None) -> Path:
    """Where the `isa` build for `flags` (default this CPU's) lies once built."""
    return build_dir(isa, flags) / f"{lib_name(isa, flags)}.so"


def first_error(text: str) -> str:
    """The compiler's first error line in a build failure's text (else its first line), for
    a one-line log."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hit = next((ln for ln in lines if "error:" in ln), lines[0] if lines else "unknown error")
    return hit[:300]


@functools.cache
def load(isa: str, flags: frozenset[str] | None = None) -> object:
    """Build (or reuse) and load the `isa` variant (its -m flags following `flags`, default
    this CPU's); returns its op namespace (torch.ops.astrai_cpu_<isa>). A cached build loads
    without a compiler; with ASTRAI_BUILD_KERNELS=0 nothing is compiled. Raises
    CpuKernelUnavailable."""
    if isa not in ISAS:
        raise CpuKernelUnavailable(f"unknown CPU code path {isa!r}")
    src = csrc_dir() / SOURCE
    if not src.is_file():
        raise CpuKernelUnavailable(f"{src}: source missing")
    out, name, lib = build_dir(isa, flags), lib_name(isa, flags), library_path(isa, flags)
    if lib.is_file():
        torch.ops.load_library(str(lib))
        return getattr(torch.ops, f"astrai_cpu_{isa}")
    if os.environ.get("ASTRAI_BUILD_KERNELS", "1") == "0":
        raise CpuKernelUnavailable("not built yet, and ASTRAI_BUILD_KERNELS=0")
    if find_cxx() is None:
        raise CpuKernelUnavailable("no C++ compiler (set CXX or install g++)")
    from torch.utils import cpp_extension

    out.mkdir(parents=True, exist_ok=True)
    log.info("building astrai's CPU decode kernels (%s, first use; cached in %s)", isa, out)
    start = time.perf_counter()
    try:
        cpp_extension.load(name=name, sources=[str(src)],
                           extra_cflags=compile_flags(isa, flags), extra_ldflags=["-fopenmp"],
                           build_directory=str(out), is_python_module=False, verbose=False)
    except Exception as e:  # a compiler or linker error, ninja missing, ...
        raise CpuKernelUnavailable(f"building {src.name} for {isa} failed: "
                                   f"{first_error(str(e))}") from e
    log.info("built the CPU decode kernels in %.1f s", time.perf_counter() - start)
    return getattr(torch.ops, f"astrai_cpu_{isa}")


def load_first(isa: str) -> tuple[str, frozenset[str], list[str]]:
    """Load the first of `tiers(isa)` that builds (or is cached): (its path, the CPU flags its
    -m flags follow, one line per tier that failed before it). Raises CpuKernelUnavailable
    naming every tier's failure when none does."""
    failures: list[str] = []
    reasons: set[str] = set()
    for tier, flags in tiers(isa):
        try:
            load(tier, flags)
            return tier, flags, failures
        except CpuKernelUnavailable as e:
            failures.append(f"{lib_name(tier, flags)}: {e}")
            reasons.add(str(e))
    # one reason for every tier (no compiler, ASTRAI_BUILD_KERNELS=0) is said once
    raise CpuKernelUnavailable(reasons.pop() if len(reasons) == 1 else "; ".join(failures))


def cpu_status(build: bool = False) -> dict:
    """The CPU decode kernels here, for `astrai kernels`: the code path, the library (built
    or not), and why they cannot be had; with `build`, built first, a failed tier retried
    one down (never raises)."""
    out = {"isa": None, "vnni": "avx512_vnni" in cpu_flags(),
           "bf16": "avx512_bf16" in cpu_flags(), "compiler": find_cxx(), "library": None,
           "built": False, "reason": None, "fp32_one_row": None}
    try:
        isa = requested_isa()
        if isa is None:
            raise CpuKernelUnavailable("this CPU has no AVX2+FMA (or ASTRAI_CPU_ISA=none): "
                                       "torch serves decode")
        flags, failures = cpu_flags(), []
        if build:
            isa, flags, failures = load_first(isa)
        out["isa"] = isa  # the extensions the build uses (none after a retry without them)
        out["vnni"] = isa == "avx512" and "avx512_vnni" in flags
        out["bf16"] = isa == "avx512" and "avx512_bf16" in flags
        lib = library_path(isa, flags)
        out["library"] = str(lib)
        out["built"] = lib.is_file()
        choice = one_row_fp32(build_dir(isa, flags))
        out["fp32_one_row"] = f"{choice.server} ({choice.source})"
        if failures:
            out["reason"] = "fell back to " + lib_name(isa, flags) + ": " + "; ".join(failures)
        elif not out["built"]:
            out["reason"] = "not built yet: the engine builds it on first use on a CPU " \
                            "(or `astrai kernels --build`)"
    except (CpuKernelUnavailable, ConfigError) as e:
        out["reason"] = str(e)
    return out
