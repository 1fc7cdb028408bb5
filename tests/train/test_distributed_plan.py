"""The dry-run plan of a multi-process run, the paper's recipe and the
one-line errors of impossible parallel settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from astrai.config.train import load_train_config
from astrai.errors import ConfigError
from astrai.train import plan_run
from astrai.train.launch import LaunchOptions, run_workers

from .conftest import make_config, make_data

REPO = Path(__file__).resolve().parents[2]


def test_paper_recipe_plan():
    """examples/configs/paper-1.2b.yaml: 4 per device x 4 GPUs x 8 accumulation of 2,048
    tokens, AdamW 7.5e-6 (0.9, 0.95), wd 0.01, clip 1.0, cosine with 5% warmup, bf16
    weights with fp32 moments; the plan needs no GPU."""
    cfg = load_train_config(REPO / "examples/configs/paper-1.2b.yaml", {"device": "cpu"})
    o = cfg.optimizer
    assert (o.max_lr, o.adam_beta1, o.adam_beta2, o.weight_decay) == (7.5e-6, 0.9, 0.95, 0.01)
    assert (o.max_grad_norm, cfg.schedule.name, cfg.schedule.warmup_ratio) == (1.0, "cosine", 0.05)
    plan = plan_run(cfg, data=make_data("pretrain", n=128, T=2048))
    assert plan.world_size == 4 and plan.effective_batch == 4 * 4 * 8
    assert plan.tokens_per_step == 128 * 2048 and plan.seq_len == 2048
    assert plan.total_steps == 950_000 and plan.warmup_steps == 47_500
    assert plan.precision == "bf16-true" and plan.optimizer_state_dtype == "fp32"
    assert "1.2b" in plan.model and plan.parallel == "ddp"
    mem = plan.memory_bytes  # bf16 weights and gradients, fp32 moments
    assert mem["weights"] == mem["gradients"] == 2 * plan.params
    assert mem["optimizer"] == 8 * plan.params


def test_fsdp_plan_shards_weights_gradients_and_moments(tmp_path):
    data = make_data("pretrain", n=64)
    ddp = plan_run(make_config(tmp_path, parallel="ddp", nprocs=4), data=data)
    fsdp = plan_run(make_config(tmp_path, parallel="fsdp", nprocs=4), data=data)
    assert ddp.world_size == fsdp.world_size == 4 and ddp.total_steps == 64 // (4 * 4)
    for k in ("weights", "gradients", "optimizer"):
        assert fsdp.memory_bytes[k] == ddp.memory_bytes[k] // 4
    assert fsdp.memory_bytes["activations"] == ddp.memory_bytes["activations"]


def test_impossible_parallel_settings_are_one_line_errors(tmp_path):
    data = make_data("pretrain", n=64)
    with pytest.raises(ConfigError, match="parallel: 2 processes but parallel is 'none'"):
        plan_run(make_config(tmp_path, nprocs=2), data=data)
    with pytest.raises(ConfigError, match="unknown 'Block'"):
        plan_run(make_config(tmp_path, gradient_checkpointing_modules=["Block"]), data=data)
    with pytest.raises(ConfigError, match="--rdzv-endpoint"):
        run_workers(print, (), nprocs=1, nnodes=2, launch=LaunchOptions())


def test_impossible_launch_options_are_one_line_errors():
    """--node-rank outside the job and a negative --max-restarts fail before any
    rendezvous (no port is opened)."""
    opts = LaunchOptions(rdzv_endpoint="127.0.0.1:1", node_rank=2)
    with pytest.raises(ConfigError, match="node_rank: 2 is not a node of the 2-node job"):
        run_workers(print, (), nprocs=1, nnodes=2, launch=opts)
    with pytest.raises(ConfigError, match="max_restarts: -1 is negative"):
        run_workers(print, (), nprocs=1, nnodes=1, launch=LaunchOptions(max_restarts=-1))
