"""RolloutRunner and RolloutCache: engine log-probs vs teacher forcing, reproducible
sampling, chat rendering, reward records, refresh cadence, best/worst pairs."""

import pytest
import torch

from astrai.train.rollout import Rollout, RolloutOptions, RolloutRunner, prompt_lists
from astrai.train.rollout.cache import RolloutCache
from astrai.train.strategies.grpo import GRPOStrategy
from astrai.train.strategies.logprobs import join_prompt_response, token_logprobs
from astrai.train.strategies.online import OnlineGRPOStrategy, best_worst_pairs

from .align_util import PAD, tiny_model

PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10], [11]]


def teacher_forced(model, batch):
    B, G, R = batch["responses"].shape
    ids, mask = join_prompt_response(
        batch["prompts"].repeat_interleave(G, 0), batch["prompt_mask"].repeat_interleave(G, 0),
        batch["responses"].view(B * G, R), batch["masks"].view(B * G, R), PAD)
    with torch.no_grad():
        lp = token_logprobs(model(ids).logits, ids)
    return lp[mask[:, 1:].bool()]  # row-major: the response tokens in order


def test_rollout_logprobs_equal_teacher_forced_logprobs():
    model = tiny_model()
    runner = RolloutRunner(model, config=RolloutOptions(max_tokens=10), group_size=3, seed=5)
    ro = runner.generate(PROMPTS, key=0)
    assert model.training  # the runner restores the mode the engine changed
    assert len(ro.completion_ids) == 9 and all(len(c) == 10 for c in ro.completion_ids)
    batch = ro.to_batch(PAD)
    gen = batch["gen_logps"][batch["masks"].bool()]
    tf = teacher_forced(model, batch)
    assert gen.shape == tf.shape == (90,)
    torch.testing.assert_close(gen, tf, atol=1e-4, rtol=0)
    # prompts are left-padded and end where generation starts
    assert prompt_lists(batch["prompts"], batch["prompt_mask"]) == PROMPTS


def test_sampling_is_reproducible_per_key_and_batch_independent():
    model = tiny_model()
    runner = RolloutRunner(model, config=RolloutOptions(max_tokens=6), group_size=2, seed=1)
    a = runner.generate(PROMPTS, key=7, score=False)
    b = runner.generate(PROMPTS, key=7, score=False)
    c = runner.generate(PROMPTS, key=8, score=False)
    assert a.completion_ids == b.completion_ids != c.completion_ids
    assert a.completion_ids[0] != a.completion_ids[1]  # the group's samples differ
    # fewer requests decoded at once: same tokens (per-request seeds)
    narrow = RolloutRunner(model, config=RolloutOptions(max_tokens=6, max_requests=2),
                           group_size=2, seed=1)
    assert narrow.generate(PROMPTS, key=7, score=False).completion_ids == a.completion_ids
    greedy = runner.generate(PROMPTS, greedy=True, score=False)
    assert greedy.group_size == 1 and len(greedy.completion_ids) == 3


def test_chat_rendering_rewards_and_records(tmp_path):
    from astrai.data.testing import tiny_tokenizer

    tok = tiny_tokenizer(tmp_path)
    calls = []

    def reward(prompts, completions, **record):
        calls.append((prompts, completions, record))
        return [float(len(c)) for c in completions]

    model = tiny_model(vocab_size=tok.vocab_size)
    runner = RolloutRunner(model, tok, reward, RolloutOptions(max_tokens=5), group_size=2)
    ids = runner.render(["What is 2 + 3?", [{"role": "user", "content": "Hi"}]])
    assert ids[0] == tok.encode_chat([{"role": "user", "content": "What is 2 + 3?"}],
                                     add_generation_prompt=True)
    ro = runner.generate(ids, references=["5", "hello"], key=1)
    prompts, comps, record = calls[-1]
    assert len(prompts) == len(comps) == 4 and prompts[0] == prompts[1] != prompts[2]
    assert "What is 2 + 3?" in prompts[0] and prompts[0].endswith("assistant\n")
    assert comps == ro.texts
    assert record["reference"] == ["5", "5", "hello", "hello"]
    assert record["group"] == [0, 0, 1, 1]
    assert record["completion_ids"] == ro.completion_ids
    assert record["prompt_ids"][2] == ids[1]
    assert set(record["finish_reason"]) <= {"stop", "length"}
    assert ro.rewards.tolist() == [[len(comps[0]), len(comps[1])], [len(comps[2]),
                                                                    len(comps[3])]]


