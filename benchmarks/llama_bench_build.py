"""llama.cpp's own `llama-bench` and `llama-batched-bench`, built once from source, cached.

The source is the llama.cpp that llama-cpp-python's sdist vendors (the same llama.cpp the
installed llama-cpp-python wraps, so the tokens and perplexity taken through the Python
binding and the speed taken through llama-bench come from one version). Built with the CPU
backend only (`-DGGML_NATIVE=ON`: the instruction sets of the machine it runs on, as a
user building llama.cpp for their own CPU gets; no CUDA, no curl), targets `llama-bench`
and `llama-batched-bench` (several sequences at once), `-j 2`, into ~/.cache/astrai/llama.cpp-<llama-cpp-python version>/.

    python benchmarks/llama_bench_build.py         # prints the binaries' paths
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
TARGETS = ("llama-bench", "llama-batched-bench")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF",
               "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DLLAMA_CURL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF")


def cache_dir(version: str = LLAMA_CPP_PYTHON) -> Path:
    return Path.home() / ".cache" / "astrai" / f"llama.cpp-{version}"


def _source(root: Path, version: str) -> Path:
    """The vendored llama.cpp of llama-cpp-python's sdist, downloaded and unpacked once."""
    src = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    sdist = root / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                        "--no-deps", f"llama-cpp-python=={version}", "-d", str(root)],
                       check=True, capture_output=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(root, filter="data")
    return src


def llama_tools(version: str = LLAMA_CPP_PYTHON) -> dict[str, Path]:
    """{target: path} of the built tools (building what is missing: minutes at -j 2)."""
    root = cache_dir(version)
    build = root / "build"
    paths = {t: build / "bin" / t for t in TARGETS}
    if all(p.is_file() and os.access(p, os.X_OK) for p in paths.values()):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    src = _source(root, version)
    log = root / "build.log"
    with log.open("w") as out:
        for cmd in (["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                    ["cmake", "--build", str(build), "--target", *TARGETS, "-j", "2"]):
            r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"building llama.cpp's tools failed ({' '.join(cmd[:3])}"
                                   f"...); see {log}")
    return paths


if __name__ == "__main__":
    print("\n".join(str(p) for p in llama_tools().values()))
