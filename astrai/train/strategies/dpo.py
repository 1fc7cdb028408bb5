"""DPO: preference optimisation against a frozen reference (Rafailov et al. 2023,
"Direct Preference Optimization").

    h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]
    sigmoid  L = -log sigmoid(beta h)             (Rafailov et al. 2023, eq. 7)
    ipo      L = (h - 1 / (2 beta))^2             (Azar et al. 2023, eq. 17)
    hinge    L = max(0, 1 - beta h)               (SLiC-HF, Zhao et al. 2023)

A response's log-prob is the *sum* of its token log-probs (the DPO paper's; reduction "sum";
"mean" divides by its length; ipo uses "mean" unless told otherwise, as the IPO paper's
results and TRL do). With label smoothing eps the sigmoid loss is conservative DPO:
-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h). The loss is a mean over pairs
(units = pairs). The metrics are TRL DPOTrainer's, under its names: the implicit rewards
beta * log(pi/pi_ref) of the *summed* log-probs whatever the loss and the reduction
(`rewards/chosen`, `rewards/rejected`, their difference `rewards/margins`, and
`rewards/accuracies`, the share of pairs whose chosen reward is the larger); validation's
val_margin and val_accuracy are the same over held-out pairs.

The reference is the initial policy unless --ref-model says otherwise. With
`precompute_ref` its sequence log-probs are computed once for every training and
validation pair (keyed by the pair's tokens), kept in the strategy state (so resume does
not recompute them) and the reference model is freed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from astrai.errors import ConfigError, DataError
from astrai.model.reward_head import last_token_index
from astrai.train.strategies.base import Strategy, StrategyInputs
from astrai.train.strategies.logprobs import (
    frozen_copy,
    policy_logprobs,
    sequence_logprob,
    token_logprobs,
    trim_right,
)
from astrai.train.strategies.reference import freeze, reference_factory

LOSS_TYPES = ("sigmoid", "ipo", "hinge")


def dpo_losses(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
               ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float,
               loss_type: str = "sigmoid", label_smoothing: float = 0.0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequence log-probs [B] each -> (per-pair loss [B], chosen reward [B], rejected
    reward [B]); rewards are beta * log(pi/pi_ref), detached. label_smoothing eps
    (sigmoid only): conservative DPO, each label flipped with probability eps."""
    chosen_ratio = policy_chosen - ref_chosen  # (B,)
    rejected_ratio = policy_rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    if label_smoothing and loss_type != "sigmoid":
        raise ConfigError(f"label_smoothing: the {loss_type} loss has no label smoothing; "
                          "use the sigmoid loss")
    if loss_type == "sigmoid":
        # conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences"; TRL's
        # label-smoothed sigmoid): -(1 - eps) log s(beta h) - eps log s(-beta h)
        losses = -F.logsigmoid(beta * h)
        if label_smoothing:
            losses = (1.0 - label_smoothing) * losses - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "hinge":
        losses = F.relu(1.0 - beta * h)
    else:
        raise ConfigError(f"dpo_loss '{loss_type}': choose one of {', '.join(LOSS_TYPES)}")
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def preference_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor
                       ) -> dict[str, float]:
    """TRL DPOTrainer's `rewards/*` of implicit rewards [B] (beta * summed log-ratios)."""
    if chosen_rewards.numel() == 0:
        return {}
    return {"rewards/chosen": float(chosen_rewards.mean()),
            "rewards/rejected": float(rejected_rewards.mean()),
            "rewards/accuracies": float((chosen_rewards > rejected_rewards).float().mean()),
            "rewards/margins": float((chosen_rewards - rejected_rewards).mean())}


