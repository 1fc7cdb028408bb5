"""SEQ: next-token cross-entropy with optional label smoothing (docs/train.md)."""

from __future__ import annotations

from typing import Any

import torch

from astrai.model.context import ForwardContext
from astrai.train.losses import cross_entropy_sum
from astrai.train.strategies.base import Strategy


class SeqStrategy(Strategy):
    """Pre-training on packed windows.

    By default attention runs causally across the whole window (documents concatenated, as
    GPT-2 / nanoGPT pre-train) with positions 0..T-1; `doc_mask=True` (strategy_kwargs)
    instead keeps attention inside each document and uses the dataset's position ids.
    """

    name = "seq"
    dataset_kinds = ("pretrain",)

    def __init__(self, model, *, doc_mask: bool = False, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.doc_mask = doc_mask

    def forward_context(self, batch: dict[str, torch.Tensor]) -> ForwardContext | None:
        if not self.doc_mask:
            return None
        return ForwardContext(positions=batch.get("position_ids"), doc_ids=batch.get("doc_ids"))

    def loss_sum(self, batch):
        out = self.model(batch["input_ids"], self.forward_context(batch))
        loss, units = cross_entropy_sum(out.logits, self.targets(batch), self.label_smoothing)
        return loss, units, out.aux_loss, {}
