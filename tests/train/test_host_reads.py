"""The training step reads the device at most once when it neither logs nor validates
(docs/train.md "Host reads"): loss, metrics and unit counts stay tensors and are read on
the host only on logged steps; the one read is the fused finite check.

On CPU every tensor read counts (item, float, int, bool, index, tolist), so the step must
not read the CPU batch either (loss units are counted as tensors)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from astrai.train import train
from astrai.train.callbacks import Callback, ProgressCallback
from astrai.train.trainer import Trainer

from .conftest import make_data

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


class ReadCounter:
    """Counts host reads of tensors while `active`; one list of counts per Trainer.step."""

    def __init__(self) -> None:
        self.active = False
        self.per_step: list[int] = []

    def wrap(self, name: str, fn):
        def counted(t, *a, **k):
            if self.active:
                self.per_step[-1] += 1
            return fn(t, *a, **k)
        return counted

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self.wrap(name, getattr(torch.Tensor, name)))
        real_step = Trainer.step

        def step(trainer, window):
            self.per_step.append(0)
            self.active = True
            try:
                return real_step(trainer, window)
            finally:
                self.active = False

        monkeypatch.setattr(Trainer, "step", step)
        yield self


def test_a_step_that_neither_logs_nor_validates_reads_once(tiny_config, monkeypatch):
    counter = ReadCounter()
    cfg = tiny_config(grad_accum_steps=2, log_interval=3, guard_bf16=False)
    with counter.installed(monkeypatch):
        s = train(cfg, data=make_data(n=32))
    assert s.steps == 4
    # steps 1, 2 neither log (interval 3) nor validate: the fused finite check only;
    # steps 3 and 4 (the last) log: every figure in the same single read
    assert counter.per_step[:2] == [1, 1] and max(counter.per_step) <= 1, counter.per_step


class Reports(Callback):
    """Keeps every StepReport; adds a figure at every step (an observer, registered first)."""

    name = "reports"

    def __init__(self) -> None:
        self.reports = []

    def on_step_end(self, ctx, report, control):
        self.reports.append(report)
        control.add_metric("observer/step", report.step)


def test_unlogged_steps_carry_no_device_figures_and_records_follow_log_interval(tiny_config):
    rec = Reports()
    cfg = tiny_config(grad_accum_steps=2, log_interval=3)
    train(cfg, data=make_data(n=32), callbacks=[rec])
    logged = {r.step: r.logged for r in rec.reports}
    assert logged == {1: False, 2: False, 3: True, 4: True}  # interval 3; 4 is the last
    first = rec.reports[0]
    assert first.loss is None and first.grad_norm is None and first.loss_units is None
    assert "seq_loss" not in first.metrics and first.tokens == 2 * 4 * 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.loss = 1.0
    third = rec.reports[2]
    assert math.isfinite(third.loss) and third.grad_norm > 0 and third.loss_units == 2 * 4 * 16
    lines = (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["step"] for r in records] == [3, 4]
    # the figure an observer added reaches the record writer, whatever the order
    assert [r["observer/step"] for r in records] == [3, 4]
    assert records[0]["loss"] == third.loss and records[0]["seq_loss"] == third.metrics["seq_loss"]


def test_progress_line_forces_its_step_to_be_logged(tiny_config, monkeypatch):
    """A plain progress line is due (interval_s 0: at every step) although --log-interval
    would read only at the last step: the line's step is logged, with one read."""
    out = io.StringIO()
    progress = ProgressCallback(Console(file=out, force_terminal=False), interval_s=0.0)
    counter = ReadCounter()
    cfg = tiny_config(grad_accum_steps=2, log_interval=100)
    with counter.installed(monkeypatch):
        train(cfg, data=make_data(n=32), callbacks=[progress])
    lines = [x for x in out.getvalue().splitlines() if x.startswith("step ")]
    assert [x.split()[1] for x in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert all("loss " in x and "nan" not in x for x in lines)
    assert max(counter.per_step) <= 1, counter.per_step
    records = (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in records] == [4]  # records keep the interval
