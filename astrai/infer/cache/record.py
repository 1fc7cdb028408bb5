"""The per-step KV-cache record handed to every attention layer (`ForwardContext.cache`).

Built once per step, shared by all layers (seeds/internals.md: kv_indptr is "computed once
per step and shared across layers"). Attention backends read the fields directly.

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
    kv_indices: torch.Tensor
    """[kv_indptr[-1]] int32: each request's slots in position order."""
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
    plans: dict[str, Any] = field(default_factory=dict)
    """Per-backend state derived on the first layer and reused by the others."""

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
                   page_size: int) -> KVCache:
    """The record of one step: request b (row rows[b]) has prefix_lens[b] tokens cached and
    brings qo_lens[b] new ones."""
    device = req_to_token.device
    seq = [p + q for p, q in zip(prefix_lens, qo_lens)]
    rows_t = torch.tensor(rows, dtype=torch.int64)
    seq_t = torch.tensor(seq, dtype=torch.int32)
    qo_t = torch.tensor(qo_lens, dtype=torch.int64)
    qo_indptr = torch.zeros(len(rows) + 1, dtype=torch.int32)
    torch.cumsum(qo_t, 0, out=qo_indptr[1:])
    kv_indptr = torch.zeros(len(rows) + 1, dtype=torch.int32)
    torch.cumsum(seq_t, 0, out=kv_indptr[1:])
    is_decode = all(q == 1 for q in qo_lens)
    if is_decode:
        positions = torch.tensor(prefix_lens, dtype=torch.int64)
        tok_rows = rows_t
    else:
        # position of flat token n = n - (start of its request) + prefix of its request
        offset = torch.tensor(prefix_lens, dtype=torch.int64) - qo_indptr[:-1].long()
        positions = torch.arange(int(qo_indptr[-1])) + torch.repeat_interleave(offset, qo_t)
        tok_rows = torch.repeat_interleave(rows_t, qo_t)
    rows_d, positions_d = rows_t.to(device), positions.to(device)
    out_cache_loc = req_to_token[tok_rows.to(device), positions_d].long()
    max_len = max(seq)
    span = req_to_token[rows_d, :max_len]  # (B, max_len) slots, valid up to seq_lens
    valid = torch.arange(max_len, device=device)[None, :] < seq_t.to(device)[:, None]
    kv_indices = span[valid]
    return KVCache(
        k_buf=k_buf, v_buf=v_buf, req_to_token=req_to_token, req_pool_indices=rows_d,
        seq_lens=seq_t.to(device), qo_indptr=qo_indptr.to(device),
        kv_indptr=kv_indptr.to(device), kv_indices=kv_indices, out_cache_loc=out_cache_loc,
        is_decode=is_decode, positions=positions_d, page_size=page_size,
        seq_lens_cpu=seq, qo_lens_cpu=list(qo_lens),
    )
