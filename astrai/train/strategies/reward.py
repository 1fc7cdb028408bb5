"""Reward-model training on preference pairs (Bradley–Terry; Ouyang et al. 2022, eq. 1).

    L = -log sigmoid(s(x, y_w) - s(x, y_l))

s is the scalar head of `astrai.model.reward_head.RewardModel` read at each response's
last scored token. Trains on dpo datasets (chosen/rejected + masks); the loss is a mean
over pairs. Metrics: accuracy (share of pairs with s_w > s_l) and margin; validation on
held-out pairs reports val_loss and val_accuracy. The checkpoint is a RewardModel
(`score_head.*` beside the transformer weights), usable with `--reward model:DIR`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model.reward_head import RewardModel, last_token_index
from astrai.train.strategies.base import Strategy
from astrai.train.strategies.logprobs import unwrap


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Scores [B] each -> per-pair loss [B] = -log sigmoid(s_w - s_l)."""
    return -F.logsigmoid(chosen.float() - rejected.float())


class RewardStrategy(Strategy):
    name = "reward"
    dataset_kinds = ("dpo",)
    required_keys = ("chosen", "rejected", "chosen_mask", "rejected_mask")

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if not isinstance(unwrap(model), RewardModel):
            raise TypeError("RewardStrategy trains a RewardModel "
                            "(RewardStrategy.prepare_model adds the head)")

    @classmethod
    def prepare_model(cls, model: nn.Module, config: Any) -> nn.Module:
        return RewardModel.from_transformer(model, seed=getattr(config, "seed", 0))

    def scores(self, batch: dict[str, torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(chosen scores [B], rejected scores [B], MoE aux loss) in one [2B, T] forward."""
        ids = torch.cat([batch["chosen"], batch["rejected"]])
        mask = torch.cat([batch["chosen_mask"], batch["rejected_mask"]])
        last = last_token_index(mask)
        ids = ids[:, : int(last.max()) + 1]  # nothing after the last scored token matters
        out = self.model(ids, last_index=last)
        B = batch["chosen"].shape[0]
        return out.scores[:B], out.scores[B:], out.aux_loss

    def loss_units(self, batch):
        return int(batch["chosen"].shape[0])

    def batch_samples(self, batch):
        return int(batch["chosen"].shape[0])

    def batch_tokens(self, batch):
        return int(batch["chosen"].numel() + batch["rejected"].numel())

    def loss_sum(self, batch):
        sc, sr, aux = self.scores(batch)
        losses = bradley_terry_loss(sc, sr)
        margin = (sc - sr).detach()
        metrics = {"reward_accuracy": float((margin > 0).float().mean()),
                   "reward_margin": float(margin.mean()),
                   "reward_chosen_score": float(sc.detach().mean()),
                   "reward_rejected_score": float(sr.detach().mean())}
        return losses.sum(), losses.shape[0], aux, metrics

    @torch.no_grad()
    def evaluate_batch(self, batch, byte_lengths):
        sc, sr, _ = self.scores(batch)
        return {"loss": float(bradley_terry_loss(sc, sr).sum()), "pairs": int(sc.shape[0]),
                "correct": float((sc > sr).sum()), "margin": float((sc - sr).sum())}

    def eval_summary(self, sums):
        n = max(1, int(sums["pairs"]))
        return {"val_loss": sums["loss"] / n, "val_accuracy": sums["correct"] / n,
                "val_margin": sums["margin"] / n}
