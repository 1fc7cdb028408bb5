"""DCP checkpoints (--checkpoint-format dcp): each rank writes its own shards; resume
reshards across process counts and executors; async saves; atomic under kill -9; one
reader for every consumer; hostile directories refused in one line."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from astrai.errors import CheckpointError, ConfigError
from astrai.model.checkpoint import load_checkpoint
from astrai.model.dcp_format import read_metadata, read_tensors
from astrai.train import resume, train
from astrai.train.launch import run_workers

from .dist_helpers import (
    DCP_LAYOUT,
    config_for,
    data_for,
    dcp_cut,
    dcp_scenarios,
    losses,
)


def metric(run_dir: Path, key: str) -> list:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)[key] for x in lines]


def state(ckpt: Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint of either format, through the one loader."""
    model, _, _ = load_checkpoint(ckpt)
    return model.state_dict()


def reference(tmp_path: Path, **kw) -> Path:
    """One process, 8 x 2 accumulated = the global batch of every DCP_LAYOUT, 4 steps (two
    epochs of 2), full checkpoints at 2 and 4."""
    out = tmp_path / "ref"
    train(config_for(out, "pretrain", **{"batch_size": 8, "max_steps": 4, "ckpt_interval": 2,
                                         **kw}), data=data_for("pretrain"))
    return out / "run"


def assert_continues(run: Path, ref: Path, atol: float = 1e-5) -> None:
    """Losses, learning rates and final weights of `run` equal the uninterrupted `ref`."""
    torch.testing.assert_close(losses(run), losses(ref), atol=atol, rtol=0)
    assert metric(run, "lr") == metric(ref, "lr")
    assert metric(run, "step") == [1, 2, 3, 4]
    w, w_ref = state(run / "checkpoints" / "step_4"), state(ref / "checkpoints" / "step_4")
    assert w.keys() == w_ref.keys()
    for k in w_ref:
        torch.testing.assert_close(w[k], w_ref[k], atol=atol, rtol=0, msg=k)


def test_one_process_dcp_equals_full_and_async_resumes_exactly(tmp_path):
    """One process: a DCP checkpoint holds exactly the full checkpoint's weights (read by
    load_checkpoint, the loader of chat/export/serve/eval); an async run's step_2 is the
    state of step 2 although steps 3.. ran while it was written; a run stopped after step
    3 resumes bit-identically."""
    ref = reference(tmp_path, **DCP_LAYOUT["none"])  # the same layout: bit-identical
    run = tmp_path / "dcp"
    dcp_cut(run, "none", async_checkpoint=True)
    ckpts = run / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_3"]
    names = {p.name for p in (ckpts / "step_2").iterdir()}
    assert {"dcp", "config.json", "meta.json", "scheduler.pt", "trainer_state.pt"} <= names
    assert not names & {"model.safetensors", "optimizer.pt"}
    for k, v in state(ref / "checkpoints" / "step_2").items():
        assert torch.equal(state(ckpts / "step_2")[k], v), k
    opt = read_tensors(ckpts / "step_2", prefix="optimizer.state.")
    assert "embed_tokens.weight.exp_avg" in opt  # optimizer moments, keyed by name
    summary = resume(run / "run", data=data_for("pretrain"))
    assert summary.resumed_from.endswith("step_3") and summary.steps == 4
    assert losses(run / "run") == losses(ref) and metric(run / "run", "lr") == metric(ref, "lr")
    for k, v in state(ref / "checkpoints" / "step_4").items():
        assert torch.equal(state(ckpts / "step_4")[k], v), k


def test_resume_refuses_another_global_batch(tmp_path):
    run = tmp_path / "dcp"
    dcp_cut(run, "none")
    with pytest.raises(ConfigError, match="global batch"):
        resume(run / "run", data=data_for("pretrain"),
               layout={"parallel": "ddp", "nprocs": 2, "batch_size": 8, "grad_accum_steps": 2})


