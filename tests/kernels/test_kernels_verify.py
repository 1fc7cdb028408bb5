"""`astrai kernels --verify`: each accelerated path against its reference, a broken one
reported FAILED with exit 1 (astrai.infer.verify)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from astrai.infer import verify
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai_cli.main import app

KERNELS = cpu_decode_kernels()


def run(*args):
    res = CliRunner().invoke(app, ["kernels", "--verify", *args])
    return res, res.stdout


def test_every_check_runs_and_passes_here():
    res, out = run("--json")
    assert res.exit_code == 0, out
    checks = {c["name"]: c for c in json.loads(out)}
    assert checks["decode path static (cpu)"]["status"] == "ok"
    assert checks["decode path graphs (cuda)"]["status"] in ("n/a", "ok")
    assert all(c["status"] in ("ok", "n/a") for c in checks.values())
    if KERNELS is not None:
        assert checks["decode path native (cpu)"]["status"] == "ok"
        assert sum(n.startswith("CPU ") for n in checks) == 4


@pytest.mark.skipif(KERNELS is None, reason="no CPU decode kernels here")
def test_a_broken_kernel_fails_the_verify(monkeypatch):
    """An RMSNorm kernel that forgets its gain, and a native step that returns the logits of
    the wrong rows: both rows FAILED, the others ok, exit 1."""
    def no_gain(x, w, eps):
        return KERNELS.rms_norm(x, w * 0 + 1, eps)

    def rotated(*args):
        out = KERNELS.decode_layers(*args)
        return out.roll(1, dims=0) * 3 - 1

    broken = dataclasses.replace(KERNELS, rms_norm=no_gain, decode_layers=rotated)
    monkeypatch.setattr(verify, "cpu_decode_kernels", lambda: broken)
    import astrai.infer.engine as engine_mod

    monkeypatch.setattr(engine_mod, "cpu_decode_kernels", lambda: broken)
    res, out = run("--json")
    assert res.exit_code == 1
    checks = {c["name"]: c["status"] for c in json.loads(out)}
    assert checks[f"CPU rms_norm ({KERNELS.name})"] == "FAILED"
    assert checks["decode path native (cpu)"] == "FAILED"
    assert checks[f"CPU fp32 product ({KERNELS.name})"] == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA says")
def test_the_table_names_why_a_path_is_not_here():
    res, out = run()
    assert res.exit_code == 0
    assert "decode path graphs (cuda)" in out and "no CUDA device" in out
