"""RolloutRunner: prompts -> G sampled responses each -> rewards (online RL,
docs/alignment.md).

The runner renders prompts through the tokenizer's chat template (datasets of kind grpo
already hold rendered prompt ids), generates through the inference engine (paged KV,
continuous batching, radix prefix sharing between the G samples of a prompt) with each
token's log-prob, and scores the decoded completions with a reward function.

A fresh Engine serves each call: its KV pool never holds keys/values computed with older
weights (the policy changes between rollouts), and the engine reads the live policy
weights, so nothing is copied. Each request has its own sampling seed derived from
(seed, key, request index), so a rollout is reproducible whatever else is batched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from astrai.config.alignment import GROUP_SIZE, RolloutOptions
from astrai.errors import ConfigError
from astrai.train.rewards.base import check_scores
from astrai.train.rollout.batch import Rollout
from astrai.train.strategies.logprobs import unwrap


def request_seed(seed: int, key: int, index: int) -> int:
    """A 62-bit sampling seed for request `index` of rollout `key`."""
    h = hashlib.blake2b(f"{seed}/{key}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2


def prompt_lists(prompts: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded prompts [N, P] + mask -> N lists of token ids."""
    return [row[m.bool()].tolist() for row, m in zip(prompts.cpu(), prompt_mask.cpu())]


class RolloutRunner:
    def __init__(self, model: nn.Module, tokenizer: Any = None,
                 reward: Callable[..., list[float]] | None = None,
                 config: RolloutOptions | None = None, *, group_size: int = GROUP_SIZE,
                 seed: int = 0) -> None:
        """model: the policy (a DDP wrapper is unwrapped; FSDP-sharded weights cannot be
        served). tokenizer: astrai Tokenizer (None: token ids only, empty texts).
        reward: (prompts, completions, **record) -> list[float]; None scores 0.
        config: how to sample (TrainConfig's alignment.rollout section, the --rollout-*
        options); group_size: responses per prompt; seed: base of the per-request seeds."""
        self.model, self.tokenizer, self.reward = model, tokenizer, reward
        self.config = config or RolloutOptions()
        self.group_size, self.seed = group_size, seed

    # -- prompts -----------------------------------------------------------------------------
    def render(self, prompts: Sequence[str | Sequence[dict]]) -> list[list[int]]:
        """Chat-template token ids (generation prompt appended) of user prompts given as
        text or as message lists."""
        from astrai.data.chat_ids import conversation_ids

        if self.tokenizer is None:
            raise ConfigError("rendering prompts needs a tokenizer")
        out = []
        for p in prompts:
            msgs = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
            out.append(conversation_ids(self.tokenizer, msgs, add_generation_prompt=True).ids)
        return out

    # -- generation ----------------------------------------------------------------------------
    def _engine(self, n_requests: int, longest: int, max_tokens: int):
        from astrai.infer import CacheConfig, Engine, SchedulerConfig

        model = unwrap(self.model)
        ctx = min(model.config.max_seq_len, longest + max_tokens)
        page = 16
        rows = max(1, min(n_requests, self.config.max_requests or n_requests))
        kv_tokens = rows * (-(-ctx // page) + 1) * page
        cache = CacheConfig(mode="paged", page_size=page, max_kv_tokens=kv_tokens,
                            max_requests=rows, max_context=ctx)
        sched = SchedulerConfig(max_running=rows, max_step_tokens=max(2048, ctx))
        return Engine(model, self.tokenizer, cache, scheduler_config=sched,
                      seed=self.seed), ctx

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], *,
                 references: Sequence[str] | None = None, key: int = 0,
                 greedy: bool = False, group_size: int | None = None,
                 max_tokens: int | None = None, score: bool = True) -> Rollout:
        """G responses per prompt (G = group_size, 1 when greedy), scored unless
        score=False. `key` distinguishes the rollouts of a run (the sampling seeds)."""
        from astrai.infer import SamplingParams

        c = self.config
        G = 1 if greedy else (group_size or self.group_size)
        max_new = max_tokens or c.max_tokens
        prompts = [list(map(int, p)) for p in prompt_ids]
        if not prompts or any(not p for p in prompts):
            raise ConfigError("rollout: every prompt needs at least one token")
        model = unwrap(self.model)
        was_training = model.training
        engine, ctx = self._engine(len(prompts) * G, max(len(p) for p in prompts), max_new)
        # keep room for at least one generated token: cut over-long prompts from the left
        prompts = [p[-(ctx - 1):] for p in prompts]
        reqs, params = [], []
        for i, p in enumerate(prompts):
            for g in range(G):
                reqs.append(p)
                if greedy:
                    params.append(SamplingParams(max_tokens=max_new, temperature=0.0))
                else:
                    params.append(SamplingParams(
                        max_tokens=max_new, temperature=c.temperature, top_p=c.top_p,
                        top_k=c.top_k, logprobs=True,
                        seed=request_seed(self.seed, key, i * G + g)))
        try:
            outs = engine.generate(reqs, params)
        finally:
            model.train(was_training)
        rollout = Rollout(
            prompt_ids=prompts, group_size=G,
            completion_ids=[list(o.token_ids) for o in outs],
            logprobs=[list(o.logprobs or []) for o in outs],
            texts=[o.text for o in outs],
            finish_reasons=[o.finish_reason or "length" for o in outs],
            references=list(references) if references is not None else None,
        )
        if score:
            self.score(rollout)
        return rollout

    def score(self, rollout: Rollout) -> torch.Tensor:
        """Fill rollout.rewards [N, G] with the reward function's scores."""
        N, G = rollout.num_prompts, rollout.group_size
        if self.reward is None:
            rollout.rewards = torch.zeros(N, G)
            return rollout.rewards
        texts = self.prompt_texts(rollout.prompt_ids)
        prompts = [texts[j // G] for j in range(N * G)]
        scores = self.reward(prompts, rollout.texts, **rollout.record())
        name = getattr(self.reward, "__name__", type(self.reward).__name__)
        rollout.rewards = torch.tensor(check_scores(name, scores, N * G),
                                       dtype=torch.float32).view(N, G)
        return rollout.rewards

    def prompt_texts(self, prompt_ids: Sequence[Sequence[int]]) -> list[str]:
        """The prompts as the model saw them (special tokens kept)."""
        if self.tokenizer is None:
            return ["" for _ in prompt_ids]
        return [self.tokenizer.decode(p, skip_special_tokens=False) for p in prompt_ids]
