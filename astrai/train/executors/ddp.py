"""DDP executor: one full model replica per process, gradients averaged by all-reduce.

* Wrapping: torch.nn.parallel.DistributedDataParallel (rank 0's weights are broadcast at
  construction, so every replica starts identical).
* Accumulation: every micro-batch of a window but the last runs inside `model.no_sync()`, so their gradients accumulate locally and only the last
  micro-step of a window all-reduces the gradient buckets.
* Loss scale: DDP *averages* gradients over ranks, so each rank divides its summed loss by
  (window loss units over all ranks) / world_size; the averaged gradient is then the one of
  the whole global window, as if one process had seen every rank's micro-batches.
* Clipping: after the all-reduce every rank holds the same full gradients, so the local L2
  norm is already the global one.
* Checkpoints: rank 0 holds full weights and optimizer state; the others return {}.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from astrai.train.executors.distributed import DistributedExecutor


class DDPExecutor(DistributedExecutor):
    name = "ddp"

    def __init__(self, *, bucket_cap_mb: float = 25.0,
                 find_unused_parameters: bool | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters

    def _wrap(self, model: nn.Module) -> nn.Module:
        find_unused = self.find_unused_parameters
        if find_unused is None:
            # An MoE expert that no token of a micro-batch chose gets no gradient; DDP must
            # then look for unused parameters or it waits forever for their buckets.
            find_unused = bool(getattr(getattr(model, "config", None), "n_experts", 0))
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=self.bucket_cap_mb,
                                       find_unused_parameters=find_unused)

    def _no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync()

    # -- checkpoints: full state on rank 0 ---------------------------------------------------
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        return super().model_state_dict() if self.is_main else {}

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        return _to_cpu(optimizer.state_dict()) if self.is_main else {}


def _to_cpu(obj: Any) -> Any:
    """Copy every tensor of a (nested) state dict to CPU, so a checkpoint written on GPUs
    loads anywhere."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
