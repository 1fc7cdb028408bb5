"""Executors (docs/distributed.md "Executors"): how one training process places, wraps and
steps the model. `base` holds the contract, the one-process `none` executor and the
registry; `ddp` (DistributedDataParallel) and `fsdp` (FSDP2 `fully_shard`) are registered
lazily in EXECUTORS, so that runs on one process never import torch.distributed's wrappers."""

from astrai.train.executors.base import EXECUTORS, Executor, NoneExecutor, clip_by_norm_, unwrap

__all__ = ["EXECUTORS", "Executor", "NoneExecutor", "clip_by_norm_", "unwrap"]
