"""Reward functions: the protocol, reward specs, and their weighted sum.

A reward function is any callable

    fn(prompts: list[str], completions: list[str], **record) -> list[float]

with one float per completion. The rollout runner passes these record columns (one entry
per completion): `reference` (the dataset's reference answer, "" when none),
`prompt_ids` and `completion_ids` (token ids), `group` (index of the prompt in the batch),
`finish_reason` ("stop" or "length"). Prompts are the rendered prompt text as the model
saw it (chat template included); completions are the decoded responses without the stop
token.

Specs (`--reward`, repeatable; summed with `--reward-weights`): exact, numeric,
regex:PATTERN, length:MAX_TOKENS, model:REWARD_CHECKPOINT, module:function,
path/to/file.py:function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from astrai.errors import AstraiError, ConfigError
from astrai.train.rewards.rules import exact_match, length_penalty, numeric_match, regex_reward
from astrai.train.rewards.user import load_user_reward

RewardFn = Callable[..., list[float]]
BUILTIN: dict[str, RewardFn] = {"exact": exact_match, "numeric": numeric_match}
FACTORIES = ("regex", "length", "model")
SPECS = "exact, numeric, regex:PATTERN, length:MAX_TOKENS, model:DIR or module:function"


def load_reward(spec: str, **model_kwargs: Any) -> RewardFn:
    """The reward function of one spec. model_kwargs (device, dtype,
    tokenizer_fingerprint) go to a model reward."""
    spec = spec.strip()
    if spec in BUILTIN:
        return BUILTIN[spec]
    head, sep, arg = spec.partition(":")
    if sep and head in FACTORIES:
        if head == "regex":
            return regex_reward(arg)
        if head == "length":
            return length_penalty(arg)
        from astrai.train.rewards.model_reward import ModelReward

        return ModelReward(arg, **model_kwargs)
    if sep:
        return load_user_reward(spec)
    raise ConfigError(f"--reward {spec}: unknown reward; choose {SPECS}")


def check_scores(name: str, scores: Any, n: int) -> list[float]:
    """`scores` as n finite floats, or a ConfigError naming the reward."""
    try:
        vals = [float(s) for s in scores]
    except (TypeError, ValueError):
        raise ConfigError(f"reward {name}: must return a list of numbers, got "
                          f"{type(scores).__name__}") from None
    if len(vals) != n:
        raise ConfigError(f"reward {name}: returned {len(vals)} scores for {n} completions")
    bad = [v for v in vals if not math.isfinite(v)]
    if bad:
        raise ConfigError(f"reward {name}: returned a non-finite score ({bad[0]})")
    return vals


class CombinedReward:
    """sum_k w_k * reward_k(prompts, completions, **record)."""

    def __init__(self, parts: Sequence[tuple[str, RewardFn, float]]) -> None:
        if not parts:
            raise ConfigError(f"no reward function: pass --reward ({SPECS})")
        self.parts = list(parts)

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.parts]

    def components(self, prompts: Sequence[str], completions: Sequence[str],
                   **record: Any) -> dict[str, list[float]]:
        out = {}
        for name, fn, _ in self.parts:
            try:
                scores = fn(list(prompts), list(completions), **record)
            except AstraiError:
                raise
            except Exception as e:
                raise ConfigError(f"reward {name} raised {type(e).__name__}: {e}") from e
            out[name] = check_scores(name, scores, len(completions))
        return out

    def __call__(self, prompts: Sequence[str], completions: Sequence[str],
                 **record: Any) -> list[float]:
        comps = self.components(prompts, completions, **record)
        total = [0.0] * len(completions)
        for (name, _, w) in self.parts:
            total = [t + w * v for t, v in zip(total, comps[name])]
        return total


def build_reward(specs: Sequence[str], weights: Sequence[float] | None = None,
                 **model_kwargs: Any) -> CombinedReward:
    """The weighted sum of the rewards `specs` name (weights default to 1)."""
    if weights is not None and len(weights) != len(specs):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(specs)} rewards")
    ws = list(weights) if weights is not None else [1.0] * len(specs)
    return CombinedReward([(s, load_reward(s, **model_kwargs), float(w))
                           for s, w in zip(specs, ws)])
