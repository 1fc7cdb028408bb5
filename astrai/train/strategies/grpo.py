"""GRPO: token-level PPO with group-normalised advantages (Shao et al. 2024,
"DeepSeekMath", section 4).

    A_i   = (r_i - mean_g r) / (std_g r + eps)              one scalar per response,
                                                            broadcast over its tokens
    rho_t = pi(a_t|s_t) / pi_old(a_t|s_t)                   behaviour policy pi_old
    L     = -E_t[min(rho_t A, clip(rho_t, 1-eps, 1+eps) A)]
            + kl_coef * E_t[pi_ref/pi - log(pi_ref/pi) - 1]   (k3 estimator, Schulman 2020)

Both choices follow TRL's GRPOTrainer (docs/alignment.md lists the equivalences):

* scale_rewards: std is the group's sample standard deviation (Bessel-corrected, as TRL's
  `nanstd`; "group"), the whole batch's ("batch", PPO Lite), or no division ("none",
  Dr. GRPO). A group with equal rewards has zero advantages. eps = 1e-4.
* loss_type, how E_t aggregates the per-token loss (prompt and padding tokens carry
  none): "dapo" = sum over the window's response tokens / their number (the default, as
  TRL's); "grpo" = mean over each response's tokens, then over responses; "dr_grpo" =
  sum / (responses x max completion length); "bnpo" = mean over each micro-batch's
  tokens, then over micro-batches.

Offline (`grpo`): groups come from the dataset (prompts [B, P], responses [B, G, R], masks,
rewards [B, G]). old_model is synced with the policy every `sync_interval` optimizer steps
(as PPO syncs its behaviour policy between data-generation rounds); with sync_interval 1 the old
policy *is* the current one, so pi_old = pi.detach() and no copy is kept. The online
variant (`astrai.train.strategies.online`) feeds rollouts through the same loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from astrai.errors import ConfigError, DataError
from astrai.train.strategies.base import Strategy, StrategyInputs
from astrai.train.strategies.logprobs import (
    frozen_copy,
    join_prompt_response,
    token_logprobs,
    trim_right,
    unwrap,
)
from astrai.train.strategies.reference import copy_weights, freeze, reference_factory

ADV_EPS = 1e-4
SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")


def group_advantages(rewards: torch.Tensor, scale: str = "group",
                     eps: float = ADV_EPS) -> torch.Tensor:
    """rewards [B, G] -> advantages [B, G]: minus the group's mean, divided by the group's
    (scale "group") or the batch's ("batch") Bessel-corrected std + eps, or not ("none")."""
    r = rewards.float()
    adv = r - r.mean(dim=1, keepdim=True)
    if scale == "none":
        return adv
    if scale == "group":
        std = r.std(dim=1, keepdim=True) if r.shape[1] > 1 else torch.zeros_like(r)
    elif scale == "batch":
        std = r.std().expand_as(r) if r.numel() > 1 else torch.zeros_like(r)
    else:
        raise ConfigError(f"scale_rewards '{scale}': choose one of {', '.join(SCALE_REWARDS)}")
    return adv / (std + eps)


