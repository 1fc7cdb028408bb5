"""The attention contract between the model and whoever runs it.

Attention layers own no cache logic. After projecting and rotating q and k, a layer calls
`backend.attend(q, k, v, layer, ctx)`; the backend decides how to attend:

* training / plain forward (`ctx.cache is None`): causal attention over the batch, masked
  per document when `ctx.doc_ids` is given (packed sequences), with an optional sliding
  window — `SdpaBackend` in this module;
* inference (`ctx.cache` is the step's KV-cache record): the backend writes k and v into the
  paged pool and attends against the cached prefix (`astrai/infer/backends`).

Layout everywhere: q [B, T, H, D], k and v [B, T, K, D] (already rotated: RoPE is applied
before the KV write), output [B, T, H, D]; scale 1/sqrt(D). Inference backends receive the
ragged batch flattened as B = 1, T = total tokens of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from astrai.model.fast_path import DecodeKernels
    from astrai.model.lora_batch import LoraSelection


@runtime_checkable
class AttentionBackend(Protocol):
    """Computes attention for one layer; may read/write `ctx.cache`."""

    name: str

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               ctx: ForwardContext) -> torch.Tensor: ...


@dataclass
class ForwardContext:
    """What a forward pass needs beyond the token ids."""

    positions: torch.Tensor | None = None
    """[B, T] position ids (int64); None = 0..T-1 for every row."""
    doc_ids: torch.Tensor | None = None
    """[B, T] document index of each token in a packed row; attention stays inside a document."""
    cache: Any = None
    """The step's KV-cache record (inference only); None for training."""
    backend: AttentionBackend | None = None
    """Who computes attention; None = `SdpaBackend` (training path)."""
    sliding_window: int | None = None
    """Set by the model from its config: attend only to the last W positions."""
    kernels: DecodeKernels | None = None
    """Kernels for the few-row products, norms and decode attention of an engine's steps
    on a CPU (astrai/model/fast_path.py); None: torch serves all. Per pass, never process
    state: two engines in one process each pass their own."""
    lora: LoraSelection | None = None
    """The adapters of the step's tokens, one slot per flattened token
    (astrai/model/lora_batch.py); None: no adapter update is added."""


def attention_mask(T: int, doc_ids: torch.Tensor | None, sliding_window: int | None,
                   device: torch.device) -> torch.Tensor | None:
    """Boolean mask [B or 1, 1, T, T] (True = may attend), or None for plain causal."""
    if doc_ids is None and sliding_window is None:
        return None
    i = torch.arange(T, device=device)
    mask = i[:, None] >= i[None, :]  # causal (T, T)
    if sliding_window is not None:
        mask = mask & (i[:, None] - i[None, :] < sliding_window)
    mask = mask[None, None]  # (1, 1, T, T)
    if doc_ids is not None:
        same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
        mask = mask & same[:, None]
    return mask


class SdpaBackend:
    """Training path: torch scaled_dot_product_attention with causal / per-document masks."""

    name = "sdpa"

    def attend(self, q, k, v, layer, ctx):
        T = q.shape[1]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H|K, T, D)
        mask = attention_mask(T, ctx.doc_ids, ctx.sliding_window, q.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=q.shape[1] != k.shape[1]
        )
        return out.transpose(1, 2)  # (B, T, H, D)


SDPA = SdpaBackend()
