"""SFT: masked cross-entropy over response tokens (docs/train.md).

Prompt tokens carry loss_mask 0 (and/or target -100) and are ignored (ignore_index -100).
Packed rows hold several conversations: attention stays inside each one (ctx.doc_ids) and
positions restart per document (the dataset's doc_reset position_ids), so a packed row
trains exactly like its conversations trained one by one.
"""

from __future__ import annotations

import torch

from astrai.model.context import ForwardContext
from astrai.train.losses import cross_entropy_sum, masked_targets
from astrai.train.strategies.base import Strategy


class SFTStrategy(Strategy):
    name = "sft"
    dataset_kinds = ("sft",)

    def targets(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return masked_targets(batch["target_ids"], batch.get("loss_mask"))

    def forward_context(self, batch: dict[str, torch.Tensor]) -> ForwardContext:
        return ForwardContext(positions=batch.get("position_ids"), doc_ids=batch.get("doc_ids"))

    def loss_sum(self, batch):
        out = self.model(batch["input_ids"], self.forward_context(batch))
        loss, units = cross_entropy_sum(out.logits, self.targets(batch), self.label_smoothing)
        return loss, units, out.aux_loss, {}
