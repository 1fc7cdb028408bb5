"""Validation: loss, perplexity and bits per byte on held-out data (rank-sharded)."""

from __future__ import annotations

import math
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
    if ex.dp_size > 1:  # one share per data-parallel group (a --tp group shares one)
        data = Subset(data, range(ex.dp_rank, len(data), ex.dp_size))
    loader = DataLoader(data, batch_size=ctx.config.batch_size, shuffle=False,
                        collate_fn=ctx.collate_fn)
    was_training = ctx.model.training
    ctx.model.eval()
    sums: dict[str, float] = {}
    # Every rank runs the same number of forwards (an FSDP forward is collective): a rank
    # whose share is a batch short repeats a batch with weight 0, so the sums still agree.
    steps = math.ceil(math.ceil(len(ctx.eval_data) / ex.dp_size) / ctx.config.batch_size)
    if max_batches is not None:
        steps = min(steps, max_batches)
    it, last = iter(loader), None
    try:
        with torch.no_grad(), ex.autocast():
            for _ in range(steps):
                batch = next(it, None)
                weight = 1
                if batch is None:
                    batch, weight = last or ctx.collate_fn([ctx.eval_data[0]]), 0
                last = batch
                for k, v in strategy.evaluate_batch(strategy.to_device(batch),
                                                    ctx.byte_lengths).items():
                    sums[k] = sums.get(k, 0) + v * weight
    finally:
        ctx.model.train(was_training)
    if not sums:
        return {}
    # one collective over the data-parallel ranks (each share of the data counted once)
    keys = list(sums)
    total = ex.all_reduce_tensor(torch.tensor([float(sums[k]) for k in keys],
                                              dtype=torch.float64, device=ex.device))
    return strategy.eval_summary(dict(zip(keys, total.tolist())))
