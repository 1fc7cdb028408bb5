"""dpo / reward / online-grpo / online-dpo end to end through the `astrai` CLI on a tiny
model: metrics, checkpoints, exact resume (reference rebuilt, rollout cache restored), a
reward checkpoint used as `--reward model:DIR`, and one-line errors for bad rewards."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from astrai.data.testing import tiny_dataset
from astrai_cli.main import app

runner = CliRunner()
MODEL = ["--model", "tiny", "--model-overrides", "dim=32", "--model-overrides", "n_layers=1",
         "--model-overrides", "n_heads=2", "--model-overrides", "n_kv_heads=1",
         "--model-overrides", "head_dim=16", "--model-overrides", "ffn_dim=64"]
COMMON = ["--batch-size", "2", "--device", "cpu", "--peak-tflops", "1", "--max-lr", "3e-3",
          "--warmup-steps", "0", "--log-interval", "1"]
ROLLOUT = ["--group-size", "3", "--rollout-max-tokens", "6", "--eval-max-tokens", "4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("align")
    out = {kind: tiny_dataset(tmp, kind, n=16, n_val=4, max_seq_len=48) for kind in ("dpo",
                                                                                      "grpo")}
    out["offline"] = tiny_dataset(tmp, "grpo", n=16, n_val=4, max_seq_len=48, offline=True)
    return out


def run(*args):
    result = runner.invoke(app, [*map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def weights(ckpt):
    return load_file(str(Path(ckpt) / "model.safetensors"))


def test_online_grpo_cli_and_exact_resume(data, tmp_path):
    args = ["train", "--strategy", "online-grpo", "--data", data["grpo"], *MODEL, *COMMON,
            *ROLLOUT, "--max-steps", "4", "--rollout-interval", "3", "--reward", "exact",
            "--reward", "length:3", "--reward-weights", "1", "--reward-weights", "0.5",
            "--eval-max-batches", "1"]
    run(*args, "--out", tmp_path / "a", "--ckpt-interval", "0", "--json")
    recs = metrics(tmp_path / "a")
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for key in ("grpo_loss", "reward", "reward_std", "kl",
                "clip_ratio/region_mean", "grpo_ratio_mean", "grpo_rollout_len"):
        assert key in recs[0], key
    # the length penalty makes rewards negative: the reward is the weighted sum
    assert recs[0]["reward"] < 0
    # steps 1 and 4 start on fresh rollouts (ratio 1); 2 and 3 reuse step 1's rollout
    assert recs[0]["grpo_ratio_mean"] == 1.0 and recs[3]["grpo_ratio_mean"] == 1.0
    assert recs[1]["grpo_ratio_mean"] != 1.0 and "grpo_logp_gap" in recs[0]
    assert recs[0]["grpo_logp_gap"] < 1e-4
    assert "val_reward" in recs[-1] and "val_accuracy" in recs[-1]
    # interrupted after step 2 (mid-interval: step 3 trains on the cached rollout)
    run(*args, "--out", tmp_path / "b", "--ckpt-interval", "2", "--keep-last", "0")
    b = tmp_path / "b" / "checkpoints"
    import shutil

    shutil.rmtree(b / "step_4")
    run("resume", tmp_path / "b")
    want = weights(tmp_path / "a" / "checkpoints" / "step_4")
    got = weights(b / "step_4")
    for k in want:
        assert torch.equal(want[k], got[k]), k
    assert metrics(tmp_path / "b")[2]["grpo_loss"] == recs[2]["grpo_loss"]


def test_online_dpo_cli(data, tmp_path):
    run("train", "--strategy", "online-dpo", "--data", data["grpo"], *MODEL, *COMMON, *ROLLOUT,
        "--max-steps", "2", "--reward", "regex:e", "--out", tmp_path / "run",
        "--ckpt-interval", "0", "--eval-max-batches", "1")
    recs = metrics(tmp_path / "run")
    assert len(recs) == 2
    # random completions differ in whether they hold an "e": pairs exist, DPO metrics too
    assert recs[0]["dpo_pairs"] > 0 and "rewards/margins" in recs[0] and "rewards/accuracies" in recs[0]
    # policy == reference: log 2 per pair; the loss is a mean over prompts (no pair: 0)
    assert recs[0]["dpo_loss"] == pytest.approx(0.6931 * recs[0]["dpo_pairs"], abs=1e-3)
    assert "val_reward" in recs[-1]


def test_dpo_and_reward_cli_then_model_reward(data, tmp_path):
    run("train", "--strategy", "dpo", "--data", data["dpo"], *MODEL, *COMMON, "--max-steps", "2",
        "--precompute-ref", "--dpo-loss", "ipo", "--out", tmp_path / "dpo", "--ckpt-interval", "0")
    recs = metrics(tmp_path / "dpo")
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
            "val_accuracy"} <= set(recs[-1])
    assert recs[0]["dpo_loss"] == pytest.approx(25.0, rel=1e-3)  # ipo at h = 0: (1/(2*0.1))^2
    # a reference from another checkpoint: the policy no longer equals it at step 1
    run("train", "--strategy", "dpo", "--data", data["dpo"], *MODEL, *COMMON, "--max-steps", "1",
        "--ref-model", tmp_path / "dpo" / "checkpoints" / "step_2", "--out", tmp_path / "dpo2",
        "--ckpt-interval", "0")
    assert metrics(tmp_path / "dpo2")[0]["rewards/margins"] != 0.0
    run("train", "--strategy", "reward", "--data", data["dpo"], *MODEL, *COMMON, "--max-steps",
        "2", "--out", tmp_path / "rm", "--ckpt-interval", "0")
    recs = metrics(tmp_path / "rm")
    assert {"reward_loss", "reward_accuracy", "val_accuracy", "val_loss"} <= set(recs[-1])
    rm = tmp_path / "rm" / "checkpoints" / "step_2"
    assert "score_head.weight" in weights(rm)
    run("train", "--strategy", "online-grpo", "--data", data["grpo"], *MODEL, *COMMON, *ROLLOUT,
        "--max-steps", "1", "--reward", f"model:{rm}", "--out", tmp_path / "og",
        "--ckpt-interval", "0", "--eval-max-batches", "1")
    rec = metrics(tmp_path / "og")[0]
    assert rec["reward_std"] > 0  # real-valued scores from the reward model


def test_offline_grpo_cli(data, tmp_path):
    run("train", "--strategy", "grpo", "--data", data["offline"], *MODEL, *COMMON,
        "--max-steps", "3", "--sync-interval", "2", "--out", tmp_path / "run",
        "--ckpt-interval", "0")
    recs = metrics(tmp_path / "run")
    assert {"grpo_loss", "reward", "reward_std", "kl", "clip_ratio/region_mean",
            "grpo_ratio_mean", "val_adv_logp", "val_kl"} <= set(recs[-1])
    # step 2 uses old_model = the initial policy; steps 1 and 3 follow a sync (ratio 1)
    assert [r["grpo_ratio_mean"] == 1.0 for r in recs] == [True, False, True]
    # prompts without response groups are for online-grpo
    result = runner.invoke(app, ["train", "--strategy", "grpo", "--data", str(data["grpo"]),
                                 *MODEL, "--out", str(tmp_path / "bad")])
    assert result.exit_code == 2 and "online-grpo" in result.stderr


@pytest.mark.parametrize("reward, msg", [
    ("no_such_reward_module:score", "no module named 'no_such_reward_module'"),
    ("exact:oops", "no module named 'exact'"),
    ("regex:(", "invalid regular expression"),
])
def test_bad_reward_is_one_line_exit_2_and_writes_nothing(data, tmp_path, reward, msg):
    result = runner.invoke(app, ["train", "--strategy", "online-grpo", "--data",
                                 str(data["grpo"]), *MODEL, *COMMON, "--reward", reward,
                                 "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_grpo_options_reach_the_loss(data, tmp_path):
    """--scale-rewards / --grpo-loss-type are used: at step 1 (ratio 1, no KL yet) the loss
    is -sum(A_i n_i) / units, so unscaled advantages and per-response means change it."""
    losses = {}
    for opts in (("group", "dapo"), ("none", "dapo"), ("group", "grpo")):
        out = tmp_path / "-".join(opts)
        run("train", "--strategy", "grpo", "--data", data["offline"], *MODEL, *COMMON,
            "--max-steps", "1", "--out", out, "--ckpt-interval", "0", "--scale-rewards",
            opts[0], "--grpo-loss-type", opts[1], "--eval-max-batches", "1")
        losses[opts] = metrics(out)[0]["grpo_loss"]
        cfg = json.loads((out / "train_config.json").read_text())["alignment"]
        assert (cfg["scale_rewards"], cfg["grpo_loss_type"]) == opts
    assert len(set(losses.values())) == 3
