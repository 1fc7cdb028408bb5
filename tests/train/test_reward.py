"""Reward models (Bradley–Terry, scalar head, checkpoints), rule rewards, user rewards
(`--reward module:function`) and model rewards."""

import math
import textwrap

import pytest
import torch

from astrai.errors import ConfigError
from astrai.model.checkpoint import load_checkpoint, save_checkpoint
from astrai.model.reward_head import RewardModel, last_token_index
from astrai.train.rewards import (
    build_reward,
    exact_match,
    length_penalty,
    load_reward,
    numeric_match,
    parse_number,
    regex_reward,
)
from astrai.train.strategies import STRATEGIES
from astrai.train.strategies.reward import RewardStrategy, bradley_terry_loss

from .align_util import collate_pairs, preference_samples, tiny_model


# -- reward models ------------------------------------------------------------------------------
def test_bradley_terry_loss_matches_hand_computation():
    sc, sr = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([1.0, 0.5, 0.5])
    want = [-math.log(1 / (1 + math.exp(-(a - b)))) for a, b in zip(sc.tolist(), sr.tolist())]
    torch.testing.assert_close(bradley_terry_loss(sc, sr), torch.tensor(want))


def reward_model(seed=0):
    return RewardStrategy.prepare_model(tiny_model(seed), config=None)


def test_score_is_the_head_on_the_last_scored_hidden_state():
    rm = reward_model()
    assert rm.lm_head is None and "lm_head.weight" not in rm.state_dict()
    ids = torch.randint(1, 64, (3, 9))
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1, 1],
                         [0, 0, 0, 0, 1, 0, 0, 0, 0]])
    last = last_token_index(mask)
    assert last.tolist() == [4, 8, 4]
    scores = rm(ids, last_index=last).scores
    for b in range(3):  # each row alone, cut after its last token
        h = rm(ids[b:b + 1, : last[b] + 1], return_hidden=True, compute_logits=False).hidden
        want = h[0, -1] @ rm.score_head.weight[0] + rm.score_head.bias[0]
        assert scores[b].item() == pytest.approx(want.item(), abs=1e-5)


def test_reward_strategy_loss_metrics_and_learning():
    rm = reward_model()
    batch = collate_pairs(preference_samples(6, seed=4))
    strat = STRATEGIES.get("reward")(rm)
    out = strat(batch)
    sc, sr, _ = strat.scores(batch)
    want = bradley_terry_loss(sc, sr).mean()
    assert out["loss"].item() == pytest.approx(want.item(), rel=1e-6)
    assert out["metrics"]["reward_accuracy"] == pytest.approx((sc > sr).float().mean().item())
    opt = torch.optim.AdamW(rm.parameters(), lr=3e-3)
    for _ in range(10):
        loss = strat(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = strat(batch)["metrics"]
    assert after["reward_loss"] < out["metrics"]["reward_loss"] - 0.1
    assert after["reward_accuracy"] == 1.0
    ev = strat.eval_summary(strat.evaluate_batch(batch, None))
    assert ev["val_accuracy"] == 1.0 and float(ev["val_loss"]) == pytest.approx(float(after["reward_loss"]),
                                                                         rel=1e-5)
    with pytest.raises(TypeError, match="RewardModel"):
        RewardStrategy(tiny_model())


def test_reward_checkpoint_round_trip_and_model_reward(tmp_path):
    rm = reward_model(seed=3)
    save_checkpoint(tmp_path / "rm", rm.state_dict(), rm.config)
    loaded, _, _ = load_checkpoint(tmp_path / "rm")
    assert isinstance(loaded, RewardModel)
    ids = torch.randint(1, 64, (2, 7))
    last = torch.tensor([6, 3])
    torch.testing.assert_close(loaded(ids, last_index=last).scores,
                               rm(ids, last_index=last).scores)
    fn = load_reward(f"model:{tmp_path / 'rm'}")
    prompts_ids, comp_ids = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]]
    got = fn(["a", "b"], ["c", "d"], prompt_ids=prompts_ids, completion_ids=comp_ids)
    with torch.no_grad():
        want = [rm(torch.tensor([p + c]), last_index=torch.tensor([len(p + c) - 1])).scores.item()
                for p, c in zip(prompts_ids, comp_ids)]
    assert got == pytest.approx(want, abs=1e-5)
    # a language-model checkpoint is not a reward model
    lm = tiny_model()
    save_checkpoint(tmp_path / "lm", lm, lm.config)
    with pytest.raises(ConfigError, match="not a reward checkpoint"):
        load_reward(f"model:{tmp_path / 'lm'}")