class FakeRunner:
    """Counts generations; each rollout's rewards say which call made it."""

    def __init__(self, G=2):
        self.calls, self.G = [], G

    def generate(self, prompt_ids, references=None, key=0, **kw):
        self.calls.append(key)
        n = len(prompt_ids)
        return Rollout(prompt_ids=prompt_ids, group_size=self.G,
                       completion_ids=[[20 + key, 21]] * (n * self.G),
                       logprobs=[[-1.0, -1.0]] * (n * self.G),
                       texts=["x"] * (n * self.G), finish_reasons=["stop"] * (n * self.G),
                       rewards=torch.full((n, self.G), float(key)), references=references)


def prompt_batch(first):
    return {"prompts": torch.tensor([[0, first, first + 1], [first + 2, first + 3, first + 4]]),
            "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}


def test_cache_refreshes_every_rollout_interval_windows():
    runner = FakeRunner()
    cache = RolloutCache(runner, rollout_interval=2, grad_accum_steps=2)
    seen = []
    for i in range(8):  # 4 windows of 2 micro-batches
        batch = prompt_batch(10 * i + 1)
        entry, fresh = cache.attach(batch)
        seen.append((fresh, int(batch["rewards"][0, 0]), batch["prompts"][0, -1].item()))
        assert cache.attach(batch)[0] is entry  # attaching twice is a no-op
    # windows 0 and 2 roll out (keys 0,1 then 4,5); windows 1 and 3 reuse slot by slot
    assert runner.calls == [0, 1, 4, 5]
    assert [s[:2] for s in seen] == [(True, 0), (True, 1), (False, 0), (False, 1),
                                     (True, 4), (True, 5), (False, 4), (False, 5)]
    assert seen[2][2] == seen[0][2] == 2  # a reused rollout brings its own prompts
    # the state restores the counter and the cached rollouts
    again = RolloutCache(FakeRunner(), rollout_interval=2, grad_accum_steps=2)
    state = cache.state_dict()
    cache.attach(prompt_batch(99))  # window 4 (fresh)
    again.load_state_dict(state)
    b = prompt_batch(99)
    again.attach(b)
    assert again.runner.calls == [8] and again.calls == 9


def test_best_and_worst_responses_make_the_pairs():
    batch = {"prompts": torch.tensor([[0, 5, 6], [7, 8, 9]]),
             "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
             "responses": torch.tensor([[[11, 12], [13, 0], [14, 15]], [[16, 0], [17, 0],
                                                                         [18, 0]]]),
             "masks": torch.tensor([[[1, 1], [1, 0], [1, 1]], [[1, 0], [1, 0], [1, 0]]]),
             "rewards": torch.tensor([[0.5, 1.0, 0.0], [1.0, 1.0, 1.0]])}
    pairs = best_worst_pairs(batch, PAD)
    assert pairs["chosen"].tolist() == [[5, 6, 13, 0, 0]]  # the tied group gives no pair
    assert pairs["rejected"].tolist() == [[5, 6, 14, 15, 0]]
    assert pairs["chosen_mask"].tolist() == [[0, 0, 1, 0, 0]]
    assert pairs["rejected_mask"].tolist() == [[0, 0, 1, 1, 0]]


def test_online_grpo_syncs_old_policy_on_each_fresh_rollout():
    model = tiny_model()

    def reward(prompts, completions, completion_ids, **_):
        return [float(c[0] % 2) for c in completion_ids]  # even/odd first token

    strat = OnlineGRPOStrategy(
        model, reward=reward, rollout=RolloutOptions(max_tokens=4), group_size=4, seed=3,
        rollout_interval=2, kl_coef=0.0, pad_id=PAD)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ratios = []
    for i in range(3):
        batch = {"prompts": torch.tensor([[3, 4, 5]]), "prompt_mask": torch.ones(1, 3).long()}
        units = strat.loss_units(batch)
        out = strat(batch, normalizer=units)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        strat.on_optimizer_step()
        ratios.append(out["metrics"]["grpo_ratio_mean"])
        if i == 0:
            assert out["metrics"]["grpo_logp_gap"] < 1e-4  # engine vs trainer forward
            assert out["metrics"]["reward_std"] > 0
    # fresh, reused (old policy = the one that sampled), fresh again
    assert ratios[0] == 1.0 and ratios[2] == 1.0
    assert ratios[1] != pytest.approx(1.0, abs=1e-5)
    assert strat.rollouts.rollouts == 2
    assert isinstance(strat, GRPOStrategy) and strat.old_model is None


def test_runner_defaults_are_the_train_configs_rollout_section():
    """One set of rollout defaults: the runner's are TrainConfig's alignment.rollout."""
    from astrai.config.train import TrainConfig

    runner, cfg = RolloutRunner(tiny_model()), TrainConfig()
    assert runner.config == cfg.alignment.rollout
    assert (runner.group_size, runner.seed) == (cfg.alignment.group_size, 0)
    assert isinstance(cfg.alignment.rollout, RolloutOptions)
