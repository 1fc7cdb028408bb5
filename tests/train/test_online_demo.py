"""Demonstration (slow): online RL raises held-out exact match on a verifiable task.

examples/online_rl_demo.py: a tiny model learns to repeat numbers, then a systematic
mistake (most answers end in 0), which brings its held-out greedy accuracy to <= 0.4;
online-grpo with the rule reward `exact` must win back >= 0.25 of held-out accuracy, and
online-dpo from the same start must improve it too.
"""

import importlib.util
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "online_rl_demo.py"


def load_demo():
    spec = importlib.util.spec_from_file_location("online_rl_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_online_rl_raises_heldout_accuracy(tmp_path):
    s = load_demo().run_demo(tmp_path)
    assert s["copy_accuracy"] >= 0.6  # the ability is there ...
    assert s["start_accuracy"] <= 0.4  # ... but greedy decoding mostly makes the mistake
    grpo, dpo = s["online-grpo"], s["online-dpo"]
    assert grpo["gain"] >= 0.25, grpo
    assert dpo["gain"] > 0.1, dpo
    # the rollout reward rises with it (mean of the last 10 steps vs the first 10)
    for run in (grpo, dpo):
        r = [v for _, v in run["reward"]]
        assert sum(r[-10:]) / 10 > sum(r[:10]) / 10, run["reward"]
