"""The live loss sparkline of the rich progress display (terminal only)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from astrai.train import train
from astrai.train.callbacks import ProgressCallback
from astrai.viz import sparkline
from astrai.viz.sparkline import BARS

from .conftest import make_data


def test_sparkline_of_the_step_losses_on_a_terminal(tiny_config):
    loud = io.StringIO()
    cb = ProgressCallback(Console(file=loud, force_terminal=True, width=200))
    s = train(tiny_config(max_steps=6), data=make_data(n=24), callbacks=[cb])
    losses = [json.loads(x)["loss"] for x in
              (Path(s.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert list(cb.losses) == losses
    spark = sparkline(losses)
    assert len(spark) == 6 and spark[0] == "█"  # the first loss is the highest
    assert spark in loud.getvalue()


def test_no_sparkline_off_a_terminal(tiny_config):
    quiet = io.StringIO()
    cb = ProgressCallback(Console(file=quiet, force_terminal=False))
    train(tiny_config(max_steps=2), data=make_data(n=8), callbacks=[cb])
    assert not cb.losses and not set(quiet.getvalue()) & set(BARS)  # plain lines only
