"""Rewards for online RL: rule rewards, user callables, reward-model scores.

    reward = build_reward(["exact", "length:64"], weights=[1.0, 0.1])
    scores = reward(prompts, completions, reference=refs, completion_ids=ids)

The callable protocol and the spec grammar are documented in base.py and docs/alignment.md.
"""

from astrai.train.rewards.base import (
    CombinedReward,
    RewardFn,
    build_reward,
    check_scores,
    load_reward,
)
from astrai.train.rewards.rules import (
    exact_match,
    length_penalty,
    numeric_match,
    parse_number,
    regex_reward,
)
from astrai.train.rewards.user import load_user_reward

__all__ = [
    "CombinedReward", "RewardFn", "build_reward", "check_scores", "exact_match",
    "length_penalty", "load_reward", "load_user_reward", "numeric_match", "parse_number",
    "regex_reward",
]
