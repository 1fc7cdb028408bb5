"""--tp: FSDP + tensor parallelism on a (dp, tp) mesh against one process, its resume on
another layout, the plan, and the one-line refusals.

The 4-process case runs gloo workers on CPU started by astrai's launcher; one launch runs
the straight run, the cut run and its 4 x 1 resume to pay the start-up once."""

from __future__ import annotations

import json

import pytest
import torch

from astrai.errors import ConfigError
from astrai.train import plan_run, train
from astrai.train.launch import run_workers

from .cli_util import invoke, one_line
from .conftest import make_config, make_data
from .dist_helpers import (
    TIED,
    TP_MODEL,
    data_for,
    losses,
    tp_config,
    tp_eval_data,
    tp_scenarios,
    weights,
)


def val_losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["val_loss"] for x in lines if "val_loss" in json.loads(x)]


def grad_norms(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["grad_norm"] for x in lines]


LR = 1e-4  # tp_config's peak learning rate


def assert_adam_close(w: torch.Tensor, ref: torch.Tensor, lr: float, steps: int, name: str):
    """The weights of two Adam runs whose sums differ in their last bits. Adam divides a
    near-zero gradient (an embedding row of a token seen once) by its own root-mean-square,
    so such an element can move by up to ~lr a step in one run and not in the other (2.0e-5
    after 4 steps seen on an Intel Xeon); a wrong gradient moves whole matrices by ~lr a
    step. So every element within steps · lr, and all but 1% of them within lr / 100."""
    d = (w - ref).abs()
    assert d.max().item() <= steps * lr, (name, d.max().item())
    assert (d > lr / 100).float().mean().item() <= 0.01, (name, (d > lr / 100).sum().item())


@pytest.mark.slow
def test_2x2_matches_one_process_and_resumes_as_4x1(tmp_path):
    """4 processes as dp 2 x tp 2 (batch 4 each dp group) == 1 process x batch 8: the loss
    and the global gradient norm of every step and the weights after 4 steps, within fp32
    tolerance (the all-reduces of the row-parallel layers sum in another order). A 2 x 2
    run cut after step 3 resumes from its DCP checkpoint as fsdp over 4 (no tp, batch 2)
    and continues the uninterrupted loss. A model with tied embeddings trains as one
    process does."""
    res = run_workers(tp_scenarios, (str(tmp_path),), nprocs=4)
    ref = tmp_path / "ref"
    train(tp_config(ref, "1"), data=data_for("pretrain"))
    ref = ref / "run"
    straight, cut = tmp_path / "straight" / "run", tmp_path / "cut" / "run"
    torch.testing.assert_close(losses(straight), losses(ref), atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_norms(straight), grad_norms(ref), atol=1e-6, rtol=1e-6)
    w, w_ref = weights(straight, 4), weights(ref, 4)
    assert w.keys() == w_ref.keys()
    for k in w_ref:
        assert_adam_close(w[k], w_ref[k], LR, 4, k)
    assert res[0]["resumed_from"].endswith("step_3")
    torch.testing.assert_close(losses(cut), losses(ref), atol=1e-6, rtol=0)
    # a tied embedding/head stays replicated over tp: the same run as one process too,
    # and so is its validation loss (each dp group validates its share once)
    tied = tmp_path / "tied-ref"
    train(tp_config(tied, "1", max_steps=2, model_overrides=TIED, eval_interval=1),
          data=tp_eval_data())
    torch.testing.assert_close(losses(tmp_path / "tied" / "run"), losses(tied / "run"),
                               atol=1e-6, rtol=0)
    val, val_ref = val_losses(tmp_path / "tied" / "run"), val_losses(tied / "run")
    assert len(val_ref) == 2
    torch.testing.assert_close(val, val_ref, atol=1e-6, rtol=0)
    for k, v in weights(cut, 4).items():
        assert_adam_close(v, w_ref[k], LR, 4, k)
    # the projections really are split over tp (and sharded over dp by FSDP2)
    for rank in range(4):
        got = res[rank]["layout"]
        assert got["heads"] == [2, 1]  # 4 query and 2 kv heads over tp = 2
        for name in ("q_proj", "lm_head", "embed"):  # rows: output features / vocab
            assert got[name] == (("dp", "tp"), "S(0)"), (name, got)
        for name in ("o_proj", "down_proj"):  # columns: input features
            assert got[name] == (("dp", "tp"), "S(1)"), (name, got)


def test_plan_splits_the_data_over_dp_groups(tmp_path):
    """8 processes at tp 2 are 4 data-parallel groups: the global batch and the step count
    are those of 4 processes."""
    data = make_data("pretrain", n=64)
    tp = plan_run(make_config(tmp_path, parallel="fsdp", nprocs=8, tp=2,
                              model_overrides=TP_MODEL), data=data)
    four = plan_run(make_config(tmp_path, parallel="fsdp", nprocs=4,
                                model_overrides=TP_MODEL), data=data)
    assert tp.world_size == 8 and tp.tp == 2
    assert tp.effective_batch == four.effective_batch == 4 * 4
    assert tp.total_steps == four.total_steps


@pytest.mark.parametrize(("kw", "needle"), [
    ({"nprocs": 4, "tp": 3}, "tp: 3 does not divide the 4 processes"),
    ({"nprocs": 4, "tp": 4}, "tp: 4 does not divide the model's n_kv_heads (2)"),
    ({"nprocs": 8, "tp": 8}, "tp: 8 does not divide the model's n_heads (4)"),
])
def test_impossible_tp_is_a_one_line_error(tmp_path, kw, needle):
    data = make_data("pretrain", n=64)
    cfg = make_config(tmp_path, parallel="fsdp", model_overrides=TP_MODEL, **kw)
    with pytest.raises(ConfigError) as e:
        plan_run(cfg, data=data)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cli_refuses_tp_in_one_line(tmp_path):
    """`astrai train --tp` with a tp that does not fit, without fsdp, or with Muon: one
    line, exit 2, before any process starts."""
    base = ("train", "--data", tmp_path / "none", "--model", "tiny", "--out", tmp_path / "o",
            "--device", "cpu", "--dry-run")
    one_line(invoke(*base, "--nprocs", 2, "--tp", 2), "tp:", "--parallel fsdp")
    one_line(invoke(*base, "--nprocs", 2, "--tp", 2, "--parallel", "fsdp", "--optimizer",
                    "muon"), "Muon", "--tp")
