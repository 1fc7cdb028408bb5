"""Distributed executors (docs/distributed.md "Executors"): `ddp` (DistributedDataParallel) and `fsdp`
(FSDP2 `fully_shard`), registered lazily in astrai.train.executor.EXECUTORS so that runs on
one process never import torch.distributed's wrappers."""
