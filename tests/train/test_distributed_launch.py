"""`astrai train --nprocs 2 --parallel ddp` on a dataset directory (multi-process,
through the real CLI): kill -9 of the whole job after step N then
`astrai resume`, and SIGTERM (saved at the next boundary, exit 75) then `astrai resume`,
both end with the weights of the uninterrupted 2-process run, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astrai.train.checkpointing import list_checkpoints
from astrai.train.preemption import EXIT_PREEMPTED

from .conftest import TINY
from .dist_helpers import losses, weights

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 24  # the SIGTERM after checkpoint step_2 must land well before the end


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from astrai.data.testing import tiny_dataset

    return tiny_dataset(tmp_path_factory.mktemp("data"), "pretrain", vocab_size=300,
                        max_seq_len=32, n=48, n_val=4)


def config(dataset, out) -> dict:
    return {"strategy": "seq", "data": str(dataset), "model": "tiny",
            "model_overrides": {k: v for k, v in TINY.items() if k != "max_seq_len"},
            "out": str(out), "parallel": "ddp", "nprocs": 2, "batch_size": 2,
            "grad_accum_steps": 2, "max_steps": STEPS, "ckpt_interval": 2, "max_lr": 1e-3,
            "warmup_steps": 1, "device": "cpu", "peak_tflops": 1.0, "seed": 7}


def start(action, arg):
    """`astrai train --config FILE --json` or `astrai resume RUN_DIR --json`."""
    if action == "train":
        cfg = Path(json.loads(arg)["out"]).parent / "train.json"
        cfg.write_text(arg)
        arg = str(cfg)
    argv = ["train", "--config", arg] if action == "train" else ["resume", arg]
    return subprocess.Popen([sys.executable, "-m", "astrai_cli.main", *argv, "--json"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)  # its own process group, like a job


def finish(proc, code=0):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == code, err[-3000:]
    return json.loads(out)  # the summary, printed by rank 0 only


def wait_checkpoint(run, step, proc):
    for _ in range(6000):
        if any(s >= step for s, _ in list_checkpoints(run / "checkpoints")):
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError("no checkpoint")


@pytest.fixture(scope="module")
def straight(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    assert finish(start("train", json.dumps(config(dataset, out))))["steps"] == STEPS
    assert json.loads((out / "train_config.json").read_text())["runtime"]["nprocs"] == 2
    return out


def same_as(run, ref):
    assert losses(run) == losses(ref)  # metrics.jsonl: every step once, same values
    w, w_ref = weights(run, STEPS), weights(ref, STEPS)
    assert all((w[k] == w_ref[k]).all() for k in w_ref)


def test_kill9_of_the_job_then_resume(dataset, straight, tmp_path):
    run = tmp_path / "run"
    proc = start("train", json.dumps(config(dataset, run)))
    wait_checkpoint(run, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # agent and both workers, as when a node dies
    proc.wait()
    assert max(s for s, _ in list_checkpoints(run / "checkpoints")) < STEPS
    s = finish(start("resume", str(run)))
    assert s["steps"] == STEPS and s["resumed_from"] and not s["preempted"]
    same_as(run, straight)


def test_sigterm_saves_exits_75_then_resume(dataset, straight, tmp_path):
    run = tmp_path / "run"
    proc = start("train", json.dumps(config(dataset, run)))
    wait_checkpoint(run, 2, proc)
    # to the whole group: each worker gets it directly and again from the agent
    os.killpg(proc.pid, signal.SIGTERM)
    summary = finish(proc, EXIT_PREEMPTED)
    stop = max(s for s, _ in list_checkpoints(run / "checkpoints"))
    assert stop < STEPS and summary["preempted"] and summary["steps"] == stop
    s = finish(start("resume", str(run)))
    assert s["steps"] == STEPS and s["resumed_from"].endswith(f"step_{stop}")
    same_as(run, straight)
