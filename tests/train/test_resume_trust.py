"""`astrai resume` never imports code named only in a run directory: a run whose rewards are
Python code resumes only when the command line names the same rewards again."""

import json
import shutil

import pytest

from astrai.data.testing import tiny_dataset
from astrai.train.rewards.trust import absolute_reward, names_code

from .cli_util import invoke, one_line

MODEL = ["--model", "tiny", "--model-overrides", "dim=32", "--model-overrides", "n_layers=1",
         "--model-overrides", "n_heads=2", "--model-overrides", "n_kv_heads=1",
         "--model-overrides", "head_dim=16", "--model-overrides", "ffn_dim=64"]
ARGS = ["--batch-size", "2", "--device", "cpu", "--peak-tflops", "1", "--group-size", "2",
        "--rollout-max-tokens", "4", "--eval-max-tokens", "2", "--max-steps", "2",
        "--ckpt-interval", "1", "--keep-last", "0"]


def test_spec_kinds():
    assert not any(map(names_code, ["exact", "numeric", "regex:a:b", "length:4", "model:/x"]))
    assert names_code("mod:f") and names_code("dir/r.py:f") and names_code(" r.py:f ")
    assert absolute_reward("exact") == "exact" and absolute_reward("mod:f") == "mod:f"


def test_resume_with_code_reward_needs_it_on_the_command_line(tmp_path, monkeypatch):
    data = tiny_dataset(tmp_path, "grpo", n=8, n_val=2, max_seq_len=48)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.py").write_text("def score(prompts, completions, **kw):\n"
                                      "    return [float(len(c) % 2) for c in completions]\n")
    marker = tmp_path / "evil-ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                      "def f(prompts, completions, **kw):\n"
                                      "    return [0.0] * len(completions)\n")
    run = tmp_path / "run"
    r = invoke("train", "--strategy", "online-grpo", "--data", data, *MODEL, *ARGS,
               "--reward", "good.py:score", "--out", run)
    assert r.exit_code == 0, r.output
    good = f"{tmp_path / 'good.py'}:score"
    step1 = run / "checkpoints" / "step_1" / "meta.json"
    assert json.loads(step1.read_text())["train_config"]["alignment"]["reward"] == [good]  # absolute
    shutil.rmtree(run / "checkpoints" / "step_2")

    # without --reward: refused, naming the file, before anything is imported
    one_line(invoke("resume", run), f"file {tmp_path / 'good.py'}, function score",
             f"--reward {good}", "never runs code")
    # a run directory edited to name other code: refused, the code never runs
    meta = json.loads(step1.read_text())
    meta["train_config"]["alignment"]["reward"] = ["evil.py:f"]
    step1.write_text(json.dumps(meta))
    one_line(invoke("resume", run), f"file {tmp_path / 'evil.py'}, function f")
    # naming a reward the run was not trained with is refused too
    one_line(invoke("resume", run, "--reward", "good.py:score"), "trained with --reward",
             str(tmp_path / "evil.py"))
    assert not marker.exists()

    meta["train_config"]["alignment"]["reward"] = [good]
    step1.write_text(json.dumps(meta))
    one_line(invoke("resume", run, "--reward", "exact"), "the same rewards")
    r = invoke("resume", run, "--reward", "good.py:score", "--json")  # relative: same file
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == 2


def test_reward_flag_refused_for_runs_without_rewards(tmp_path):
    from astrai.errors import ConfigError
    from astrai.train.rewards.trust import confirm_rewards

    from .conftest import make_config

    cfg = make_config(tmp_path)
    confirm_rewards(cfg, None, "meta.json")
    with pytest.raises(ConfigError, match="takes no reward functions"):
        confirm_rewards(cfg, ["exact"], "meta.json")
