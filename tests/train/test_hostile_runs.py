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
    def on_step_end(self, ctx, report, control):
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


class Evil:
    """Unpickling this would run a shell command; weights_only=True refuses it unrun."""

    def __reduce__(self):
        return (os.system, ("true",))


def test_a_malicious_pickle_is_refused_with_its_reason_and_no_unsafe_advice(run_dir, tmp_path):
    import torch

    d = copy_of(run_dir, tmp_path)
    torch.save({"state": Evil()}, d / "checkpoints" / "step_3" / "trainer_state.pt")
    line = one_line(invoke("resume", d), "trainer_state.pt: unreadable",
                    "GLOBAL posix.system", "move", "step_3 away to resume from step_2")
    for advice in ("weights_only", "safe_globals", "likely succeed", "trust"):
        assert advice not in line, line


@pytest.mark.parametrize("older", [True, False])
def test_truncated_weights_point_at_the_older_checkpoint(run_dir, tmp_path, older):
    d = copy_of(run_dir, tmp_path)
    if not older:
        shutil.rmtree(d / "checkpoints" / "step_2")
    f = d / "checkpoints" / "step_3" / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # a copy cut short
    line = one_line(invoke("resume", d), "model.safetensors: truncated or damaged",
                    "step_3 away")
    assert ("to resume from step_2" in line) == older, line
    assert older or "run the same `astrai train` command again" in line
    assert "download" not in line and "re-export" not in line


def _full_disk(kind):
    """save_weights that writes part of the file, then fails as a full disk makes it."""
    import errno

    import astrai.model.checkpoint as mc

    real = mc.save_weights

    def save_weights(state, path):
        if not Path(path).parent.name.startswith(".step_4.tmp-"):
            return real(state, path)
        Path(path).write_bytes(b"\0" * 100)
        if kind == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1600 "
                           "vs 1492")

    return save_weights


@pytest.mark.parametrize("kind", ["oserror", "torch"])
def test_disk_full_at_a_save_is_one_line_naming_the_last_good_checkpoint(tmp_path,
                                                                          monkeypatch, kind):
    import astrai.model.checkpoint as mc
    from astrai.data.testing import tiny_dataset

    monkeypatch.setattr(mc, "save_weights", _full_disk(kind))
    data = tiny_dataset(tmp_path, "pretrain", n=16, n_val=2)
    out = tmp_path / "run"
    r = invoke("train", "--data", data, "--out", out, "--model", "tiny", "--window-size", "32",
               "--model-overrides", "dim=32", "--model-overrides", "n_layers=1",
               "--batch-size", "2", "--max-steps", "4", "--ckpt-interval", "2",
               "--device", "cpu", "--peak-tflops", "1")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and sum("error" in x for x in r.stderr.splitlines()) == 1
    for needle in (f"{out / 'checkpoints'}: disk full while saving checkpoint step_4",
                   "MiB free", "last good checkpoint is step_2", f"astrai resume {out}"):
        assert needle in last, last
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2"]  # no partial temp dir
    assert [s for s, _ in list_checkpoints(ckpts)] == [2]


def users_dirs(d: Path) -> dict[str, str]:
    """A user's own directories named like checkpoints (not complete ones: a directory of
    complete checkpoints is refused as an existing run)."""
    for name in ("step_0", "step_1"):
        (d / name).mkdir(parents=True)
        (d / name / "notes.txt").write_text("mine\n")
    return {"step_0": "notes.txt", "step_1": "notes.txt"}


def test_a_users_step_dirs_in_the_ckpt_dir_survive_train_and_resume(tmp_path):
    mine = tmp_path / "mine"
    kept = users_dirs(mine)
    data = make_data("pretrain", n=16)
    train(make_config(tmp_path, max_steps=4, ckpt_interval=2, keep_last=1,
                      ckpt_dir=str(mine)), data=data)
    for name, f in kept.items():
        assert (mine / name / f).read_text() == "mine\n", name
    assert [s for s, _ in list_checkpoints(mine)] == [4]
    clean_leftovers(mine)
    prune(mine, keep_last=1)
    assert all((mine / n / f).is_file() for n, f in kept.items())


def test_a_tampered_checkpoint_dir_on_resume_deletes_nothing(run_dir, tmp_path):
    import json

    d = copy_of(run_dir, tmp_path)
    victim = tmp_path / "victim"
    kept = users_dirs(victim)
    cfg = json.loads((d / "train_config.json").read_text())
    section = cfg.get("checkpoint", cfg)
    section["dir" if "dir" in section else "ckpt_dir"] = str(victim)
    (d / "train_config.json").write_text(json.dumps(cfg))
    invoke("resume", d)  # whatever it says, the user's directories stay
    for name, f in kept.items():
        assert (victim / name / f).read_text() == "mine\n", name


def test_a_save_never_replaces_a_users_step_dir(tmp_path):
    mine = tmp_path / "mine"
    (mine / "step_2").mkdir(parents=True)
    (mine / "step_2" / "notes.txt").write_text("mine\n")
    with pytest.raises(Exception, match="not written by astrai's trainer"):
        train(make_config(tmp_path, max_steps=3, ckpt_interval=2, ckpt_dir=str(mine)),
              data=make_data("pretrain", n=16))
    assert (mine / "step_2" / "notes.txt").read_text() == "mine\n"