def test_reshard_two_to_one_and_one_to_two_processes(tmp_path):
    """Resharding on 2 gloo processes, global batch 16 kept (2 x 4 x accumulation 2 =
    1 x 4 x accumulation 4, so a step's micro-batch count changes too): an async fsdp run
    of 2 processes cut after step 3 continues as 1 process (`none`); a 1-process run
    continues as 2-process ddp. Each equals the uninterrupted run: losses within fp32
    tolerance, the same learning rates, the same weights; so no sample was skipped or
    repeated and the schedule went on."""
    ref = reference(tmp_path)
    dcp_cut(tmp_path / "none_1", "none")
    res = run_workers(dcp_scenarios, (str(tmp_path), ["cut:fsdp_b:fsdp", "resume:none_1:ddp"]),
                      nprocs=2)
    step2 = tmp_path / "fsdp_b" / "run" / "checkpoints" / "step_2" / "dcp"
    shards = sorted(p.name for p in step2.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
    sizes = [(step2 / s).stat().st_size for s in shards]
    assert min(sizes) > 0.3 * max(sizes), sizes  # halves of the model, not one gathered copy
    resume(tmp_path / "fsdp_b" / "run", data=data_for("pretrain"), layout=DCP_LAYOUT["none"])
    for where in ("fsdp_b", "none_1"):
        assert_continues(tmp_path / where / "run", ref)
    assert res[0]["resume:none_1:ddp"].endswith("step_3")


@pytest.mark.slow
def test_reshard_between_fsdp_and_ddp_and_from_a_full_checkpoint(tmp_path):
    """The rest of the matrix: fsdp -> ddp and ddp -> fsdp on 2 processes, and a full
    (model.safetensors) checkpoint of 1 process continued as 2-process ddp."""
    ref = reference(tmp_path)
    dcp_cut(tmp_path / "full_1", "none", fmt="full")
    names = ["cut:fsdp_a:fsdp", "cut:ddp_a:ddp", "resume:fsdp_a:ddp", "resume:ddp_a:fsdp",
             "resume:full_1:ddp"]
    res = run_workers(dcp_scenarios, (str(tmp_path), names), nprocs=2)
    for where in ("fsdp_a", "ddp_a", "full_1"):
        assert_continues(tmp_path / where / "run", ref)
    assert all(res[0][n].endswith("step_3") for n in names if n.startswith("resume"))


KILLED_RUN = """
import sys, time
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter

real, calls = FileSystemWriter.write_data, []


def slow(self, plan, planner):  # the second save (step 2) hangs while writing its shards
    calls.append(1)
    if len(calls) == 2:
        Path(sys.argv[2]).write_text("writing")
        time.sleep(300)
    return real(self, plan, planner)


FileSystemWriter.write_data = slow
from tests.train.dist_helpers import config_for, data_for
from astrai.train import train

train(config_for(Path(sys.argv[1]), "pretrain", batch_size=8, max_steps=4, ckpt_interval=1,
                 checkpoint_format="dcp", async_checkpoint=True, ckpt_dir=sys.argv[3]),
      data=data_for("pretrain"))
"""


def test_kill_9_during_async_save_keeps_the_last_checkpoint(tmp_path):
    """A real `kill -9` while the background save of step 2 is writing its shards (the
    training thread has gone on to step 3): step_1 stays complete, no step_2 appears, the
    user's own step_9 in --ckpt-dir is untouched, and resume continues exactly."""
    import os
    import signal
    import subprocess
    import sys
    import time

    ref = reference(tmp_path)
    ckpt_dir, flag = tmp_path / "ck", tmp_path / "writing"
    (ckpt_dir / "step_9").mkdir(parents=True)
    (ckpt_dir / "step_9" / "notes.txt").write_text("mine")
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "kill"), str(flag),
                             str(ckpt_dir)], env=env, cwd=root)
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), "the run never reached its second save"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    names = sorted(p.name for p in ckpt_dir.iterdir())
    assert names == [".step_2.tmp-dcp", "step_1", "step_9"], names
    assert state(ckpt_dir / "step_1")  # complete and loadable
    summary = resume(tmp_path / "kill" / "run", data=data_for("pretrain"))
    assert summary.resumed_from.endswith("step_1") and summary.steps == 4
    assert losses(tmp_path / "kill" / "run") == losses(ref)
    assert (ckpt_dir / "step_9" / "notes.txt").read_text() == "mine"
    assert not (ckpt_dir / ".step_2.tmp-dcp").exists()  # the torn save was cleaned


