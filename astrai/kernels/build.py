"""Build csrc/ into a shared library with nvcc, cached by source hash and target architectures.

The kernels are plain CUDA C++ with `extern "C"` launchers (see csrc/common.cuh for why), so the
build needs nvcc and nothing of torch: `nvcc -shared -Xcompiler -fPIC` per source, linked into
`libastrai_kernels.so`, loaded with ctypes by `astrai.kernels.library`.

* Ahead of time: `python -m astrai.kernels.build` (or `astrai kernels --build`); needs nvcc, not a
  GPU. Just in time: on first use of a kernel when CUDA is present, unless ASTRAI_BUILD_KERNELS=0.
* Targets: ASTRAI_CUDA_ARCHS (e.g. "80;90", "8.0,9.0", "sm_90a"), default sm_80 and sm_90, plus
  PTX of the newest for GPUs after it. The attention kernels need sm_80 or newer (bf16 WMMA).
* Cache: ASTRAI_KERNELS_CACHE, else $XDG_CACHE_HOME/astrai/kernels, else ~/.cache/astrai/kernels;
  one folder per hash of (sources, archs, flags, nvcc version). A finished library is renamed
  into place, so an interrupted build never leaves a library that looks complete.
* `build_host_emulation()` compiles the same sources with a host C++ compiler against
  csrc/emu/cuda_emu.h: the CPU tests run the real kernel code through it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("rotary.cu", "paged_decode.cu", "paged_prefill.cu", "paged_prefill_mma.cu")
"""The translation units of csrc/, each a set of kernels with its `extern "C"` launcher."""
LIB_NAME = "libastrai_kernels.so"
DEFAULT_ARCHS = ("80", "90")
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-lineinfo", "--expt-relaxed-constexpr",
              "--threads", "0")  # --threads 0: the targets of one file compile in parallel


class KernelBuildError(RuntimeError):
    """nvcc (or the host compiler) failed; `log` holds its output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass
class BuildResult:
    """A built library and how it was made."""

    path: Path
    """The shared library."""
    archs: list[str]
    """Compute capabilities with machine code in it (e.g. ["80", "90"])."""
    seconds: float = 0.0
    """Wall time of the build; 0 when it came from the cache."""
    cached: bool = False
    """True when an earlier build was reused."""
    log: str = field(default="", repr=False)
    """Compiler output (warnings)."""


def csrc_dir() -> Path:
    """Folder of the CUDA sources: ASTRAI_CSRC, else csrc/ at the repository root."""
    env = os.environ.get("ASTRAI_CSRC")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "csrc"


def source_files(root: Path | None = None) -> list[Path]:
    """Every file the build reads (sources and headers), sorted, for hashing."""
    root = root or csrc_dir()
    return sorted(p for p in root.rglob("*") if p.suffix in {".cu", ".cuh", ".h"})


def parse_archs(spec: str | None, source: str = "ASTRAI_CUDA_ARCHS") -> list[str]:
    """"80;90" / "8.0,9.0" / "sm_80 sm_90a" -> ["80", "90"] (default sm_80, sm_90)."""
    if not spec or not spec.strip():
        return list(DEFAULT_ARCHS)
    out = []
    for tok in re.split(r"[;,\s]+", spec.strip()):
        tok = tok.lower().removeprefix("sm_").removeprefix("compute_")
        m = re.fullmatch(r"(\d+)\.?(\d)([af]?)", tok)
        if not m:
            raise ValueError(f"{source}: cannot read {tok!r}; write e.g. '80;90' or '9.0'")
        arch = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        if int(arch.rstrip("af")) < 80:
            raise ValueError(f"{source}: sm_{arch} is too old; the kernels need sm_80+")
        if arch not in out:
            out.append(arch)
    return out


def requested_archs() -> list[str]:
    """Targets from ASTRAI_CUDA_ARCHS or the default."""
    return parse_archs(os.environ.get("ASTRAI_CUDA_ARCHS"))


def find_nvcc() -> str | None:
    """ASTRAI_NVCC, $CUDA_HOME/bin/nvcc, nvcc on PATH, or /usr/local/cuda/bin/nvcc."""
    candidates = [os.environ.get("ASTRAI_NVCC")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def nvcc_version(nvcc: str) -> str:
    """e.g. "13.0" (the "release" field of `nvcc --version`)."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def cache_root() -> Path:
    """Where built libraries live (see the module doc)."""
    env = os.environ.get("ASTRAI_KERNELS_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "astrai" / "kernels"


def build_key(archs: list[str], compiler_version: str, extra: tuple[str, ...] = ()) -> str:
    """Hash of every source byte, the targets, the flags and the compiler version."""
    h = hashlib.sha256()
    root = csrc_dir()
    for p in source_files(root):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    h.update(repr((archs, NVCC_FLAGS, compiler_version, extra)).encode())
    return h.hexdigest()[:16]


def gencode_flags(archs: list[str]) -> list[str]:
    """Machine code for each target plus PTX of the newest, which later GPUs compile at load."""
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    newest = max(archs, key=lambda a: int(a.rstrip("af")))
    flags += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
    return flags


def library_path(archs: list[str] | None = None, nvcc: str | None = None) -> Path | None:
    """Where the library for these targets is (or would be) cached; None without nvcc."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return None
    archs = archs or requested_archs()
    return cache_root() / build_key(archs, nvcc_version(nvcc)) / LIB_NAME


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise KernelBuildError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}):\n{log}", log)
    return log


