"""KVStorage: the flat token-level K and V buffers (docs/engine.md).

k and v are [L, S, K, D]: layer, token slot, kv head, head dim. A layer's attention uses
`k[layer]` ([S, K, D]); which slots belong to which request is the business of
`ReqToTokenPool` and the allocator, never of the buffers.
"""

from __future__ import annotations

import torch


class KVStorage:
    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (n_layers, n_slots, n_kv_heads, head_dim)  # (L, S, K, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def n_slots(self) -> int:
        return self.k.shape[1]

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
