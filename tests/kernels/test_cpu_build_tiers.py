"""Every code path of csrc/cpu/decode_gemv.cpp compiles, whatever CPU runs the suite: an
object build (-O0: the intrinsics' target checks run, the optimiser does not) with the path's
-m flags as astrai/kernels/cpu_build.py picks them for a CPU that has it, every extension the
path lacks masked off (-mno-...) — AVX-512 without VNNI (Skylake-SP/X), AVX-512 with VNNI,
with VNNI and BF16, and AVX2. Then the tiers: a build that fails is retried one tier down,
and the fallback is one warning on the `astrai.kernels` logger (the CLI shows warnings). The
code paths this CPU runs are tested at run time in test_cpu_gemv.py; none (torch) there and
in tests/infer/test_cpu_decode_kernels.py."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest

from astrai.kernels import cpu_build, cpu_linear
from astrai.kernels.build import csrc_dir

AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"})
CPUS = {"avx512": AVX512, "avx512-vnni": AVX512 | {"avx512_vnni"},
        "avx512-vnni-bf16": AVX512 | {"avx512_vnni", "avx512_bf16"},
        "avx2": frozenset({"avx2", "fma"})}
"""A CPU's /proc/cpuinfo flags per tier."""
MASKS = ("-mno-avx512vnni", "-mno-avx512bf16", "-mno-avx512f", "-mno-avx512bw",
         "-mno-avx512vl", "-mno-avx512dq")
CXX = cpu_build.find_cxx()
needs_cxx = pytest.mark.skipif(CXX is None or cpu_build.cpu_flags().isdisjoint({"sse2"}),
                               reason="needs an x86 machine with a C++ compiler")


def tier_command(tier: str, out: str) -> list[str]:
    """The compiler call for `tier`: its flags, -O0 for -O3, the flags it lacks masked."""
    from torch.utils import cpp_extension

    isa = tier.split("-")[0]
    flags = ["-O0" if f == "-O3" else f for f in cpu_build.compile_flags(isa, CPUS[tier])]
    masks = [m for m in MASKS if m.replace("-mno-", "-m") not in flags]
    incs = [f"-I{p}" for p in cpp_extension.include_paths()]
    return [CXX, "-std=c++17", "-fPIC", "-c", *flags, *masks, *incs,
            str(csrc_dir() / cpu_build.SOURCE), "-o", out]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Every tier's compile started at once (two cores take two at a time); {tier: Popen}."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("tiers")
    procs = {t: subprocess.Popen(tier_command(t, str(d / f"{t}.o")), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for t in CPUS}
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()


@pytest.mark.slow  # four compiles of the torch headers: ~8 s of CPU each, run side by side
@needs_cxx
@pytest.mark.parametrize("tier", list(CPUS))
def test_every_code_path_compiles(builds, tier):
    cmd = tier_command(tier, "x.o")
    assert ("-mavx512vnni" in cmd) == ("vnni" in tier)
    assert ("-mno-avx512f" in cmd) == (tier == "avx2")
    out, _ = builds[tier].communicate(timeout=600)
    assert builds[tier].returncode == 0, cpu_build.first_error(out)


def test_tiers_go_down_from_the_requested_path():
    vnni = CPUS["avx512-vnni-bf16"]
    assert cpu_build.tiers("avx512", vnni) == [
        ("avx512", vnni), ("avx512", AVX512), ("avx2", vnni)]
    assert cpu_build.tiers("avx512", AVX512) == [("avx512", AVX512), ("avx2", AVX512)]
    assert cpu_build.tiers("avx2", vnni) == [("avx2", vnni)]
    assert cpu_build.lib_name("avx512", vnni) == "astrai_cpu_avx512_vnni_bf16"
    assert cpu_build.lib_name("avx2", vnni) == "astrai_cpu_avx2"
    assert "-mavx512bf16" in cpu_build.compile_flags("avx512", vnni)
    assert "-mavx512bf16" not in cpu_build.compile_flags("avx2", vnni)


@pytest.mark.skipif(CXX is None or cpu_build.best_isa() is None,
                    reason="needs a C++ compiler and a CPU with AVX2+FMA")
def test_a_failed_build_retries_the_next_tier_and_warns_once(monkeypatch, caplog):
    """The AVX-512 tiers fail for real (a flag no compiler knows, so on any CPU); AVX2, which
    this CPU runs, serves, and one warning says why (the failed build's own error line)."""
    monkeypatch.setenv("ASTRAI_CPU_KERNELS", "1")
    monkeypatch.setenv("ASTRAI_BUILD_KERNELS", "1")
    broken = {**cpu_build._FLAGS, "avx512": ["-mno-such-flag-for-this-test"]}
    monkeypatch.setattr(cpu_build, "_FLAGS", broken)
    monkeypatch.setattr(cpu_build, "requested_isa", lambda: "avx512")
    monkeypatch.setattr(cpu_linear, "_built", {})
    failed = [cpu_build.build_dir(isa, flags) for isa, flags in cpu_build.tiers("avx512")
              if isa == "avx512"]
    # an AVX-512 CPU's earlier tests loaded that build: forget it, so this one builds anew
    cpu_build.load.cache_clear()
    cpu_linear.load_ops.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="astrai.kernels"):
            k = cpu_linear.cpu_decode_kernels()
            assert cpu_linear.cpu_decode_kernels() is k  # cached: built and warned once
    finally:
        for d in failed:
            shutil.rmtree(d, ignore_errors=True)
        cpu_build.load.cache_clear()  # nor keep this test's tiers for the tests after it
        cpu_linear.load_ops.cache_clear()
    assert k is not None and k.name.startswith("avx2")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    msg = warnings[0].getMessage()
    assert "astrai_cpu_avx512" in msg and "no-such-flag" in msg and "using astrai_cpu_avx2" in msg
    assert "\n" not in msg


