"""Exact resume: an interrupted run, resumed, ends with
bit-identical weights and the same per-step losses as the uninterrupted run (CPU)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astrai.errors import CheckpointError
from astrai.train import resume, train
from astrai.train.callbacks import Callback
from astrai.train.checkpointing import list_checkpoints

from .conftest import make_config, make_data

REPO = Path(__file__).resolve().parents[2]


class Interrupt(Exception):
    pass


class StopAtMicroBatch(Callback):
    name = "stop"

    def __init__(self, n):
        self.n, self.seen = n, 0

    def on_batch_end(self, ctx, micro):
        self.seen += 1
        if self.seen == self.n:
            raise Interrupt


def records(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def trajectory(run_dir):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in records(run_dir)]


def final_weights(run_dir, step):
    return (Path(run_dir) / "checkpoints" / f"step_{step}" / "model.safetensors").read_bytes()


# 20 samples / batch 4 = 5 micro-batches per epoch; accum 2 -> 2 steps + 1 leftover per epoch.
# Stopping after micro-batch 3 is mid-window mid-epoch (resume from step 1, epoch_batches 2);
# after micro-batch 5 is the first micro-batch of epoch 1 (resume from the epoch-end step 2).
@pytest.mark.parametrize("kind,stop", [("pretrain", 3), ("pretrain", 5), ("sft", 3), ("sft", 5)])
def test_interrupted_then_resumed_is_bit_identical(kind, stop, tmp_path):
    strategy = "seq" if kind == "pretrain" else "sft"
    kw = {"strategy": strategy, "grad_accum_steps": 2, "epochs": 3, "label_smoothing": 0.1}
    a = train(make_config(tmp_path / "a", **kw), data=make_data(kind, n=20))
    cfg_b = make_config(tmp_path / "b", **kw)
    with pytest.raises(Interrupt):
        train(cfg_b, data=make_data(kind, n=20), callbacks=[StopAtMicroBatch(stop)])
    saved = list_checkpoints(Path(cfg_b.out) / "checkpoints")
    assert [s for s, _ in saved] == [1 if stop == 3 else 2]  # on_error saved the last good step
    b = resume(cfg_b.out, data=make_data(kind, n=20))
    assert b.steps == a.steps == 6 and b.resumed_from.endswith(f"step_{saved[0][0]}")
    assert trajectory(cfg_b.out) == trajectory(a.run_dir)  # no duplicate or missing steps
    assert final_weights(cfg_b.out, 6) == final_weights(a.run_dir, 6)


SCRIPT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import astrai.train.checkpointing as ck
from astrai.train import train
from astrai.train.callbacks import Callback
from tests.train.conftest import make_config, make_data

mode, kind, out, optimizer = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
extra = __import__("json").loads(sys.argv[5])

class KillMidWindow(Callback):
    name = "kill"
    def on_batch_end(self, ctx, micro):
        # the first micro-batch after step 4: mid accumulation window
        if ctx.state.step == 4 and micro.index == 0:
            os.kill(os.getpid(), signal.SIGKILL)

class Bomb:
    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)

real_save = ck.save_checkpoint
def save_then_die(path, *a, extras=None, **k):
    if path.name == "step_4":  # killed while writing step_4: after model.safetensors
        extras = {{**extras, "zz_bomb": Bomb()}}
    return real_save(path, *a, extras=extras, **k)

cbs = []
if mode == "kill":
    cbs = [KillMidWindow()]
else:
    ck.save_checkpoint = save_then_die
strategy = "seq" if kind == "pretrain" else "sft"
cfg = make_config(__import__("pathlib").Path(out), strategy=strategy, grad_accum_steps=2,
                  epochs=4, ckpt_interval=2, optimizer=optimizer, **extra)
train(cfg, data=make_data(kind, n=20), callbacks=cbs)
"""


def run_killed(mode, kind, out, optimizer="adamw", extra=None):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(repo=str(REPO)), mode, kind, str(out), optimizer,
         json.dumps(extra or {})],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


BF16 = {"precision": "bf16-true", "max_lr": 1e-4}


@pytest.mark.parametrize("kind,optimizer,extra", [
    ("pretrain", "adamw", {}), ("pretrain", "muon", {}),
    ("pretrain", "adamw", {**BF16, "bf16_update": "nearest"}),
    ("pretrain", "adamw", {**BF16, "bf16_update": "stochastic"}),
    ("pretrain", "muon", {**BF16, "bf16_update": "kahan"}),
], ids=["adamw", "muon", "bf16-nearest-adamw", "bf16-stochastic-adamw", "bf16-kahan-muon"])
def test_kill9_after_step_n_then_resume(kind, optimizer, extra, tmp_path):
    """(a) train to 2N straight vs kill -9 after step N (mid-window) and resume to 2N, with
    either optimizer (Muon's momentum buffers and AdamW's moments both come back exactly),
    and bf16-true weights written in each --bf16-update mode: to nearest, stochastically
    (the generator state comes back) or with Kahan compensation (the bf16 buffer comes
    back). (sft: through the CLI in tests/cli/test_train_cmd.py; both kinds in-process
    above.)"""
    strategy = "seq" if kind == "pretrain" else "sft"
    kw = {"strategy": strategy, "grad_accum_steps": 2, "epochs": 4, "ckpt_interval": 2,
          "optimizer": optimizer, **extra}
    a = train(make_config(tmp_path / "a", **kw), data=make_data(kind, n=20))
    run_killed("kill", kind, tmp_path / "b", optimizer, extra)
    run_dir = tmp_path / "b" / "run"
    assert [s for s, _ in list_checkpoints(run_dir / "checkpoints")][-1] == 4
    b = resume(run_dir, data=make_data(kind, n=20))
    assert b.steps == a.steps == 8
    assert trajectory(run_dir) == trajectory(a.run_dir)
    assert final_weights(run_dir, 8) == final_weights(a.run_dir, 8)
    saved = torch.load(run_dir / "checkpoints" / "step_8" / "optimizer.pt", weights_only=True)
    muon = [s for s in saved["state"].values() if "momentum_buffer" in s]
    assert bool(muon) == (optimizer == "muon")


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    """(b) a kill while step_4 is being written: step_2 stays the newest complete one and
    resume from it still ends bit-identical."""
    kw = {"grad_accum_steps": 2, "epochs": 4, "ckpt_interval": 2}
    a = train(make_config(tmp_path / "a", **kw), data=make_data(n=20))
    run_killed("bomb", "pretrain", tmp_path / "b")
    run_dir = tmp_path / "b" / "run"
    ckpts = run_dir / "checkpoints"
    assert [s for s, _ in list_checkpoints(ckpts)] == [2]
    assert any(p.name.startswith(".step_4.tmp-") for p in ckpts.iterdir())  # the torn write
    b = resume(run_dir, data=make_data(n=20))
    assert b.resumed_from.endswith("step_2")
    assert not any(p.name.startswith(".step_4.tmp-") for p in ckpts.iterdir())  # cleaned up
    assert trajectory(run_dir) == trajectory(a.run_dir)
    assert final_weights(run_dir, 8) == final_weights(a.run_dir, 8)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(Interrupt):
        train(cfg, data=make_data(), callbacks=[StopAtMicroBatch(1)])  # before any step
    # nothing to resume was made, so no run directory is left that `train` would refuse
    assert not Path(cfg.out).exists()
    (Path(cfg.out) / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resume(cfg.out, data=make_data())
    with pytest.raises(CheckpointError, match="not a run directory"):
        resume(tmp_path / "nope")
