"""--lora-rank for every strategy through the CLI (dpo, reward, grpo, online-grpo,
online-dpo; seq and sft in test_lora_train.py): only adapters move, the base stays
byte-identical, the checkpoint carries a PEFT adapter, and the DPO-family reference is the
base (policy == reference at step 1)."""

from pathlib import Path

import pytest
from safetensors.torch import load_file

from astrai.model.adapter import read_adapter_weights

from .test_online import COMMON, MODEL, ROLLOUT, data, metrics, run  # noqa: F401 - fixture

LORA = ["--lora-rank", "4", "--lora-targets", "q_proj,v_proj", "--lora-targets", "down_proj"]


def base_and_adapter(run_dir: Path, step: int):
    ckpt = run_dir / "checkpoints" / f"step_{step}"
    return load_file(ckpt / "model.safetensors"), read_adapter_weights(ckpt / "adapter")


@pytest.mark.parametrize("strategy,kind,extra", [
    ("dpo", "dpo", []),
    ("reward", "dpo", []),
    ("grpo", "offline", ["--sync-interval", "2"]),
    ("online-grpo", "grpo", [*ROLLOUT, "--reward", "length:3"]),
    ("online-dpo", "grpo", [*ROLLOUT, "--reward", "regex:e"]),
])
def test_every_strategy_trains_adapters_only(data, tmp_path, strategy, kind, extra):  # noqa: F811
    out = tmp_path / "run"
    run("train", "--strategy", strategy, "--data", data[kind], *MODEL, *COMMON, *LORA, *extra,
        "--max-steps", "2", "--ckpt-interval", "1", "--keep-last", "0", "--out", out,
        "--eval-max-batches", "1")
    (b1, a1), (b2, a2) = base_and_adapter(out, 1), base_and_adapter(out, 2)
    assert len(a1) == 2 * 3 * 1  # A, B x q, v, down x 1 layer
    frozen = [k for k in b1 if not k.startswith("score_head.")]
    assert all((b1[k] == b2[k]).all() for k in frozen)
    if strategy == "reward":  # the new score head trains beside the adapters
        assert not (b1["score_head.weight"] == b2["score_head.weight"]).all()
    assert any(not (a1[k] == a2[k]).all() for k in a1)
    rec = metrics(out)[0]
    if strategy == "dpo":  # B = 0 at step 1: policy == reference (the base) -> log 2
        assert rec["dpo_loss"] == pytest.approx(0.6931, abs=1e-3)
        assert rec["rewards/margins"] == 0.0


def test_online_grpo_lora_resumes_exactly(data, tmp_path):  # noqa: F811
    """Rollouts, the base-as-reference KL and the rollout cache come back on resume: the
    adapter after step 4 is bit-identical to an uninterrupted run's."""
    import shutil

    args = ["train", "--strategy", "online-grpo", "--data", data["grpo"], *MODEL, *COMMON,
            *ROLLOUT, *LORA, "--lora-dropout", "0.1", "--max-steps", "4",
            "--rollout-interval", "3", "--reward", "length:3", "--kl-coef", "0.1",
            "--eval-max-batches", "1", "--keep-last", "0"]
    run(*args, "--out", tmp_path / "a", "--ckpt-interval", "0")
    run(*args, "--out", tmp_path / "b", "--ckpt-interval", "2")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_4")
    run("resume", tmp_path / "b")
    f = "checkpoints/step_4/adapter/adapter_model.safetensors"
    assert (tmp_path / "b" / f).read_bytes() == (tmp_path / "a" / f).read_bytes()
    assert metrics(tmp_path / "b")[2]["grpo_loss"] == metrics(tmp_path / "a")[2]["grpo_loss"]