def test_no_compiler_is_a_warning_not_a_debug_line(monkeypatch, caplog):
    """Every tier failing (here: no compiler and nothing cached) leaves torch serving decode,
    said once as a warning naming the fix."""
    monkeypatch.setenv("ASTRAI_CPU_KERNELS", "1")
    monkeypatch.setenv("ASTRAI_BUILD_KERNELS", "1")
    monkeypatch.setattr(cpu_linear, "_built", {})
    monkeypatch.setattr(cpu_build, "requested_isa", lambda: "avx2")
    monkeypatch.setattr(cpu_build, "build_dir", lambda isa, flags=None: cpu_build.cache_root()
                        / "cpu-test-never-built")
    monkeypatch.setattr(cpu_build, "find_cxx", lambda: None)
    monkeypatch.setattr(cpu_build, "load", cpu_build.load.__wrapped__)  # no cached success
    with caplog.at_level(logging.WARNING, logger="astrai.kernels"):
        assert cpu_linear.cpu_decode_kernels() is None
        assert cpu_linear.cpu_decode_kernels() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no C++ compiler (set CXX or install g++)" in warnings[0]
    assert "torch serves decode" in warnings[0]


def test_chat_prints_the_fallback_warning_once(tmp_path):
    """Where a user sees it: `astrai chat` in a fresh process with no compiler and an empty
    kernel cache answers on torch and prints the reason once on stderr (Python's last-resort
    handler shows warnings of a logger nobody configured)."""
    import os
    import sys

    from astrai.data.testing import tiny_tokenizer
    from astrai.model import ModelConfig, build_model
    from astrai.model.checkpoint import save_checkpoint

    tok = tiny_tokenizer(tmp_path / "tok")
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=64)
    ckpt = save_checkpoint(tmp_path / "ckpt", build_model(cfg, seed=0), cfg,
                           tokenizer_dir=tok.path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "TERM": "dumb",
           "CXX": str(tmp_path / "no-compiler"), "ASTRAI_KERNELS_CACHE": str(tmp_path / "cache"),
           "ASTRAI_CPU_KERNELS": "1", "ASTRAI_BUILD_KERNELS": "1"}
    env.pop("ASTRAI_CPU_ISA", None)
    r = subprocess.run([sys.executable, "-m", "astrai_cli.main", "chat", str(ckpt), "--device",
                        "cpu", "--prompt", "Hello", "--max-tokens", "3"], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "CPU decode kernels" in ln]
    if cpu_build.best_isa() is None:  # no AVX2: torch by design, a debug line only
        assert lines == []
    else:
        assert len(lines) == 1 and "no C++ compiler (set CXX or install g++)" in lines[0]
