"""A non-finite gradient stops training naming the step and parameter; --skip-nonfinite."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from astrai.train import NonFiniteError, train
from astrai.train.callbacks import Callback
from astrai.train.checkpointing import list_checkpoints

from .conftest import make_data


class Poison(Callback):
    name = "poison"

    def __init__(self, step):
        self.step = step
        self.weights = {}

    def on_batch_end(self, ctx, micro):
        if ctx.state.step + 1 == self.step:
            ctx.model.layers[1].mlp.up_proj.weight.grad[0, 0] = float("nan")

    def on_step_end(self, ctx, report, control):
        self.weights[ctx.state.step] = {k: v.clone() for k, v in ctx.model.state_dict().items()}


def test_nonfinite_gradient_stops_and_names_parameter(tiny_config):
    cfg = tiny_config(ckpt_interval=0)
    with pytest.raises(NonFiniteError, match=r"step 3: .*layers\.1\.mlp\.up_proj\.weight"):
        train(cfg, data=make_data(n=32), callbacks=[Poison(3)])
    # on_error saved the last good state (after step 2), all finite
    ckpts = list_checkpoints(Path(cfg.out) / "checkpoints")
    assert [n for n, _ in ckpts] == [2]
    for v in load_file(str(ckpts[0][1] / "model.safetensors")).values():
        assert torch.isfinite(v).all()


def test_skip_nonfinite_skips_the_step(tiny_config):
    cb = Poison(3)
    s = train(tiny_config(skip_nonfinite=1), data=make_data(n=32), callbacks=[cb])
    assert s.steps == 8 and s.skipped_steps == 1 and "step 3" in s.warnings[0]
    for k, v in cb.weights[3].items():  # the skipped step left the weights untouched
        assert torch.equal(v, cb.weights[2][k])
    assert math.isfinite(s.final_loss)