@pytest.fixture
def dcp_run(tmp_path):
    run = tmp_path / "dcp"
    dcp_cut(run, "none")
    return run / "run"


def test_damaged_dcp_checkpoint_is_one_line_naming_the_file(dcp_run):
    """A truncated .metadata, a missing or truncated shard: one CheckpointError naming the
    file and what to do, from the loader and from resume (which names the older one)."""
    step3 = dcp_run / "checkpoints" / "step_3"
    shard = step3 / "dcp" / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"__0_0.distcp: truncated shard") as e:
        load_checkpoint(step3)
    assert "\n" not in str(e.value) and "copy the whole checkpoint" in str(e.value)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"__0_0.distcp: missing shard") as e:
        resume(dcp_run, data=data_for("pretrain"))
    assert "step_2" in str(e.value) and "\n" not in str(e.value)  # resume from the older one
    meta = step3 / "dcp" / ".metadata"
    meta.write_bytes((dcp_run / "checkpoints" / "step_2" / "dcp" / ".metadata").read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r"\.metadata: truncated or damaged") as e:
        read_metadata(step3)
    assert "\n" not in str(e.value)


class _Evil:
    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.flag}",)


def test_crafted_metadata_runs_no_code(dcp_run, tmp_path):
    """.metadata is a pickle; DCP's own reader would run what it names. Ours refuses."""
    flag = tmp_path / "pwned"
    meta = dcp_run / "checkpoints" / "step_3" / "dcp" / ".metadata"
    meta.write_bytes(pickle.dumps(_Evil(flag)))
    with pytest.raises(CheckpointError, match="refused global"):
        load_checkpoint(meta.parent.parent)
    assert not flag.exists()


def test_convert_both_ways(dcp_run, tmp_path):
    """DCP -> full -> DCP: the same weights and optimizer moments each way, and the full
    one resumes like the original."""
    from astrai.model.dcp_format import read_optimizer
    from astrai.train.convert_checkpoint import convert_checkpoint

    src = dcp_run / "checkpoints" / "step_3"
    assert convert_checkpoint(src, tmp_path / "full") == "full"
    assert convert_checkpoint(tmp_path / "full", tmp_path / "back") == "dcp"
    for k, v in state(src).items():
        assert torch.equal(state(tmp_path / "full")[k], v), k
        assert torch.equal(state(tmp_path / "back")[k], v), k
    opt = torch.load(tmp_path / "full" / "optimizer.pt", weights_only=True)
    again = read_optimizer(tmp_path / "back")
    assert opt["param_names"] == again["param_names"] and "embed_tokens.weight" in opt["param_names"]
    for i, s in opt["state"].items():
        for key, t in s.items():
            assert torch.equal(again["state"][i][key], t), (i, key)
    assert opt["param_groups"] == again["param_groups"]
    from astrai.inspect.next_update import read_optimizer_state  # inspect-weights' reader

    assert read_optimizer_state(tmp_path / "back")["param_names"] == opt["param_names"]
    with pytest.raises(CheckpointError, match="already exists"):
        convert_checkpoint(src, tmp_path / "full")


