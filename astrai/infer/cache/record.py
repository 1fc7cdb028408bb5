"""The per-step KV-cache record handed to every attention layer (`ForwardContext.cache`).

Built once per step, shared by all layers (kv_indptr is computed once per step and shared
across layers, as FlashInfer's plan/run split does). Attention backends read the fields directly.

The step is a ragged batch of B requests flattened to N query tokens: request b brings
qo_len_b new tokens at positions kv_len_b - qo_len_b .. kv_len_b - 1, and query i of it
attends causally to the first kv_len_b - qo_len_b + i + 1 positions of its KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class KVCache:
    k_buf: torch.Tensor
    """[L, S, K, D] keys of every slot; layer l uses k_buf[l] ([S, K, D])."""
    v_buf: torch.Tensor
    """[L, S, K, D] values."""
    req_to_token: torch.Tensor
    """[R, max_context] int32: request row, position -> slot (shared across layers)."""
    req_pool_indices: torch.Tensor
    """[B] int64: each request's row of req_to_token."""
    seq_lens: torch.Tensor
    """[B] int32: KV length of each request including this step's new tokens."""
    qo_indptr: torch.Tensor
    """[B+1] int32: request b's query tokens are rows qo_indptr[b]:qo_indptr[b+1] of N."""
    kv_indptr: torch.Tensor
    """[B+1] int32: request b's slots are kv_indices[kv_indptr[b]:kv_indptr[b+1]]."""
    out_cache_loc: torch.Tensor
    """[N] int64: slots where this step's new k/v are written."""
    is_decode: bool
    """Every request brings exactly one query token."""
    positions: torch.Tensor
    """[N] int64: position of each query token (also the model's RoPE positions)."""
    page_size: int = 1
    """Slots of position p of a row are page-contiguous: table[r, p] = table[r, p - p % P]
    + p % P, and table[r, p - p % P] is a multiple of P (contiguous mode: P = max_context)."""
    seq_lens_cpu: list[int] = field(default_factory=list)
    """seq_lens as Python ints (no device sync for planning)."""
    qo_lens_cpu: list[int] = field(default_factory=list)
    """Query tokens per request as Python ints."""
    pages_cpu: list[list[int]] | None = None
    """Each request's pages in position order, when the builder knew them."""
    plans: dict[str, Any] = field(default_factory=dict)
    """Per-backend state derived on the first layer and reused by the others."""
    _kv_indices: torch.Tensor | None = None

    @property
    def kv_indices(self) -> torch.Tensor:
        """[kv_indptr[-1]] int32: each request's slots in position order. Gathered from
        req_to_token on first use, then shared by every layer of the step."""
        if self._kv_indices is None:
            dev = self.req_to_token.device
            max_len = max(self.seq_lens_cpu)
            span = self.req_to_token[self.req_pool_indices, :max_len]  # (B, max_len)
            valid = torch.arange(max_len, device=dev)[None, :] < self.seq_lens[:, None]
            self._kv_indices = span[valid]
        return self._kv_indices

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])

    @property
    def prefix_lens_cpu(self) -> list[int]:
        return [s - q for s, q in zip(self.seq_lens_cpu, self.qo_lens_cpu)]


def build_kv_cache(k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                   rows: list[int], prefix_lens: list[int], qo_lens: list[int],
                   page_size: int, pages: list[list[int]] | None = None) -> KVCache:
    """The record of one step: request b (row rows[b]) has prefix_lens[b] tokens cached and
    brings qo_lens[b] new ones. With `pages` (each request's page list) the slots are
    computed host-side and the whole record costs two host-to-device copies."""
    device = req_to_token.device
    B = len(rows)
    seq = [p + q for p, q in zip(prefix_lens, qo_lens)]
    qo_ptr, kv_ptr = [0] * (B + 1), [0] * (B + 1)
    for b in range(B):
        qo_ptr[b + 1] = qo_ptr[b] + qo_lens[b]
        kv_ptr[b + 1] = kv_ptr[b] + seq[b]
    positions = [p for b in range(B) for p in range(prefix_lens[b], seq[b])]
    N = len(positions)
    i32 = torch.tensor(seq + qo_ptr + kv_ptr, dtype=torch.int32).to(device)
    if pages is not None:
        P = page_size
        locs = [pages[b][p // P] * P + p % P
                for b in range(B) for p in range(prefix_lens[b], seq[b])]
        i64 = torch.tensor(rows + positions + locs, dtype=torch.int64).to(device)
        out_cache_loc = i64[B + N:]
    else:
        i64 = torch.tensor(rows + positions, dtype=torch.int64).to(device)
        tok_rows = i64[:B].repeat_interleave(torch.tensor(qo_lens, device=device))
        out_cache_loc = req_to_token[tok_rows, i64[B:B + N]].long()
    return KVCache(
        k_buf=k_buf, v_buf=v_buf, req_to_token=req_to_token, req_pool_indices=i64[:B],
        seq_lens=i32[:B], qo_indptr=i32[B:2 * B + 1], kv_indptr=i32[2 * B + 1:],
        out_cache_loc=out_cache_loc, is_decode=N == B, positions=i64[B:B + N],
        page_size=page_size, seq_lens_cpu=seq, qo_lens_cpu=list(qo_lens), pages_cpu=pages,
    )
