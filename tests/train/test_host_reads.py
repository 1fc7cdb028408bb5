"""The training step reads the device at most once when it neither logs nor validates
(docs/train.md "Host reads"): loss, metrics and unit counts stay tensors and are read on
the host only on logged steps; the one read is the fused finite check.

On CPU every tensor read counts (item, float, int, bool, index, tolist), so the step must
not read the CPU batch either (loss units are counted as tensors)."""

from __future__ import annotations

import contextlib

import torch

from astrai.train import train
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
    # steps 1, 2 are neither logged (interval 3) nor validated nor the last
    print("host reads per step", counter.per_step)
    assert counter.per_step[0] <= 1 and counter.per_step[1] <= 1, counter.per_step