def dcp_round_trip(tmp_path: Path, device: str) -> None:
    """fsdp (a group of one) on `device` with async DCP saves, cut after step 3 and resumed:
    the straight run's losses and weights; then `astrai export --format hf` of the DCP
    checkpoint holds those weights."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from astrai_cli.main import app

    from .dist_helpers import Interrupt, StopAfterStep

    kw = {"device": device, "precision": "fp32", "parallel": "fsdp", "max_steps": 4,
          "ckpt_interval": 2, "batch_size": 8, "async_checkpoint": True}
    train(config_for(tmp_path / "a", "pretrain", **kw), data=data_for("pretrain"))
    with pytest.raises(Interrupt):
        train(config_for(tmp_path / "b", "pretrain", **kw), data=data_for("pretrain"),
              callbacks=[StopAfterStep(3)])
    assert resume(tmp_path / "b" / "run", data=data_for("pretrain")).resumed_from.endswith(
        "step_3")
    a, b = (tmp_path / x / "run" for x in "ab")
    torch.testing.assert_close(losses(b), losses(a), atol=1e-4, rtol=0)
    ckpt = b / "checkpoints" / "step_4"
    assert (ckpt / "dcp" / ".metadata").is_file()
    w = state(ckpt)
    for k, v in state(a / "checkpoints" / "step_4").items():
        torch.testing.assert_close(w[k], v, atol=1e-4, rtol=0, msg=k)
    r = CliRunner().invoke(app, ["export", str(ckpt), str(tmp_path / "hf"), "--format", "hf"])
    assert r.exit_code == 0, r.output
    hf = load_file(tmp_path / "hf" / "model.safetensors")
    assert torch.equal(hf["model.embed_tokens.weight"], w["embed_tokens.weight"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dcp_save_async_resume_export(tmp_path):
    """The DCP path on one GPU (scripts/gpu_check.sh runs it): CUDA tensors staged to host
    by the async save, a nccl group of one beside the checkpoints' gloo group."""
    dcp_round_trip(tmp_path, "cuda")


def test_a_users_step_dir_is_never_replaced(tmp_path):
    """A DCP save whose step_N would replace a directory the trainer did not write stops
    with one line naming it; the directory and its files stay, no temporary is left."""
    ckpt_dir = tmp_path / "ck"
    (ckpt_dir / "step_2").mkdir(parents=True)
    (ckpt_dir / "step_2" / "notes.txt").write_text("mine")
    cfg = config_for(tmp_path / "r", "pretrain", batch_size=8, max_steps=4, ckpt_interval=2,
                     checkpoint_format="dcp", ckpt_dir=str(ckpt_dir))
    with pytest.raises(CheckpointError, match="step_2: exists and was not written") as e:
        train(cfg, data=data_for("pretrain"))
    assert "\n" not in str(e.value)
    assert (ckpt_dir / "step_2" / "notes.txt").read_text() == "mine"
    assert not list(ckpt_dir.glob(".step_*"))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_disk_full_during_a_dcp_save_is_one_line(asynchronous, tmp_path, monkeypatch):
    """ENOSPC while the shards are written (blocking or in the background): one line
    naming the step, the free space and the last good checkpoint; no temporary is left."""
    import errno

    from torch.distributed.checkpoint import FileSystemWriter

    real, calls = FileSystemWriter.write_data, []

    def full(self, plan, planner):
        calls.append(1)
        if len(calls) >= 2:  # from the save of step 2 on; step 1 is written
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", full)
    cfg = config_for(tmp_path / "r", "pretrain", batch_size=8, max_steps=4, ckpt_interval=1,
                     checkpoint_format="dcp", async_checkpoint=asynchronous)
    with pytest.raises(CheckpointError, match="disk full while saving checkpoint step_2") as e:
        train(cfg, data=data_for("pretrain"))
    assert "\n" not in str(e.value) and "step_1" in str(e.value)
    ckpts = tmp_path / "r" / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_1"]


def test_a_damaged_shard_is_one_line_on_resume(dcp_run):
    """Shards of the right length but garbage contents: resume names the directory and
    the older checkpoint instead of a traceback."""
    shard = dcp_run / "checkpoints" / "step_3" / "dcp" / "__0_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    with pytest.raises(CheckpointError, match=r"step_3/dcp: unreadable shards") as e:
        resume(dcp_run, data=data_for("pretrain"))
    assert "\n" not in str(e.value) and "step_2" in str(e.value)
    assert "weights_only" not in str(e.value)  # the reason, never the advice to load unsafely
