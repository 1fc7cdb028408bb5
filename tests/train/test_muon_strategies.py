"""--optimizer muon for every strategy through the CLI (seq and sft here too): two steps, and
the checkpoint's optimizer state holds a Muon momentum for each hidden matrix (q/k/v/o,
gate/up/down of the one block) and AdamW moments for everything else (embedding, head or
reward head, norms), every tensor moved."""

import pytest
import torch
from safetensors.torch import load_file

from astrai.data.testing import tiny_dataset

from .test_online import COMMON, MODEL, ROLLOUT, data, run  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    return {kind: tiny_dataset(tmp, kind, n=8, n_val=2, max_seq_len=48)
            for kind in ("pretrain", "sft")}


@pytest.mark.parametrize("strategy,kind,extra", [
    ("seq", "pretrain", []),
    ("sft", "sft", []),
    ("dpo", "dpo", []),
    ("reward", "dpo", []),
    ("grpo", "offline", ["--sync-interval", "2"]),
    ("online-grpo", "grpo", [*ROLLOUT, "--reward", "length:3"]),
    ("online-dpo", "grpo", [*ROLLOUT, "--reward", "regex:e"]),
])
def test_every_strategy_trains_with_muon(data, lm_data, tmp_path, strategy, kind,  # noqa: F811
                                         extra):
    out = tmp_path / "run"
    path = {**data, **lm_data}[kind]
    run("train", "--strategy", strategy, "--data", path, *MODEL, *COMMON, *extra,
        "--optimizer", "muon", "--max-steps", "2", "--ckpt-interval", "1", "--keep-last", "0",
        "--out", out, "--eval-max-batches", "1")
    ckpt = out / "checkpoints"
    opt = torch.load(ckpt / "step_2" / "optimizer.pt", weights_only=True)
    groups = {g["name"]: g for g in opt["param_groups"]}
    assert groups["muon"]["muon"] and len(groups["muon"]["params"]) == 7  # one block
    kinds = [frozenset(s) for s in opt["state"].values()]
    assert kinds.count(frozenset({"momentum_buffer"})) == 7
    assert kinds.count(frozenset({"step", "exp_avg", "exp_avg_sq"})) == len(kinds) - 7
    w1, w2 = (load_file(ckpt / f"step_{s}" / "model.safetensors") for s in (1, 2))
    assert all(not torch.equal(w1[k], w2[k]) for k in w1)
