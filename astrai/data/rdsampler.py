"""RDSampler: seeded shuffle, sharding across ranks, exact mid-epoch resume.

Epoch e visits a permutation of the dataset drawn from (seed, e). The permutation is padded
by wrapping around (or cut, with drop_last) to a multiple of world_size, and rank r takes
every world_size-th index starting at r. The state is the global number of samples consumed
in the current epoch, so a resumed run continues at exactly the next sample with the same
world size; with a different one it skips nothing (the last step may repeat a few samples
to pad the epoch to a multiple of the new world size).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from astrai.errors import CheckpointError, ConfigError


class RDSampler(Sampler[int]):
    """Resumable distributed sampler (exact resume: docs/resume.md)."""

    def __init__(self, length: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = False) -> None:
        if length <= 0:
            raise ConfigError(f"sampler: dataset has {length} samples; nothing to sample")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"sampler: rank {rank} is outside world_size {world_size}")
        if drop_last and length < world_size:
            raise ConfigError(f"sampler: {length} samples cannot feed {world_size} ranks "
                              "with drop_last")
        self.length, self.seed, self.rank, self.world_size = length, seed, rank, world_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch = 0
        self.consumed = 0  # global samples of this epoch handed out (all ranks)

    @property
    def total(self) -> int:
        """Samples per epoch over all ranks (padded or cut to a multiple of world_size)."""
        ws = self.world_size
        return (self.length // ws) * ws if self.drop_last else math.ceil(self.length / ws) * ws

    def __len__(self) -> int:
        """Samples this rank sees in a full epoch."""
        return self.total // self.world_size

    @property
    def remaining(self) -> int:
        """Samples this rank has left in the current epoch."""
        return max(0, (self.total - self.consumed) // self.world_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The global order of epoch `epoch` (all ranks interleaved), length `total`."""
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.length)
        else:
            order = np.arange(self.length)
        if self.total > self.length:
            order = np.concatenate([order, np.resize(order, self.total - self.length)])
        return order[: self.total]

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order(self.epoch)
        for g in range(self.consumed + self.rank, self.total, self.world_size):
            self.consumed = g - self.rank + self.world_size
            yield int(order[g])
        self.epoch += 1
        self.consumed = 0

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the sampler is already in that epoch
        (a resumed one keeps its position)."""
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def state_dict(self, consumed: int | None = None) -> dict:
        """Position to resume from. `consumed`: samples this rank has actually used in the
        current epoch, when a DataLoader prefetches indices ahead of training."""
        pos = self.consumed if consumed is None else consumed * self.world_size
        return {"epoch": self.epoch, "consumed": pos, "seed": self.seed,
                "length": self.length, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "length", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise CheckpointError(
                    f"sampler state: {key} was {state[key]} when saved but is "
                    f"{getattr(self, key)} now; resume with the same dataset and seed")
        self.epoch = int(state["epoch"])
        self.consumed = min(int(state["consumed"]), self.total)
        # a different world size resumes on the next multiple of the new one
        self.consumed -= self.consumed % self.world_size