def build(archs: list[str] | None = None, force: bool = False, jobs: int | None = None,
          nvcc: str | None = None) -> BuildResult:
    """Build (or reuse) the library for `archs`. Raises KernelBuildError."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KernelBuildError("nvcc not found: install the CUDA toolkit or set ASTRAI_NVCC")
    archs = archs or requested_archs()
    root = csrc_dir()
    missing = [s for s in SOURCES if not (root / s).is_file()]
    if missing:
        raise KernelBuildError(f"CUDA sources missing in {root}: {', '.join(missing)}")
    target = cache_root() / build_key(archs, nvcc_version(nvcc)) / LIB_NAME
    if target.is_file() and not force:
        return BuildResult(target, archs, cached=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        objs = [Path(tmp) / (Path(s).stem + ".o") for s in SOURCES]
        base = [nvcc, *NVCC_FLAGS, *gencode_flags(archs), f"-I{root}"]
        cmds = [base + ["-c", str(root / s), "-o", str(o)] for s, o in zip(SOURCES, objs)]
        with ThreadPoolExecutor(max_workers=jobs or min(len(cmds), os.cpu_count() or 1)) as pool:
            logs = list(pool.map(_run, cmds))
        tmp_lib = Path(tmp) / LIB_NAME
        logs.append(_run([nvcc, "-shared", *gencode_flags(archs), *map(str, objs), "-o",
                          str(tmp_lib)]))
        os.replace(tmp_lib, target)
    (target.parent / "build.json").write_text(json.dumps(
        {"archs": archs, "nvcc": nvcc, "nvcc_version": nvcc_version(nvcc), "sources": SOURCES}))
    return BuildResult(target, archs, time.perf_counter() - start, log="".join(logs))


def find_host_compiler() -> str | None:
    """A C++20 compiler for the host emulation (ASTRAI_CXX, else g++ or clang++)."""
    for c in (os.environ.get("ASTRAI_CXX"), shutil.which("g++"), shutil.which("clang++")):
        if c:
            return c
    return None


def cuda_include_dir(nvcc: str | None = None) -> Path | None:
    """The toolkit's include folder (for cuda_fp16.h / cuda_bf16.h in the emulation)."""
    nvcc = nvcc or find_nvcc()
    cands = [Path(nvcc).resolve().parent.parent / "include"] if nvcc else []
    cands.append(Path("/usr/local/cuda/include"))
    for c in cands:
        if (c / "cuda_bf16.h").is_file():
            return c
    return None


def build_host_emulation(force: bool = False) -> Path:
    """Compile csrc/ for the CPU under csrc/emu/cuda_emu.h (tests only; slow, no GPU needed)."""
    cxx, inc = find_host_compiler(), cuda_include_dir()
    if cxx is None or inc is None:
        raise KernelBuildError("host emulation needs a C++20 compiler and the CUDA headers")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             check=False).stdout[:80]
    target = cache_root() / ("emu-" + build_key(["emu"], version)) / "libastrai_kernels_emu.so"
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    root = csrc_dir()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        tmp_lib = Path(tmp) / target.name
        # -fno-strict-aliasing: CUDA code reinterprets 16-byte words as element vectors.
        _run([cxx, "-std=c++20", "-O2", "-fno-strict-aliasing", "-shared", "-fPIC",
              "-DASTRAI_EMU", "-x", "c++", f"-I{root}", f"-I{inc}",
              *(str(root / s) for s in SOURCES), "-o", str(tmp_lib)])
        os.replace(tmp_lib, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m astrai.kernels.build`: build ahead of time and print the library's path."""
    ap = argparse.ArgumentParser(prog="python -m astrai.kernels.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", help="targets, e.g. '80;90' (default: ASTRAI_CUDA_ARCHS or 80;90)")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--emulation", action="store_true", help="build the CPU emulation instead")
    args = ap.parse_args(argv)
    try:
        if args.emulation:
            print(build_host_emulation(force=args.force))
            return 0
        res = build(parse_archs(args.archs) if args.archs else None, force=args.force)
    except (KernelBuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    how = "cached" if res.cached else f"built in {res.seconds:.1f} s"
    print(f"{res.path}  (sm_{', sm_'.join(res.archs)}; {how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
