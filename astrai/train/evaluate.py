"""Validation: loss, perplexity and bits per byte on held-out data (rank-sharded)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Subset

if TYPE_CHECKING:
    from astrai.train.context import TrainContext


def evaluate(ctx: TrainContext, max_batches: int | None = None) -> dict[str, float]:
    """The strategy's eval_summary over ctx.eval_data; model mode restored afterwards.
    Uses no RNG, so validating never changes the training trajectory."""
    ex, strategy = ctx.executor, ctx.strategy
    data = ctx.eval_data
    if ex.world_size > 1:
        data = Subset(data, range(ex.rank, len(data), ex.world_size))
    loader = DataLoader(data, batch_size=ctx.config.batch_size, shuffle=False,
                        collate_fn=ctx.collate_fn)
    was_training = ctx.model.training
    ctx.model.eval()
    sums: dict[str, float] = {}
    try:
        with torch.no_grad(), ex.autocast():
            for i, batch in enumerate(loader):
                if max_batches is not None and i >= max_batches:
                    break
                for k, v in strategy.evaluate_batch(strategy.to_device(batch),
                                                    ctx.byte_lengths).items():
                    sums[k] = sums.get(k, 0) + v
    finally:
        ctx.model.train(was_training)
    sums = {k: ex.all_reduce_sum(v) for k, v in sums.items()}
    return strategy.eval_summary(sums) if sums else {}