def pair_keys(batch: dict[str, torch.Tensor]) -> list[str]:
    """A content key per pair: the chosen and rejected tokens and masks up to each one's
    last scored token (what the log-probs depend on), so padding and cropping do not
    matter."""
    cols = {k: batch[k].cpu().numpy().astype(np.int64)
            for k in ("chosen", "rejected", "chosen_mask", "rejected_mask")}
    lasts = {k: last_token_index(batch[f"{k}_mask"]).cpu().numpy() for k in ("chosen",
                                                                           "rejected")}
    keys = []
    for b in range(cols["chosen"].shape[0]):
        h = hashlib.blake2b(digest_size=16)
        for k in ("chosen", "rejected"):
            n = int(lasts[k][b]) + 1
            h.update(n.to_bytes(4, "little"))
            h.update(cols[k][b, :n].tobytes())
            h.update(cols[f"{k}_mask"][b, :n].tobytes())
        keys.append(h.hexdigest())
    return keys


class DPOStrategy(Strategy):
    name = "dpo"
    dataset_kinds = ("dpo",)
    required_keys = ("chosen", "rejected", "chosen_mask", "rejected_mask")

    def __init__(self, model: nn.Module, *, beta: float = 0.1, loss_type: str = "sigmoid",
                 reduction: str | None = None, reference: nn.Module | None = None,
                 reference_fn: Callable[[], nn.Module] | None = None,
                 precompute_ref: bool = False,
                 precompute_data: tuple[Sequence[Any], Callable, int] | None = None,
                 **kwargs: Any) -> None:
        """reference: the frozen reference module; reference_fn: builds it when first
        needed; neither: a frozen copy of `model` as it is now (the initial policy).
        precompute_data: (datasets, collate_fn, batch_size) whose pairs get precomputed
        reference log-probs (precompute_ref)."""
        super().__init__(model, **kwargs)
        if loss_type not in LOSS_TYPES:
            raise ConfigError(f"dpo_loss '{loss_type}': choose one of {', '.join(LOSS_TYPES)}")
        if reduction is None:  # as TRL: ipo on length-normalised log-probs, the others summed
            reduction = "mean" if loss_type == "ipo" else "sum"
        if reduction not in ("sum", "mean"):
            raise ConfigError(f"dpo_reduction '{reduction}': choose sum or mean")
        self.beta, self.loss_type, self.reduction = float(beta), loss_type, reduction
        self.precompute_ref, self.precompute_data = precompute_ref, precompute_data
        self._reference_fn = reference_fn
        self._reference = None
        if reference is not None:
            self._reference = freeze(reference, model)
        elif reference_fn is None:
            self._reference = frozen_copy(model)
        self.table: dict[str, tuple[float, float]] | None = None
        """Precomputed (chosen, rejected) reference log-probs by pair key."""

    @classmethod
    def setup_kwargs(cls, inputs: StrategyInputs) -> dict[str, Any]:
        c, data = inputs.config, inputs.data
        a = c.alignment
        return {"beta": a.beta, "loss_type": a.dpo_loss, "reduction": a.dpo_reduction_value,
                "reference_fn": reference_factory(inputs), "precompute_ref": a.precompute_ref,
                "precompute_data": ([data.dataset, data.eval_dataset], data.collate_fn,
                                    c.batch_size)}

    # -- the reference -----------------------------------------------------------------------
    def reference(self) -> nn.Module:
        if self._reference is None:
            if self._reference_fn is None:
                raise RuntimeError("the reference model was freed after precomputation")
            self._reference = freeze(self._reference_fn(), self.model)
        return self._reference

    @torch.no_grad()
    def reference_sequence_logps(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N] reference sequence log-probs of ids [N, T] scored on mask [N, T]."""
        lp = token_logprobs(self.reference()(ids).logits, ids)
        return sequence_logprob(lp, mask, self.reduction)

    @torch.no_grad()
    def precompute(self) -> None:
        """Fill the table for every pair of precompute_data, then free the reference."""
        if self.precompute_data is None:
            raise ConfigError("precompute_ref: no dataset to precompute the reference on")
        datasets, collate, batch_size = self.precompute_data
        table: dict[str, tuple[float, float]] = {}
        for ds in datasets:
            if ds is None:
                continue
            for batch in DataLoader(ds, batch_size=batch_size, shuffle=False,
                                    collate_fn=collate):
                batch = self.to_device(batch)
                ids, mask = self._pairs(batch)
                seq = self.reference_sequence_logps(ids, mask).tolist()
                B = len(seq) // 2
                table.update(zip(pair_keys(batch), zip(seq[:B], seq[B:])))
        self.table = table
        self._reference = self._reference_fn = None

    def reference_logps(self, batch: dict[str, torch.Tensor], ids: torch.Tensor,
                        mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen [B], rejected [B]) reference log-probs, live or from the table."""
        B = batch["chosen"].shape[0]
        if not self.precompute_ref:
            seq = self.reference_sequence_logps(ids, mask)
            return seq[:B], seq[B:]
        if self.table is None:
            self.precompute()
        try:
            vals = [self.table[k] for k in pair_keys(batch)]
        except KeyError:
            raise DataError("precompute_ref: a pair of this batch has no precomputed "
                            "reference log-prob (the data changed since they were computed); "
                            "start a new run") from None
        t = torch.tensor(vals, dtype=torch.float32, device=ids.device)  # (B, 2)
        return t[:, 0], t[:, 1]

    # -- the loss ----------------------------------------------------------------------------
    def _pairs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """chosen and rejected stacked as one [2B, T] batch (the collate pads them alike)."""
        ids = torch.cat([batch["chosen"], batch["rejected"]])
        mask = torch.cat([batch["chosen_mask"], batch["rejected_mask"]])
        return trim_right(ids, mask, mask=mask)

    def loss_units(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["chosen"].shape[0])

    def batch_samples(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["chosen"].shape[0])

    def batch_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["chosen"].numel() + batch["rejected"].numel())

    def pair_losses(self, batch: dict[str, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(per-pair loss [B], chosen rewards [B], rejected rewards [B], MoE aux loss). The
        loss uses the reduction's log-probs; the rewards are beta * the summed log-ratios
        (TRL's rewards/* for every loss type)."""
        ids, mask = self._pairs(batch)
        B = batch["chosen"].shape[0]
        lp, aux = policy_logprobs(self.model, ids)
        total = sequence_logprob(lp, mask, "sum")  # (2B,)
        ref_c, ref_r = self.reference_logps(batch, ids, mask)  # under the reduction
        seq, ref_total = total, torch.cat([ref_c, ref_r])
        if self.reduction == "mean":  # sequence_logprob's mean, and the reference's sum
            n = mask[:, 1:].to(total.dtype).sum(dim=1).clamp(min=1)  # (2B,)
            seq, ref_total = total / n, ref_total * n
        losses, _, _ = dpo_losses(seq[:B], seq[B:], ref_c, ref_r, self.beta, self.loss_type,
                                  self.label_smoothing)
        rewards = self.beta * (total.detach() - ref_total)  # (2B,)
        return losses, rewards[:B], rewards[B:], aux

    def loss_sum(self, batch):
        losses, cr, rr, aux = self.pair_losses(batch)
        return losses.sum(), losses.shape[0], aux, preference_metrics(cr, rr)

    # -- validation --------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_batch(self, batch, byte_lengths):
        losses, cr, rr, _ = self.pair_losses(batch)
        return {"loss": float(losses.sum()), "pairs": losses.shape[0],
                "correct": float((cr > rr).sum()), "margin": float((cr - rr).sum())}

    def eval_summary(self, sums):
        n = max(1, int(sums["pairs"]))
        return {"val_loss": sums["loss"] / n, "val_accuracy": sums["correct"] / n,
                "val_margin": sums["margin"] / n}

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if not self.precompute_ref or self.table is None:
            return {}
        keys = list(self.table)
        return {"ref_keys": keys,
                "ref_logps": torch.tensor([self.table[k] for k in keys], dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.precompute_ref and "ref_keys" in state:
            vals = state["ref_logps"].tolist()
            self.table = {k: (float(a), float(b)) for k, (a, b) in zip(state["ref_keys"], vals)}
            self._reference = self._reference_fn = None
