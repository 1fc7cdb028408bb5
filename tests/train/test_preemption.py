"""Preemption: SIGTERM/SIGINT save a checkpoint at the next step boundary and exit with
EXIT_PREEMPTED; resume continues exactly; a second signal exits at once and leaves the last
complete checkpoint intact.

The child processes report what they reached on stdout ("step N", "signal", "saving") and
wait for the parent's next move where needed, so no outcome depends on how fast a loaded
machine runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astrai.model.checkpoint import load_checkpoint
from astrai.train import resume, train
from astrai.train.callbacks import Callback
from astrai.train.checkpointing import list_checkpoints
from astrai.train.preemption import EXIT_PREEMPTED, PreemptionGuard

from .conftest import make_config, make_data
from .dist_helpers import losses, weights

REPO = Path(__file__).resolve().parents[2]
STEPS = 6

SCRIPT = """
import pathlib, sys, threading, time
sys.path.insert(0, {repo!r})
import astrai.train.checkpointing as ck
import astrai.train.preemption as pre
from astrai.train import train
from astrai.train.callbacks import Callback
from astrai.train.preemption import EXIT_PREEMPTED
from tests.train.conftest import make_config, make_data

out, wait_signal, slow_save = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = threading.Event()

real_notify = pre.PreemptionGuard.notify
def notify(self, signum):
    # the parent sends a second signal only after reading "signal": a real second one
    self.grace_s = 0.0
    real_notify(self, signum)
    seen.set()
    print("signal", flush=True)
pre.PreemptionGuard.notify = notify

class Report(Callback):
    name = "report"
    def on_step_end(self, ctx, report, control):
        print("step", ctx.state.step, flush=True)
    def on_batch_begin(self, ctx, micro):  # inside step 2: the signal is seen at its end
        if wait_signal and ctx.state.step == 1:
            assert seen.wait(120), "no signal came"

class SlowPickle:
    def __reduce__(self):
        print("saving", flush=True)
        time.sleep(600)
        return (int, ())

real_save = ck.save_checkpoint
def save(path, *a, extras=None, **k):
    if path.name == f"step_{{slow_save}}":
        extras = {{**extras, "zz_slow": SlowPickle()}}
    return real_save(path, *a, extras=extras, **k)
ck.save_checkpoint = save

cfg = make_config(pathlib.Path(out), max_steps={steps}, ckpt_interval=2, grad_accum_steps=2)
summary = train(cfg, data=make_data("pretrain", n=32), callbacks=[Report()])
print("done", summary.steps, summary.preempted, flush=True)
sys.exit(EXIT_PREEMPTED if summary.preempted else 0)
"""


def start(out, wait_signal=False, slow_save=-1):
    code = SCRIPT.format(repo=str(REPO), steps=STEPS)
    return subprocess.Popen([sys.executable, "-c", code, str(out), str(int(wait_signal)),
                             str(slow_save)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def wait_for(proc, prefix):
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"process ended before '{prefix}': {proc.wait()} {proc.stderr.read()}")


def config(out):
    return make_config(out, max_steps=STEPS, ckpt_interval=2, grad_accum_steps=2)


def test_guard_first_signal_requests_second_exits(monkeypatch):
    exits, now = [], [100.0]
    monkeypatch.setattr(os, "_exit", exits.append)
    g = PreemptionGuard(grace_s=0.2, clock=lambda: now[0])
    g.notify(signal.SIGTERM)
    assert g.requested and g.signum == signal.SIGTERM and not exits
    now[0] += 0.19
    g.notify(signal.SIGINT)  # within the grace period: the same event delivered twice
    assert not exits
    now[0] += 0.01
    g.notify(signal.SIGINT)
    assert exits == [128 + signal.SIGINT]


def test_guard_restores_handlers():
    before = signal.getsignal(signal.SIGTERM)
    g = PreemptionGuard()
    assert g.install()
    assert signal.getsignal(signal.SIGTERM) is not before
    os.kill(os.getpid(), signal.SIGTERM)  # caught: the flag, not the default action
    deadline = time.monotonic() + 60
    while not g.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    g.uninstall()
    assert g.requested and signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_signal_saves_at_step_boundary_then_resume_is_exact(sig, tmp_path):
    straight = train(config(tmp_path / "straight"), data=make_data("pretrain", n=32))
    proc = start(tmp_path / "cut", wait_signal=True)  # step 2 waits for the signal
    wait_for(proc, "step 1")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_PREEMPTED, err[-2000:]
    run = tmp_path / "cut" / "run"
    saved = [s for s, _ in list_checkpoints(run / "checkpoints")]
    stop = saved[-1]
    assert stop == 2 and f"done {stop} True" in out  # stopped at the next boundary
    assert [s for s in range(1, stop + 1) if s % 2 == 0 or s == stop] == saved[-len(saved):]
    s = resume(run, data=make_data("pretrain", n=32))
    assert s.resumed_from.endswith(f"step_{stop}") and s.steps == STEPS and not s.preempted
    assert losses(run) == losses(Path(straight.run_dir))
    w, ref = weights(run, STEPS), weights(Path(straight.run_dir), STEPS)
    assert all((w[k] == ref[k]).all() for k in ref)


def test_second_signal_exits_at_once_and_keeps_last_checkpoint(tmp_path):
    proc = start(tmp_path / "run2", slow_save=4)  # writing step_4 takes 10 minutes
    wait_for(proc, "saving")
    proc.send_signal(signal.SIGTERM)
    wait_for(proc, "signal")  # the first one was taken (a stop request)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)  # far less than the write: it did not wait for it
    assert proc.returncode == 128 + signal.SIGTERM
    ckpts = list_checkpoints(tmp_path / "run2" / "run" / "checkpoints")
    assert [s for s, _ in ckpts] == [2]  # step_4 never appeared half-written
    _, _, meta = load_checkpoint(ckpts[-1][1])
    assert meta["step"] == 2


def test_handlers_restored_after_a_run_and_a_failed_start(tmp_path):
    class FailAtBegin(Callback):
        name = "fail"

        def on_train_begin(self, ctx):
            raise RuntimeError("no start")

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    train(make_config(tmp_path / "a", max_steps=1), data=make_data("pretrain", n=8))
    with pytest.raises(RuntimeError, match="no start"):
        train(make_config(tmp_path / "b", max_steps=1), data=make_data("pretrain", n=8),
              callbacks=[FailAtBegin()])
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
