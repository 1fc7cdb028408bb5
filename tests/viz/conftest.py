"""Two tiny real runs for the plot tests: `resumed` (interrupted at step 3, resumed to 6)
and `evaluated` (4 steps, validation at 2 and 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from astrai.train import resume, train
from astrai.train.callbacks import Callback
from tests.train.conftest import make_config, make_data


class _Interrupt(Exception):
    pass


class _StopAfter(Callback):
    name = "stop"

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(self, ctx, report, control) -> None:
        if ctx.state.step == self.steps:
            raise _Interrupt


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("runs")
        cfg = make_config(root / "resumed", max_steps=6, ckpt_interval=0)
        with pytest.raises(_Interrupt):
            train(cfg, data=make_data(n=24), callbacks=[_StopAfter(3)])
        resume(cfg.out, data=make_data(n=24))
        ev = make_config(root / "evaluated", max_steps=4, eval_interval=2)
        train(ev, data=make_data(n=24, eval_n=4))
        return {"resumed": Path(cfg.out), "evaluated": Path(ev.out)}
    finally:
        torch.set_num_threads(threads)
