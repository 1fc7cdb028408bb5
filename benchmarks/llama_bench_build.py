"""llama.cpp's own `llama-bench` and `llama-batched-bench`, built once from source, cached.

The source is the llama.cpp that llama-cpp-python's sdist vendors (the same llama.cpp the
installed llama-cpp-python wraps, so the tokens and perplexity taken through the Python
binding and the speed taken through llama-bench come from one version). Built with the CPU
backend only, no CUDA, no curl, targets `llama-bench` and `llama-batched-bench` (several
sequences at once), `-j 2`, into ~/.cache/astrai/llama.cpp-<llama-cpp-python version>/, for
one of two instruction paths:

- `native` (`-DGGML_NATIVE=ON`, into build/): the instruction sets of the machine it runs
  on, as a user building llama.cpp for their own CPU gets;
- `avx2` (`-DGGML_NATIVE=OFF` with AVX, AVX2, FMA, F16C and BMI2 on and AVX-512 off, into
  build-avx2/): the code a CPU without AVX-512 runs (an AMD Zen 3, most desktop Intels),
  so an AVX-512 machine can set it beside astrai's AVX2 build (`ASTRAI_CPU_ISA=avx2`).

    python benchmarks/llama_bench_build.py [native|avx2]   # prints the binaries' paths

The quality columns read bits per byte and greedy tokens through the Python binding of the
same llama.cpp; `llama_binding()` installs llama-cpp-python from the same sdist where it is
missing (the library only, portable, as .ci/run builds it: minutes the first time).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
TARGETS = ("llama-bench", "llama-batched-bench")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=OFF",
               "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DLLAMA_CURL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF")
ISA_FLAGS = {"native": ("-DGGML_NATIVE=ON",),
             "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
                      "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF")}
BUILD_DIRS = {"native": "build", "avx2": "build-avx2"}


def cache_dir(version: str = LLAMA_CPP_PYTHON) -> Path:
    return Path.home() / ".cache" / "astrai" / f"llama.cpp-{version}"


def _sdist(root: Path, version: str) -> Path:
    """llama-cpp-python's sdist, downloaded into `root` once."""
    sdist = root / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                        "--no-deps", f"llama-cpp-python=={version}", "-d", str(root)],
                       check=True, capture_output=True)
    return sdist


def _source(root: Path, version: str) -> Path:
    """The vendored llama.cpp of llama-cpp-python's sdist, downloaded and unpacked once."""
    src = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    with tarfile.open(_sdist(root, version)) as tar:
        tar.extractall(root, filter="data")
    return src


def llama_tools(version: str = LLAMA_CPP_PYTHON, isa: str = "native") -> dict[str, Path]:
    """{target: path} of the tools built for instruction path `isa` (module docstring),
    building what is missing: minutes at -j 2."""
    root = cache_dir(version)
    build = root / BUILD_DIRS[isa]
    paths = {t: build / "bin" / t for t in TARGETS}
    if all(p.is_file() and os.access(p, os.X_OK) for p in paths.values()):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    src = _source(root, version)
    log = root / f"{BUILD_DIRS[isa]}.log"
    with log.open("w") as out:
        for cmd in (["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS,
                     *ISA_FLAGS[isa]],
                    ["cmake", "--build", str(build), "--target", *TARGETS, "-j", "2"]):
            r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"building llama.cpp's tools failed ({' '.join(cmd[:3])}"
                                   f"...); see {log}")
    return paths


BINDING_CMAKE_ARGS = ("-DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF "
                      "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF "
                      "-DGGML_OPENMP=OFF")
"""The binding's build (.ci/run's): the library alone, portable, no OpenMP."""


def llama_binding(version: str = LLAMA_CPP_PYTHON) -> str | None:
    """Install llama-cpp-python `version` from the cached sdist where none is installed;
    None when that version is there, else a line to print: another version found (used as
    it is, never replaced), or why the install failed (the quality columns then say
    BROKEN)."""
    try:
        have = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        have = None
    if have is not None:
        return None if have == version else (
            f"llama-cpp-python {have} is installed, not {version}: the quality columns use it")
    root = cache_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    sdist = _sdist(root, version)
    constraints = Path(__file__).resolve().parent.parent / "constraints.txt"
    log = root / "binding.log"
    env = {**os.environ, "CMAKE_ARGS": BINDING_CMAKE_ARGS,
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    with log.open("w") as out:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", str(sdist),
                            "-c", str(constraints)],
                           stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if r.returncode != 0:
        return f"installing llama-cpp-python {version} failed (pip exited {r.returncode}); see {log}"
    return None


if __name__ == "__main__":
    isa = sys.argv[1] if len(sys.argv) > 1 else "native"
    if isa not in ISA_FLAGS:
        print(f"llama_bench_build.py: unknown instruction path {isa!r}: use "
              f"{' or '.join(ISA_FLAGS)}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(str(p) for p in llama_tools(isa=isa).values()))
