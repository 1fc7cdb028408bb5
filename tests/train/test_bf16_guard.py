"""The BF16 lock-in guard wired into training: on with bf16-true by default,
counts and early per-layer gradient norms in metrics.jsonl, a warning when lock-in appears."""

import json
import logging
from pathlib import Path

import torch

from astrai.config.train import TrainConfig
from astrai.inspect.guard import LockInGuard
from astrai.train import train
from astrai.train.callbacks import Callback, bf16_guard_enabled, default_callbacks

from .conftest import make_data


def read(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_guard_defaults_follow_precision():
    base = {"out": "o"}
    assert bf16_guard_enabled(TrainConfig(**base, precision="bf16-true"))
    assert not bf16_guard_enabled(TrainConfig(**base, precision="fp32"))
    assert not bf16_guard_enabled(TrainConfig(**base, precision="bf16-true", guard_bf16=False))
    assert bf16_guard_enabled(TrainConfig(**base, precision="fp32", guard_bf16=True))
    guards = [c for c in default_callbacks(TrainConfig(**base, guard_bf16=True))
              if isinstance(c, LockInGuard)]
    assert len(guards) == 1


class PlantLockIn(Callback):
    """After step 2, pin two rows of every k_proj to exactly 1.0 (the paper's pattern)."""

    name = "plant"

    def on_step_end(self, ctx, report, control):
        if ctx.state.step == 2:
            with torch.no_grad():
                for name, p in ctx.model.named_parameters():
                    if name.endswith("k_proj.weight"):
                        p[:2].fill_(1.0)


def test_guard_logs_counts_grad_norms_and_warns(tiny_config, caplog):
    cfg = tiny_config(guard_bf16=True, guard_every=1, guard_grad_steps=2, max_lr=1e-12)
    with caplog.at_level(logging.WARNING):
        s = train(cfg, data=make_data(n=16), callbacks=[PlantLockIn()])
    recs = read(s.run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert any(k.startswith("grad_norm/") for k in recs[0])
    assert any(k.startswith("grad_norm/") for k in recs[1])
    assert not any(k.startswith("grad_norm/") for k in recs[2])
    assert recs[0]["lockin/locked"] == 0
    # step 2's record is written before the planting callback runs; step 3 sees it
    assert recs[2]["lockin/locked"] > 0 and recs[3]["lockin/locked"] == recs[2]["lockin/locked"]
    assert any("lock-in" in r.getMessage() for r in caplog.records)
