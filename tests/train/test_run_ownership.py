"""A run directory belongs to one process (RUN/.lock), and a run killed before its first
checkpoint is started again by the same `astrai train` command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from astrai.errors import CheckpointError, ConfigError
from astrai.train import resume, train
from astrai.train.callbacks import Callback
from astrai.train.run_lock import RunInUse

from .cli_util import invoke, one_line
from .conftest import make_config, make_data

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


class Intrude(Callback):
    """At step 1, while the run trains, try to train into / resume its directory."""

    name = "intrude"

    def __init__(self, config):
        self.config, self.errors = config, []

    def on_step_end(self, ctx, report, control):
        if ctx.state.step != 1:
            return
        for attempt in (lambda: train(self.config, data=make_data("pretrain", n=16)),
                        lambda: resume(self.config.out, data=make_data("pretrain", n=16))):
            try:
                attempt()
            except Exception as e:  # noqa: BLE001 - what the intruder got is the test
                self.errors.append(e)


def test_a_live_run_owns_its_directory(tmp_path):
    cfg = make_config(tmp_path, max_steps=3, ckpt_interval=1)
    intruder = Intrude(cfg)
    s = train(cfg, data=make_data("pretrain", n=16), callbacks=[intruder])
    assert s.steps == 3 and s.checkpoint.endswith("step_3")
    assert len(intruder.errors) == 2
    for e in intruder.errors:
        assert isinstance(e, RunInUse), repr(e)
        msg = str(e)
        assert "\n" not in msg and "in use by another run" in msg
        assert f"pid {os.getpid()} on {socket.gethostname()}, astrai train since " in msg
    # the lock goes with the run: resuming the finished run now just works
    assert resume(cfg.out, data=make_data("pretrain", n=16)).steps_run == 0


HOLD = """
import sys
from astrai.train.run_lock import acquire
lock = acquire(sys.argv[1], "astrai resume")
print("held", flush=True)
sys.stdin.readline()
"""


def test_another_process_holding_the_run_is_named_and_a_dead_one_frees_it(tmp_path):
    from astrai.data.testing import tiny_dataset

    data = tiny_dataset(tmp_path, "pretrain", n=8, n_val=2)
    out = tmp_path / "run"
    out.mkdir()
    args = ["train", "--data", data, "--out", out, "--model", "tiny", "--window-size", "32",
            "--model-overrides", "dim=32", "--model-overrides", "n_layers=1",
            "--max-steps", "1", "--device", "cpu", "--peak-tflops", "1"]
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "held"
        for cmd in (args, ["resume", out]):
            one_line(invoke(*cmd), f"{out}: in use by another run",
                     f"pid {proc.pid} on {socket.gethostname()}, astrai resume since ")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written
    finally:
        proc.stdin.close()  # the holder exits; the kernel drops its lock
        proc.wait(timeout=60)
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert (out / "checkpoints" / "step_1" / "model.safetensors").is_file()


KILLED = """
import os, signal, sys, pathlib
import astrai.train.checkpointing as ck
from astrai.train import train
from tests.train.conftest import make_config, make_data

class Bomb:  # pickled into the first checkpoint: the process dies inside the save
    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)

real_save = ck.save_checkpoint
def save_then_die(path, *a, extras=None, **k):
    return real_save(path, *a, extras={**extras, "zz_bomb": Bomb()}, **k)
ck.save_checkpoint = save_then_die
train(make_config(pathlib.Path(sys.argv[1]), max_steps=2), data=make_data("pretrain", n=16))
"""


def test_train_starts_again_in_a_run_killed_before_its_first_checkpoint(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=ENV, cwd=REPO, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = tmp_path / "run"
    torn = list((run / "checkpoints").glob(".step_2.tmp-*"))
    assert torn and (run / "train_config.json").is_file() and (run / "metrics.jsonl").is_file()
    with pytest.raises(CheckpointError, match="no complete checkpoint yet .* run the same "
                                              "`astrai train` command again"):
        resume(run, data=make_data("pretrain", n=16))
    (run / "metrics.jsonl").write_text('{"step": 99}\n')  # the dead run's records are replaced
    s = train(make_config(tmp_path, max_steps=2), data=make_data("pretrain", n=16))
    assert s.steps == 2 and s.checkpoint.endswith("step_2")
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert not list((run / "checkpoints").glob(".step_*"))  # the torn save is gone
    # a run with a checkpoint is continued, never restarted
    with pytest.raises(ConfigError, match="holds a run with checkpoints .*astrai resume"):
        train(make_config(tmp_path, max_steps=2), data=make_data("pretrain", n=16))


def test_a_directory_of_other_files_is_never_taken(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.json").write_text("{}")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"already exists and is not empty \(notes.txt"):
        train(make_config(tmp_path, max_steps=1), data=make_data("pretrain", n=16))
    assert sorted(p.name for p in run.iterdir()) == [".lock", "notes.txt", "train_config.json"]