def aggregate_token_loss(loss: torch.Tensor, mask: torch.Tensor, loss_type: str,
                         max_completion_length: int) -> tuple[torch.Tensor, int]:
    """Per-token loss and mask [N, T] -> (sum, units) whose ratio summed over a window is
    TRL's loss of that loss_type: tokens (dapo), responses of per-response means (grpo),
    responses x max length (dr_grpo), one micro-batch mean (bnpo)."""
    tok = loss * mask
    N = loss.shape[0]
    if loss_type == "dapo":
        return tok.sum(), int(mask.sum())
    if loss_type == "grpo":
        return (tok.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum(), N
    if loss_type == "dr_grpo":
        return tok.sum() / float(max_completion_length), N
    if loss_type == "bnpo":
        return tok.sum() / mask.sum().clamp(min=1.0), 1
    raise ConfigError(f"grpo_loss_type '{loss_type}': choose one of {', '.join(LOSS_TYPES)}")


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    adv: torch.Tensor, clip_eps: float, kl_coef: float
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GRPO loss. logp, old_logp, ref_logp [N, T] (token log-probs), adv [N]
    (one advantage per sequence). Returns (loss [N, T], per-token stats [N, T]: ratio,
    clipped (1 where the clipped term is the active one), kl)."""
    A = adv[:, None].to(logp.dtype)  # (N, 1), broadcast over the response tokens
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * A
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * A
    loss = -torch.minimum(unclipped, clipped)
    stats = {"ratio": ratio.detach(), "clipped": (clipped < unclipped).float()}
    if ref_logp is not None:
        d = ref_logp - logp  # log(pi_ref / pi)
        kl = torch.exp(d) - d - 1.0
        if kl_coef:
            loss = loss + kl_coef * kl
        stats["kl"] = kl.detach()
    return loss, stats


class GRPOStrategy(Strategy):
    name = "grpo"
    dataset_kinds = ("grpo",)
    required_keys = ("prompts", "prompt_mask", "responses", "masks", "rewards")

    def __init__(self, model: nn.Module, *, clip_eps: float = 0.2, kl_coef: float = 0.01,
                 sync_interval: int = 1, pad_id: int = 0, scale_rewards: str = "group",
                 loss_type: str = "dapo", max_completion_length: int | None = None,
                 reference: nn.Module | None = None,
                 reference_fn: Callable[[], nn.Module] | None = None,
                 **kwargs: Any) -> None:
        """reference / reference_fn as in DPOStrategy (none: a frozen copy of the initial
        policy); no reference is built when kl_coef is 0. scale_rewards, loss_type: as
        TRL's (module docstring); max_completion_length: dr_grpo's constant (None = the
        batch's padded response length)."""
        super().__init__(model, **kwargs)
        if scale_rewards not in SCALE_REWARDS:
            raise ConfigError(f"scale_rewards '{scale_rewards}': choose one of "
                              f"{', '.join(SCALE_REWARDS)}")
        if loss_type not in LOSS_TYPES:
            raise ConfigError(f"grpo_loss_type '{loss_type}': choose one of "
                              f"{', '.join(LOSS_TYPES)}")
        self.scale_rewards, self.loss_type = scale_rewards, loss_type
        self.max_completion_length = max_completion_length
        self.clip_eps, self.kl_coef = float(clip_eps), float(kl_coef)
        self.sync_interval, self.pad_id = int(sync_interval), int(pad_id)
        self._reference_fn = reference_fn
        self._reference = None
        if kl_coef:
            if reference is not None:
                self._reference = freeze(reference, model)
            elif reference_fn is None:
                self._reference = frozen_copy(model)
        self.old_model = frozen_copy(model) if self.sync_interval > 1 else None
        self.steps_since_sync = 0

    @classmethod
    def setup_kwargs(cls, inputs: StrategyInputs) -> dict[str, Any]:
        c, data = inputs.config, inputs.data
        if c.alignment.precompute_ref:
            raise ConfigError("precompute_ref applies to --strategy dpo only; drop "
                              "--precompute-ref")
        sample = data.dataset[0]
        if cls is GRPOStrategy and "responses" not in sample:
            raise DataError(f"data: {data.path} holds grpo prompts without response groups "
                            "(online mode); train it with --strategy online-grpo, or build "
                            "offline groups (records with responses and rewards)")
        a = c.alignment
        return {"clip_eps": a.clip_eps, "kl_coef": a.kl_coef, "sync_interval": a.sync_interval,
                "pad_id": _pad_id(data), "reference_fn": reference_factory(inputs),
                "scale_rewards": a.scale_rewards, "loss_type": a.grpo_loss_type,
                "max_completion_length": data.seq_len}

    # -- policies ----------------------------------------------------------------------------
    def reference(self) -> nn.Module:
        if self._reference is None:
            self._reference = freeze(self._reference_fn(), self.model)
        return self._reference

    def sync_old_model(self) -> None:
        """old_model <- policy (a sync between data-generation rounds)."""
        if self.old_model is not None:
            copy_weights(self.old_model, unwrap(self.model))
        self.steps_since_sync = 0

    def on_optimizer_step(self) -> None:
        self.steps_since_sync += 1
        if self.steps_since_sync >= self.sync_interval:
            self.sync_old_model()

    def old_logprobs(self, batch: dict[str, Any], ids: torch.Tensor,
                     logp: torch.Tensor) -> torch.Tensor:
        """Token log-probs [N, T-1] of the behaviour policy."""
        if self.old_model is None or self.steps_since_sync == 0:
            return logp.detach()  # old_model == policy: ratio exactly 1
        with torch.no_grad():
            return token_logprobs(self.old_model(ids).logits, ids)

    # -- batches -----------------------------------------------------------------------------
    def sequences(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (prompt, response) of the batch as one row: ids, mask [B*G, T]."""
        B, G, R = batch["responses"].shape
        prompts = batch["prompts"].repeat_interleave(G, dim=0)  # (B*G, P)
        pmask = batch["prompt_mask"].repeat_interleave(G, dim=0)
        ids, mask = join_prompt_response(prompts, pmask, batch["responses"].reshape(B * G, R),
                                         batch["masks"].reshape(B * G, R), self.pad_id)
        return trim_right(ids, mask, mask=mask)  # nothing after the last scored token counts

    def loss_units(self, batch: dict[str, Any]) -> int:
        if self.loss_type == "dapo":
            return int(batch["masks"].sum())
        if self.loss_type == "bnpo":
            return 1
        B, G = batch["rewards"].shape
        return B * G

    def batch_samples(self, batch: dict[str, Any]) -> int:
        return int(batch["prompts"].shape[0])

    def batch_tokens(self, batch: dict[str, Any]) -> int:
        B, G, R = batch["responses"].shape
        return int(batch["prompt_mask"].sum()) * G + B * G * R

    # -- the loss ----------------------------------------------------------------------------
    def loss_sum(self, batch):
        ids, mask = self.sequences(batch)
        out = self.model(ids)
        logp = token_logprobs(out.logits, ids)  # (N, T-1)
        old = self.old_logprobs(batch, ids, logp)
        ref = None
        if self.kl_coef:
            with torch.no_grad():
                ref = token_logprobs(self.reference()(ids).logits, ids)
        adv = group_advantages(batch["rewards"], self.scale_rewards).reshape(-1)  # (B*G,)
        loss, stats = grpo_token_loss(logp, old, ref, adv, self.clip_eps, self.kl_coef)
        m = mask[:, 1:].to(loss.dtype)
        total, units = aggregate_token_loss(
            loss, m, self.loss_type, self.max_completion_length or batch["responses"].shape[-1])
        return total, units, out.aux_loss, self.metrics(batch, stats, m)

    def metrics(self, batch: dict[str, Any], stats: dict[str, torch.Tensor],
                m: torch.Tensor) -> dict[str, float]:
        """TRL GRPOTrainer's names and definitions where TRL logs the metric: `reward` (the
        mean), `reward_std` (Bessel-corrected, as TRL's nanstd; left out for a single
        reward, where TRL logs NaN), `kl` and `clip_ratio/region_mean` (token means over
        the responses); `grpo_ratio_mean` is astrai's own."""
        n = m.sum().clamp(min=1)
        r = batch["rewards"].float()
        out = {"reward": float(r.mean()),
               "grpo_ratio_mean": float((stats["ratio"] * m).sum() / n),
               "clip_ratio/region_mean": float((stats["clipped"] * m).sum() / n)}
        if r.numel() > 1:
            out["reward_std"] = float(r.std())
        if "kl" in stats:
            out["kl"] = float((stats["kl"] * m).sum() / n)
        return out

    # -- validation --------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_batch(self, batch, byte_lengths):
        """On held-out groups: the advantage-weighted token log-likelihood (the surrogate at
        ratio 1: it rises as the policy favours the better responses) and the KL."""
        ids, mask = self.sequences(batch)
        logp = token_logprobs(self.model(ids).logits, ids)
        m = mask[:, 1:].to(logp.dtype)
        adv = group_advantages(batch["rewards"], self.scale_rewards).reshape(-1, 1)
        out = {"adv_logp": float((adv * logp * m).sum()), "tokens": float(m.sum())}
        if self.kl_coef:
            d = token_logprobs(self.reference()(ids).logits, ids) - logp
            out["kl"] = float(((torch.exp(d) - d - 1.0) * m).sum())
        return out

    def eval_summary(self, sums):
        n = max(1.0, sums["tokens"])
        out = {"val_adv_logp": sums["adv_logp"] / n}
        if "kl" in sums:
            out["val_kl"] = sums["kl"] / n
        return out

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps_since_sync": self.steps_since_sync}
        if self.old_model is not None and self.steps_since_sync:
            out["old_model"] = {k: v.detach().cpu() for k, v in
                                self.old_model.state_dict().items()}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_since_sync = int(state.get("steps_since_sync", 0))
        if self.old_model is not None:
            if "old_model" in state:
                self.old_model.load_state_dict(state["old_model"])
            else:
                self.sync_old_model()


def _pad_id(data: Any) -> int:
    ds = data.dataset
    ds = getattr(ds, "dataset", ds)  # a Subset of a validation split
    return int(getattr(ds, "pad_id", 0))
