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
    Interrupt,
    StopAfterStep,
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
    """One process, batch 8, 4 steps, full checkpoints at 2 and 4."""
    out = tmp_path / "ref"
    train(config_for(out, "pretrain", batch_size=8, max_steps=4, ckpt_interval=2, **kw),
          data=data_for("pretrain"))
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
    ref = reference(tmp_path)
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
               layout={"parallel": "ddp", "nprocs": 2, "batch_size": 8})


def test_reshard_fsdp_to_one_process_and_ddp_and_one_process_to_ddp(tmp_path):
    """The resharding matrix on 2 gloo processes, global batch 8 kept: an async fsdp run
    (2 processes) cut after step 3 continues as 1 process (`none`) and as 2-process ddp; a
    1-process run continues as 2-process ddp. Each equals the uninterrupted run: losses
    within fp32 tolerance, the same learning rates, the same weights; so no sample was
    skipped or repeated and the schedule went on."""
    ref = reference(tmp_path)
    dcp_cut(tmp_path / "none_1", "none")
    names = ["cut:fsdp_a:fsdp", "cut:fsdp_b:fsdp", "resume:fsdp_a:ddp", "resume:none_1:ddp"]
    res = run_workers(dcp_scenarios, (str(tmp_path), names), nprocs=2)
    step2 = tmp_path / "fsdp_b" / "run" / "checkpoints" / "step_2" / "dcp"
    shards = sorted(p.name for p in step2.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
    sizes = [(step2 / s).stat().st_size for s in shards]
    assert min(sizes) > 0.3 * max(sizes), sizes  # halves of the model, not one gathered copy
    resume(tmp_path / "fsdp_b" / "run", data=data_for("pretrain"), layout=DCP_LAYOUT["none"])
    for where in ("fsdp_a", "fsdp_b", "none_1"):
        assert_continues(tmp_path / where / "run", ref)
    assert res[0]["resume:fsdp_a:ddp"].endswith("step_3")
