"""Who serves a one-row fp32 product is decided without timing at start-up
(astrai/kernels/cpu_choice.py): the env override, a calibration the user ran once for this
build and CPU, else the rule (the kernel)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from typer.testing import CliRunner

from astrai.errors import ConfigError
from astrai.kernels import cpu_build, cpu_choice, cpu_linear
from astrai_cli.main import app


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv(cpu_choice.ENV, raising=False)


def write_cal(d, server, cpu=None):
    (d / cpu_choice.FILE).write_text(json.dumps(
        {"cpu": cpu or cpu_choice.cpu_model(), "fp32_one_row": server}))


def test_the_rule_is_the_kernel_without_a_calibration(tmp_path):
    assert cpu_choice.one_row_fp32(tmp_path) == ("kernel", "rule")


def test_a_calibration_for_this_cpu_decides(tmp_path):
    write_cal(tmp_path, "torch")
    assert cpu_choice.one_row_fp32(tmp_path) == ("torch", "calibration")


@pytest.mark.parametrize("text", ["{not json", "[]", '{"cpu": "x"}'])
def test_a_damaged_calibration_falls_back_to_the_rule(tmp_path, text):
    (tmp_path / cpu_choice.FILE).write_text(text)
    assert cpu_choice.one_row_fp32(tmp_path) == ("kernel", "rule")


def test_a_calibration_from_another_cpu_model_is_ignored(tmp_path):
    write_cal(tmp_path, "torch", cpu="Some Other CPU @ 1.0GHz")
    assert cpu_choice.one_row_fp32(tmp_path) == ("kernel", "rule")


def test_the_environment_overrides_a_calibration(tmp_path, monkeypatch):
    write_cal(tmp_path, "torch")
    monkeypatch.setenv(cpu_choice.ENV, "Kernel")
    assert cpu_choice.one_row_fp32(tmp_path) == ("kernel", cpu_choice.ENV)
    monkeypatch.setenv(cpu_choice.ENV, "mkl")
    with pytest.raises(ConfigError, match="ASTRAI_FP32_ONE_ROW='mkl': use one of kernel, torch"):
        cpu_choice.one_row_fp32(tmp_path)


@pytest.mark.parametrize("slow", ["kernel", "torch"])
def test_calibrate_keeps_the_faster_and_stores_it(tmp_path, monkeypatch, slow):
    """A stand-in kernel made slower (or faster) than torch's GEMV by a sleep far above any
    jitter: the calibration keeps the other, writes it down, and the choice follows it."""
    real_linear = torch.nn.functional.linear

    def gemv(x, w, b):
        if slow == "kernel":
            time.sleep(0.002)
        return real_linear(x, w, b)

    def linear(x, w, b=None):
        if slow == "torch":
            time.sleep(0.002)
        return real_linear(x, w, b)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    cal = cpu_choice.calibrate(gemv, tmp_path, rounds=3)
    fast = "torch" if slow == "kernel" else "kernel"
    assert cal["fp32_one_row"] == fast and cal["rounds"] == 3
    assert cal["median_us"][slow] > cal["median_us"][fast] + 7 * 2000 * 0.9
    assert cpu_choice.one_row_fp32(tmp_path) == (fast, "calibration")


KERNELS = cpu_linear.cpu_decode_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no CPU decode kernels here")


@needs_kernels
def test_the_kernels_take_one_fp32_row_as_chosen_and_time_nothing(monkeypatch):
    isa = KERNELS.name.split(",")[0]
    flags = cpu_build.load_first(cpu_build.requested_isa())[1]

    def no_timing():
        raise AssertionError("timed at start-up")

    monkeypatch.setattr(time, "perf_counter", no_timing)
    for server, rows in (("kernel", 1), ("torch", 2)):
        monkeypatch.setenv(cpu_choice.ENV, server)
        k = cpu_linear.decode_kernels(isa, None, flags)
        assert k.fp32_rows[0] == rows
        assert ("fp32 row 1 on torch" in k.name) == (server == "torch")


@needs_kernels
def test_kernels_calibrate_reports_and_keeps_the_choice(tmp_path, monkeypatch):
    real = cpu_choice.calibrate
    monkeypatch.setattr(cpu_linear, "_built", dict(cpu_linear._built))  # it clears its own
    monkeypatch.setattr(cpu_linear, "calibrate",
                        lambda gemv, d: real(gemv, tmp_path, rounds=3))
    res = CliRunner().invoke(app, ["kernels", "--calibrate", "--json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout[res.stdout.index("{"):])
    cal = json.loads((tmp_path / cpu_choice.FILE).read_text())
    assert st["cpu"]["calibration"] == cal
    assert cal["fp32_one_row"] in cpu_choice.CHOICES and set(cal["median_us"]) == {"kernel",
                                                                                   "torch"}


def test_kernels_calibrate_without_kernels_is_one_line(monkeypatch):
    monkeypatch.setenv("ASTRAI_CPU_ISA", "none")
    res = CliRunner().invoke(app, ["kernels", "--calibrate"])
    assert res.exit_code == 2
    assert "--calibrate: no CPU decode kernels here" in res.output
    assert "Traceback" not in res.output
