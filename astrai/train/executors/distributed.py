"""What DDP and FSDP share: the process group, rank and world size, the loss scale and the
collectives. Each subclass adds its wrapper, its no-sync switch and its state dicts."""

from __future__ import annotations

from typing import Any

import torch

from astrai.train.executors import Executor
from astrai.train.executors import process_group as pg


class DistributedExecutor(Executor):
    def __init__(self, *, device: torch.device | str = "cpu", precision: Any = None,
                 timeout_s: float = 1800.0, **options: Any) -> None:
        self.env, dev, self._owns_group = pg.init_process_group(torch.device(device), timeout_s)
        super().__init__(device=dev, precision=precision, **options)
        self.rank, self.world_size = self.env.rank, self.env.world_size

    def window_normalizer(self, loss_units: torch.Tensor) -> torch.Tensor:
        # Both wrappers average gradients over ranks: dividing by the global unit count
        # over world_size makes the average the gradient of the whole global window.
        return self.all_reduce_tensor(loss_units).clamp(min=1) / self.dp_size

    def all_reduce_sum(self, value: float) -> float:
        return pg.all_reduce_sum(value, self.device)

    def all_reduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        torch.distributed.all_reduce(out)
        return out

    def barrier(self) -> None:
        torch.distributed.barrier()

    def checkpoint_group(self) -> Any:
        """A gloo group of every rank, created at the first async save (all ranks reach it
        at the same step): DCP's background writer runs its collectives there, never on
        the default group, whose order the training step's collectives own (torch's
        async_save documentation recommends a separate gloo group for this)."""
        if getattr(self, "_ckpt_group", None) is None:
            self._ckpt_group = torch.distributed.new_group(backend="gloo")
        return self._ckpt_group

    def close(self) -> None:
        pg.destroy_process_group(self._owns_group)
