"""Building and finding the kernels: targets, cache keys, the reasons reported, `astrai
kernels`, and (with nvcc) a real compile of every .cu for sm_80 and sm_90."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from astrai.kernels import build, library
from astrai_cli.main import app


def test_parse_archs_spellings_and_default():
    assert build.parse_archs(None) == ["80", "90"]
    assert build.parse_archs("8.0;9.0") == ["80", "90"]
    assert build.parse_archs("sm_90a, 80 90a") == ["90a", "80"]
    with pytest.raises(ValueError, match="sm_75 is too old"):
        build.parse_archs("75")
    with pytest.raises(ValueError, match="cannot read 'hopper'"):
        build.parse_archs("hopper")


def test_gencode_has_machine_code_per_target_and_ptx_of_newest():
    flags = build.gencode_flags(["80", "90"])
    assert "arch=compute_80,code=sm_80" in flags and "arch=compute_90,code=sm_90" in flags
    assert flags[-1] == "arch=compute_90,code=compute_90"


def test_cache_key_follows_sources_and_targets(tmp_path, monkeypatch):
    src = tmp_path / "csrc"
    shutil.copytree(build.csrc_dir(), src)
    monkeypatch.setenv("ASTRAI_CSRC", str(src))
    key = build.build_key(["80", "90"], "13.0")
    assert build.build_key(["90"], "13.0") != key
    assert build.build_key(["80", "90"], "13.1") != key
    (src / "rotary.cu").write_text((src / "rotary.cu").read_text() + "\n// edit\n")
    assert build.build_key(["80", "90"], "13.0") != key


def test_library_reasons(monkeypatch, tmp_path):
    library._resolve_library.cache_clear()
    monkeypatch.setenv("ASTRAI_KERNELS_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(library.KernelUnavailable, match="missing.so not found"):
        library.get_library()
    library._resolve_library.cache_clear()
    monkeypatch.delenv("ASTRAI_KERNELS_LIB")
    monkeypatch.setenv("ASTRAI_KERNELS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ASTRAI_BUILD_KERNELS", "0")
    if build.find_nvcc() is not None:
        with pytest.raises(library.KernelUnavailable, match="ASTRAI_BUILD_KERNELS=0"):
            library.get_library()
    library._resolve_library.cache_clear()


def test_astrai_kernels_reports_why_not(monkeypatch, tmp_path):
    monkeypatch.setenv("ASTRAI_KERNELS_CACHE", str(tmp_path))
    res = CliRunner().invoke(app, ["kernels", "--json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    assert st["archs"] == ["80", "90"] and st["sources_found"]
    assert not st["built"] and not st["ready"]
    assert any("not built" in r or "no nvcc" in r for r in st["reasons"])
    res = CliRunner().invoke(app, ["kernels", "--archs", "70"])
    assert res.exit_code == 2 and "sm_70 is too old" in res.output


@pytest.mark.slow
@pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not on this machine")
def test_every_cu_compiles_for_sm80_and_sm90(monkeypatch, tmp_path):
    monkeypatch.setenv("ASTRAI_KERNELS_CACHE", str(tmp_path))  # a fresh build, not the cache
    res = build.build(["80", "90"])
    assert res.path.is_file() and not res.cached
    lib = library.load_library(str(res.path))  # loads without a GPU (static cudart)
    assert lib.astrai_error_string(-1) == b"unsupported dtype or head dim"
    assert build.build(["80", "90"]).cached
    if shutil.which("cuobjdump"):
        elf = subprocess.run(["cuobjdump", "--list-elf", str(res.path)], capture_output=True,
                             text=True, check=False).stdout
        assert "sm_80" in elf and "sm_90" in elf
    res = CliRunner().invoke(app, ["kernels", "--json"])
    st = json.loads(res.output)
    assert st["built"] and st["built_archs"] == ["80", "90"]
