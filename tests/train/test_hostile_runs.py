"""Damaged run directories, mistaken paths, kills at awkward moments: one-line errors (exit
2), nothing leaked, and a preempted run that exits 75 even when the signal repeats."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from astrai.train import train
from astrai.train.checkpointing import clean_leftovers, list_checkpoints, prune
from astrai.train.preemption import EXIT_PREEMPTED

from .cli_util import invoke, one_line
from .conftest import make_config, make_data

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 3-step run with checkpoints at steps 2 and 3."""
    tmp = tmp_path_factory.mktemp("hostile")
    old = os.umask(0o022)
    try:
        train(make_config(tmp, max_steps=3, ckpt_interval=2, keep_last=0),
              data=make_data("pretrain", n=16))
    finally:
        os.umask(old)
    return tmp / "run"


def copy_of(run_dir, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(run_dir, dst)
    return dst


@pytest.mark.parametrize("target", ["train_config.json", "checkpoints/step_3/meta.json"])
@pytest.mark.parametrize("content", ["{bad", "[1, 2]"])
def test_damaged_json_of_a_run_is_one_line(run_dir, tmp_path, target, content):
    d = copy_of(run_dir, tmp_path)
    (d / target).write_text(content)
    one_line(invoke("resume", d), str(d / target), "damaged")


def test_garbage_trainer_state_is_one_short_line(run_dir, tmp_path):
    d = copy_of(run_dir, tmp_path)
    (d / "checkpoints" / "step_3" / "trainer_state.pt").write_bytes(b"garbage\n")
    line = one_line(invoke("resume", d), "trainer_state.pt: unreadable", "step_3 away")
    assert "weights_only" not in line and "Unsupported operand" in line
    assert len(line.replace(str(d), "RUN")) < 250


def test_mistaken_paths_say_what_they_are(run_dir, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    one_line(invoke("resume", text), "is a file, not a run directory")
    (tmp_path / "empty").mkdir()
    one_line(invoke("chat", tmp_path / "empty", "-p", "hi"), "not a checkpoint (no config.json)")
    from astrai.data.testing import tiny_dataset

    data = tiny_dataset(tmp_path, "pretrain", n=8, n_val=2)
    one_line(invoke("train", "--data", data, "--out", tmp_path / "r", "--model", text),
             "expected a model config", "--model takes a preset")
    assert not (tmp_path / "r").exists()


def test_checkpoints_follow_the_umask(run_dir):
    ckpt = run_dir / "checkpoints" / "step_3"
    assert stat.S_IMODE(ckpt.stat().st_mode) == 0o755
    assert stat.S_IMODE((ckpt / "model.safetensors").stat().st_mode) == 0o644


def test_a_kill_during_deletion_leaves_no_step_dir(run_dir, tmp_path, monkeypatch):
    d = copy_of(run_dir, tmp_path) / "checkpoints"
    import astrai.train.checkpointing as ck

    def killed(path, *a, **kw):
        raise KeyboardInterrupt  # the process dies inside rmtree

    monkeypatch.setattr(ck.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        prune(d, keep_last=1)
    monkeypatch.undo()
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("step_")) == ["step_3"]
    assert [p.name.split(".del-")[0] for p in d.glob(".step_2.del-*")] == [".step_2"]
    clean_leftovers(d)
    assert sorted(p.name for p in d.iterdir()) == ["step_3"]


def test_half_deleted_and_abandoned_leftovers_are_removed_on_resume(run_dir, tmp_path):
    run = copy_of(run_dir, tmp_path)
    d = run / "checkpoints"
    (d / "step_2" / "model.safetensors").unlink()  # half deleted by an older version
    (d / ".step_4.tmp-123-abcd").mkdir()  # a save killed midway
    (d / ".step_1.del-77").mkdir()
    (d / "step_9").mkdir()  # newer than the newest complete one: not ours to judge
    assert [s for s, _ in list_checkpoints(d)] == [3]
    clean_leftovers(d)
    assert sorted(p.name for p in d.iterdir()) == ["step_3", "step_9"]


SCRIPT = """
import pathlib, sys
sys.path.insert(0, {repo!r})
import astrai.train.preemption as pm
from astrai.train import train
from astrai.train.callbacks import Callback
from tests.train.conftest import make_config, make_data

# a grace period longer than the test: the second signal is always "the same event again"
pm.PreemptionGuard.__init__.__defaults__ = (pm.SIGNALS, 600.0)

class Report(Callback):
    name = "report"
    def on_step_end(self, ctx):
        print("step", ctx.state.step, flush=True)
        sys.stdin.readline()  # wait for the test at each step

summary = train(make_config(pathlib.Path(sys.argv[1]), max_steps=50),
                data=make_data("pretrain", n=32), callbacks=[Report()])
print("done", summary.preempted, flush=True)
sys.stdin.readline()  # the second signal arrives here, after training returned
sys.exit(pm.EXIT_PREEMPTED if summary.preempted else 0)
"""


def test_a_repeated_signal_after_the_stop_still_exits_75(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(repo=str(REPO)),
                             str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().startswith("step 1")
        proc.send_signal(signal.SIGTERM)
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        while line.startswith("step"):  # the signal is seen at the next step boundary
            proc.stdin.write("\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        assert line.startswith("done True"), line + proc.stderr.read()
        proc.send_signal(signal.SIGTERM)  # pending before the process can read the newline
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, proc.stderr.read()[-2000:]