# -- rule rewards -------------------------------------------------------------------------------
def test_exact_and_numeric_match():
    comps = ["42", " 42 ", "41", "The answer is 42.", "1,000", "", "-7"]
    refs = ["42", "42", "42", "42", "1000", "42", "-7"]
    assert exact_match([""] * 7, comps, reference=refs) == [1, 1, 0, 0, 0, 0, 1]
    assert numeric_match([""] * 7, comps, reference=refs) == [1, 1, 0, 1, 1, 0, 1]
    assert exact_match(["q"], ["anything"], reference=[""]) == [0.0]  # no reference
    assert parse_number("between 3 and 4.5") == 4.5 and parse_number("none") is None
    with pytest.raises(ConfigError, match="reference"):
        exact_match(["q"], ["a"])


def test_regex_and_length_rewards():
    fmt = regex_reward(r"^\d+$")
    assert fmt([""] * 3, ["12", "12 apples", "x"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="invalid regular expression"):
        regex_reward("(")
    pen = length_penalty("4")
    assert pen([""] * 3, ["", "", ""], completion_ids=[[1] * 2, [1] * 4, [1] * 10]) == \
        [0.0, 0.0, -1.5]
    assert pen([""], ["abcdef"]) == [-0.5]  # characters without token ids
    with pytest.raises(ConfigError, match="positive token count"):
        length_penalty("x")


def test_combined_weighted_reward_and_spec_errors():
    r = build_reward(["exact", "length:2"], weights=[1.0, 0.5])
    got = r(["q", "q"], ["7", "7 7 7"], reference=["7", "7"], completion_ids=[[1], [1, 1, 1, 1]])
    assert got == [1.0, 0.0 + 0.5 * -1.0]
    for bad, msg in (("nonsense", "unknown reward"), ("regex:(", "invalid regular"),
                     ("length:0", "positive")):
        with pytest.raises(ConfigError, match=msg):
            build_reward([bad])
    with pytest.raises(ConfigError, match="weights"):
        build_reward(["exact"], weights=[1.0, 2.0])


# -- user rewards ---------------------------------------------------------------------------------
def write_module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))


def test_user_reward_is_called_with_the_documented_arguments(tmp_path, monkeypatch):
    write_module(tmp_path, "my_rewards", """
        CALLS = []
        def score(prompts, completions, **record):
            CALLS.append((list(prompts), list(completions), record))
            return [float(len(c)) for c in completions]
        def narrow(prompts, completions, reference):
            return [float(c == r) for c, r in zip(completions, reference)]
        NOT_A_FUNCTION = 3
        def bad_length(prompts, completions, **record):
            return [1.0]
        def bad_value(prompts, completions, **record):
            return [float("nan")] * len(completions)
        def raises(prompts, completions, **record):
            raise ValueError("boom")
    """)
    monkeypatch.chdir(tmp_path)  # the working directory is importable, as with `astrai`
    fn = load_reward("my_rewards:score")
    record = {"reference": ["1", "2"], "prompt_ids": [[1], [2]], "completion_ids": [[3], [4, 5]],
              "group": [0, 0], "finish_reason": ["stop", "length"]}
    assert fn(["p1", "p2"], ["a", "bcd"], **record) == [1.0, 3.0]
    import my_rewards

    prompts, comps, got = my_rewards.CALLS[-1]
    assert prompts == ["p1", "p2"] and comps == ["a", "bcd"] and got == record
    # a function without **record receives only the columns it names
    assert load_reward("my_rewards:narrow")(["p"], ["1"], **{k: v[:1] for k, v in
                                                            record.items()}) == [1.0]
    # the file form needs no import path
    monkeypatch.chdir("/")
    assert load_reward(f"{tmp_path}/my_rewards.py:score")(["p"], ["xy"]) == [2.0]
    combined = build_reward([f"{tmp_path}/my_rewards.py:bad_length"])
    with pytest.raises(ConfigError, match="returned 1 scores for 2"):
        combined(["p", "q"], ["a", "b"])
    with pytest.raises(ConfigError, match="non-finite"):
        build_reward([f"{tmp_path}/my_rewards.py:bad_value"])(["p"], ["a"])
    with pytest.raises(ConfigError, match="raised ValueError: boom"):
        build_reward([f"{tmp_path}/my_rewards.py:raises"])(["p"], ["a"])


@pytest.mark.parametrize("spec, msg", [
    ("no_such_module_xyz:score", "no module named 'no_such_module_xyz'"),
    ("my_rewards2:missing", "has no attribute 'missing'"),
    ("my_rewards2:NOT_A_FUNCTION", "not a function"),
    ("my_rewards2:", "expected module:function"),
    ("broken_rewards:score", "importing 'broken_rewards' failed: ZeroDivisionError"),
    ("missing_dir/x.py:score", "not found"),
])
def test_user_reward_loading_errors_are_one_line(tmp_path, monkeypatch, spec, msg):
    write_module(tmp_path, "my_rewards2", "NOT_A_FUNCTION = 3\n")
    write_module(tmp_path, "broken_rewards", "1 / 0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=msg) as e:
        load_reward(spec)
    assert "\n" not in str(e.value) and spec in str(e.value)
