"""online-grpo and online-dpo: the GRPO and DPO losses on fresh rollouts of the policy
(online RL, docs/alignment.md).

Both train on grpo datasets in online mode (rendered prompts + reference answers). A
RolloutRunner generates `group_size` responses per prompt with the inference engine and
scores them with the reward (`--reward`, default exact match against the reference); the
RolloutCache refreshes them every `rollout_interval` optimizer steps.

* online-grpo: the GRPO loss. old_model is synced on each fresh rollout: the behaviour
  log-probs are the policy's own on the first pass over a rollout (taken before any update,
  so the ratio starts at exactly 1) and are kept for the later passes.
* online-dpo: per prompt, the best and the worst response make a (chosen, rejected) pair
  (a group whose rewards are all equal gives none), trained with the DPO loss against the
  frozen reference. The loss is a mean over prompts: a prompt without a pair adds 0, as a
  tied group's zero advantages do in GRPO.

Validation (held-out prompts) generates greedy answers: val_reward, and val_accuracy (exact
match with the reference) when references exist.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from astrai.config.alignment import GROUP_SIZE, RolloutOptions
from astrai.errors import ConfigError, DataError
from astrai.train.rollout.cache import RolloutCache
from astrai.train.rollout.runner import RolloutRunner
from astrai.train.strategies.base import StrategyInputs
from astrai.train.strategies.dpo import DPOStrategy, preference_metrics
from astrai.train.strategies.grpo import GRPOStrategy, _pad_id
from astrai.train.strategies.logprobs import join_prompt_response, zero_loss
from astrai.train.strategies.reference import reference_factory


def online_setup(inputs: StrategyInputs) -> dict[str, Any]:
    """The rollout pieces of an online run: tokenizer, reward, sampling, cadence."""
    from astrai.train.rewards.base import build_reward

    c, data = inputs.config, inputs.data
    if "responses" in data.dataset[0]:
        raise DataError(f"data: {data.path} holds offline response groups; online strategies "
                        "generate their own (use --strategy grpo, or preprocess prompt records "
                        "with a reference answer)")
    if c.runtime.parallel == "fsdp":
        raise ConfigError("online strategies generate with the whole policy on each process; "
                          "use --parallel none or ddp")
    tokenizer = None
    if data.tokenizer_dir is not None:
        from astrai.data.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(data.tokenizer_dir)
    a = c.alignment
    reward = build_reward(a.reward or ["exact"], a.reward_weights, device=inputs.device,
                          tokenizer_fingerprint=data.fingerprint)
    return {"tokenizer": tokenizer, "reward": reward, "rollout": a.rollout,
            "group_size": a.group_size, "seed": c.seed, "rollout_interval": a.rollout.interval,
            "grad_accum_steps": c.grad_accum_steps, "eval_max_tokens": a.eval_max_tokens,
            "pad_id": _pad_id(data),
            "reference_fn": reference_factory(inputs)}


def _cache(model: nn.Module, tokenizer: Any, reward: Any, rollout: RolloutOptions | None,
           runner: RolloutRunner | None, rollout_interval: int, grad_accum_steps: int,
           pad_id: int, group_size: int, seed: int) -> RolloutCache:
    runner = runner or RolloutRunner(model, tokenizer, reward, rollout, group_size=group_size,
                                     seed=seed)
    return RolloutCache(runner, rollout_interval=rollout_interval,
                        grad_accum_steps=grad_accum_steps, pad_id=pad_id)


class OnlineRollouts:
    """What both online strategies do with their rollout cache (`self.rollouts`): build it
    from the rollout options, validate on fresh rollouts, keep its state in every
    checkpoint. The other options go on to the GRPO / DPO strategy."""

    def __init__(self, model: nn.Module, *, tokenizer: Any = None, reward: Any = None,
                 rollout: RolloutOptions | None = None, runner: RolloutRunner | None = None,
                 group_size: int = GROUP_SIZE, seed: int = 0, rollout_interval: int = 1,
                 grad_accum_steps: int = 1, eval_max_tokens: int | None = None, pad_id: int = 0,
                 **options: Any) -> None:
        super().__init__(model, **options)
        self.pad_id = pad_id
        self.rollouts = _cache(model, tokenizer, reward, rollout, runner, rollout_interval,
                               grad_accum_steps, pad_id, group_size, seed)
        self.eval_max_tokens = eval_max_tokens

    @torch.no_grad()
    def evaluate_batch(self, batch, byte_lengths):
        return self.rollouts.evaluate(batch, self.eval_max_tokens)

    def eval_summary(self, sums):
        return RolloutCache.eval_summary(sums)

    def state_dict(self):
        return {"rollouts": self.rollouts.state_dict()}

    def load_state_dict(self, state):
        if "rollouts" in state:
            self.rollouts.load_state_dict(state["rollouts"])


class OnlineGRPOStrategy(OnlineRollouts, GRPOStrategy):
    required_keys = ("prompts", "prompt_mask")

    def __init__(self, model: nn.Module, **options: Any) -> None:
        options.pop("sync_interval", None)  # the rollout cadence decides the syncs
        super().__init__(model, sync_interval=1, **options)

    @classmethod
    def setup_kwargs(cls, inputs: StrategyInputs) -> dict[str, Any]:
        a = inputs.config.alignment
        return {**online_setup(inputs), "clip_eps": a.clip_eps, "kl_coef": a.kl_coef,
                "scale_rewards": a.scale_rewards, "loss_type": a.grpo_loss_type,
                "max_completion_length": a.rollout.max_tokens}

    def loss_units(self, batch):
        self.rollouts.attach(batch)
        return super().loss_units(batch)

    def old_logprobs(self, batch, ids, logp):
        entry = self.rollouts.entries[batch["_slot"]]
        if "old_logps" not in entry:  # first pass since the rollout: sync old_model
            entry["old_logps"] = logp.detach()
            entry["fresh_pass"] = True
        return entry["old_logps"].to(logp.device)

    def metrics(self, batch, stats, m):
        out = super().metrics(batch, stats, m)
        entry = self.rollouts.entries[batch["_slot"]]
        out.update({f"grpo_{k}": v for k, v in entry["rollout_metrics"].items()})
        return out

    def loss_sum(self, batch):
        loss, units, aux, metrics = super().loss_sum(batch)
        entry = self.rollouts.entries[batch["_slot"]]
        if entry.pop("fresh_pass", False):
            # health check: the engine's sampling log-probs vs the trainer's forward
            gen = batch["gen_logps"].reshape(-1)[batch["masks"].reshape(-1).bool()]
            mine = self._first_logps(batch, entry)
            if mine.numel() == gen.numel() and gen.numel():
                metrics["grpo_logp_gap"] = float((mine - gen.to(mine.device)).abs().mean())
        return loss, units, aux, metrics

    def _first_logps(self, batch, entry) -> torch.Tensor:
        _, mask = self.sequences(batch)
        return entry["old_logps"][mask[:, 1:].bool()]

    def on_optimizer_step(self) -> None:
        pass  # no old_model copy: the behaviour log-probs live with each rollout


def best_worst_pairs(batch: dict[str, Any], pad_id: int) -> dict[str, torch.Tensor]:
    """Per prompt, (prompt + best response, prompt + worst response) as dpo rows; groups
    whose rewards are all equal give no pair. Returns chosen/rejected [B', T] + masks."""
    rewards = batch["rewards"]  # (B, G)
    best, worst = rewards.argmax(dim=1), rewards.argmin(dim=1)
    keep = (rewards.max(dim=1).values > rewards.min(dim=1).values).nonzero().squeeze(1)
    rows = torch.arange(rewards.shape[0])[keep]
    out = {}
    for name, pick in (("chosen", best), ("rejected", worst)):
        resp = batch["responses"][rows, pick[keep]]  # (B', R)
        rmask = batch["masks"][rows, pick[keep]]
        ids, mask = join_prompt_response(batch["prompts"][rows], batch["prompt_mask"][rows],
                                         resp, rmask, pad_id)
        out[name], out[f"{name}_mask"] = ids, mask
    return out


class OnlineDPOStrategy(OnlineRollouts, DPOStrategy):
    dataset_kinds = ("grpo",)
    required_keys = ("prompts", "prompt_mask")

    def __init__(self, model: nn.Module, **options: Any) -> None:
        if options.get("precompute_ref"):
            raise ConfigError("precompute_ref: online-dpo scores fresh responses every rollout; "
                              "its reference cannot be precomputed (drop --precompute-ref)")
        super().__init__(model, **options)

    @classmethod
    def setup_kwargs(cls, inputs: StrategyInputs) -> dict[str, Any]:
        a = inputs.config.alignment
        if a.precompute_ref:
            raise ConfigError("precompute_ref: online-dpo scores fresh responses every "
                              "rollout; its reference cannot be precomputed (drop "
                              "--precompute-ref)")
        return {**online_setup(inputs), "beta": a.beta, "loss_type": a.dpo_loss,
                "reduction": a.dpo_reduction_value}

    def loss_units(self, batch):
        # units = prompts: the loss is a mean over prompts, and a prompt whose group tied
        # contributes 0 (as a tied group's zero advantages do in GRPO)
        entry, _ = self.rollouts.attach(batch)
        if "pairs" not in entry:
            entry["pairs"] = best_worst_pairs(entry, self.pad_id)
        batch.update(entry["pairs"])
        return int(batch["prompts"].shape[0])

    def batch_samples(self, batch):
        return int(batch["prompts"].shape[0])

    def batch_tokens(self, batch):
        B, G, R = batch["responses"].shape
        return int(batch["prompt_mask"].sum()) * G + B * G * R

    def loss_sum(self, batch):
        entry = self.rollouts.entries[batch["_slot"]]
        r = batch["rewards"].float()
        metrics = {"dpo_reward_mean": float(r.mean()), "dpo_reward_std": float(r.std(
            unbiased=False)), "dpo_pairs": float(batch["chosen"].shape[0]) / r.shape[0]}
        metrics.update({f"dpo_{k}": v for k, v in entry["rollout_metrics"].items()})
        prompts = int(batch["prompts"].shape[0])
        if batch["chosen"].shape[0] == 0:
            return zero_loss(self.model), prompts, None, metrics
        losses, cr, rr, aux = self.pair_losses(batch)
        metrics.update(preference_metrics(cr, rr))
        return losses.sum(), prompts, aux, metrics
