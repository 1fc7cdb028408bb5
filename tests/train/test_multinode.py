"""Multi-node through the real CLI on one machine: two `astrai train` launches on
127.0.0.1 (each --nproc-per-node 2) rendezvous over c10d into one 4-process job (fsdp,
dp 2 x tp 2) and end with the weights of one process; and --max-restarts: a worker killed
with -9 makes the launcher restart the job, which continues from its newest checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from astrai.config.train import TrainConfig
from astrai.train import train
from astrai.train.checkpointing import list_checkpoints

from .dist_helpers import TP_MODEL, losses, weights

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from astrai.data.testing import tiny_dataset

    return tiny_dataset(tmp_path_factory.mktemp("data"), "pretrain", vocab_size=300,
                        max_seq_len=32, n=48, n_val=4)


def config(dataset, out, steps, **kw) -> dict:
    """Global batch 8 = data-parallel groups x batch x accumulation 2."""
    model = {k: v for k, v in TP_MODEL.items() if k != "max_seq_len"}
    return {"strategy": "seq", "data": str(dataset), "model": "tiny", "model_overrides": model,
            "out": str(out), "batch_size": 4, "grad_accum_steps": 2, "max_steps": steps,
            "ckpt_interval": 2, "max_lr": 1e-3, "warmup_steps": 1, "device": "cpu",
            "peak_tflops": 1.0, "seed": 7, **kw}


def reference(dataset, out, steps) -> Path:
    """The same run on one process (batch 4 x accumulation 2)."""
    train(TrainConfig.from_dict(config(dataset, out / "run", steps)))
    return out / "run"


def launch(cfg: dict, *args) -> subprocess.Popen:
    path = Path(cfg["out"]).parent / f"train-{len(list(Path(cfg['out']).parent.glob('*.json')))}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, "-m", "astrai_cli.main", "train", "--config",
                             str(path), "--json", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_weights(run, ref, step, atol):
    w, w_ref = weights(run, step), weights(ref, step)
    assert w.keys() == w_ref.keys()
    for k in w_ref:
        torch.testing.assert_close(w[k], w_ref[k], atol=atol, rtol=0, msg=k)


def test_two_launches_form_one_2x2_job(dataset, tmp_path):
    """Node 0 hosts the rendezvous store, node 1 joins it; each starts 2 workers; the job
    (fsdp, tp 2: one tp group per node, dp across the nodes) trains, exactly one node
    prints the summary (the one holding global rank 0), and the final checkpoint equals
    the one-process run's (within fp32 tolerance: the sums run in another order)."""
    steps, endpoint = 4, f"127.0.0.1:{free_port()}"
    out = tmp_path / "job"
    out.mkdir()
    cfg = config(dataset, out / "run", steps, parallel="fsdp", tp=2, batch_size=2)
    nodes = [launch(cfg, "--nnodes", 2, "--nproc-per-node", 2, "--rdzv-endpoint", endpoint,
                    "--rdzv-id", "two-nodes", "--node-rank", r) for r in (0, 1)]
    outputs = [p.communicate(timeout=600) for p in nodes]
    for p, (_, err) in zip(nodes, outputs):
        assert p.returncode == 0, err[-3000:]
    summaries = [json.loads(o) for o, _ in outputs if o.strip()]
    assert len(summaries) == 1 and summaries[0]["steps"] == steps
    ref = reference(dataset, tmp_path / "ref", steps)
    torch.testing.assert_close(losses(out / "run"), losses(ref), atol=1e-5, rtol=0)
    same_weights(out / "run", ref, steps, atol=1e-4)  # lr / 10, see test_tensor_parallel


def workers(agent: int) -> list[psutil.Process]:
    """The training workers under the launcher (its spawned children that joined)."""
    kids = psutil.Process(agent).children(recursive=True)
    return [k for k in kids if "spawn_main" in " ".join(k.cmdline())]


def test_max_restarts_continues_from_the_newest_checkpoint(dataset, tmp_path):
    """kill -9 of one worker after checkpoint step_2: the launcher stops the other and
    starts both again (--max-restarts 1); they resume from the newest complete checkpoint
    and finish with the one-process run's losses and weights."""
    steps = 24  # the kill after step_2 must land well before the end
    out = tmp_path / "job"
    out.mkdir()
    cfg = config(dataset, out / "run", steps, parallel="ddp", nprocs=2, batch_size=2)
    proc = launch(cfg, "--max-restarts", 1, "--shutdown-timeout", 5)
    run = out / "run"
    for _ in range(6000):
        if list_checkpoints(run / "checkpoints"):
            break
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    victims = workers(proc.pid)
    assert len(victims) == 2
    os.kill(victims[1].pid, signal.SIGKILL)
    out_text, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out_text)
    assert summary["steps"] == steps and summary["resumed_from"], summary
    ref = reference(dataset, tmp_path / "ref", steps)
    torch.testing.assert_close(losses(run), losses(ref), atol=1e-5, rtol=0)
    same_weights(run, ref, steps, atol=1e-4)
