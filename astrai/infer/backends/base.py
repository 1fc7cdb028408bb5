"""What an inference attention backend is (docs/engine.md).

A backend implements the model's `AttentionBackend.attend(q, k, v, layer, ctx)` for the
inference path: `ctx.cache` is the step's `KVCache` record, q [1, N, H, D] and k, v
[1, N, K, D] are the step's ragged tokens (RoPE applied). It writes k and v at
`out_cache_loc` into layer `layer`'s buffers, then attends: query i of request b (position
kv_len_b - qo_len_b + i) attends causally to positions 0 .. kv_len_b - qo_len_b + i of its
KV, and only to the last `ctx.sliding_window` of them when that is set. Scale 1/sqrt(D).

Beyond `name` and `attend`, a backend may define
  * `unavailable_reason()` (static/class method): None when usable in this process, else
    why not (no CUDA, extension not built, package missing);
  * `supports(q, ctx) -> str | None`: None when it can serve this call, else why not
    (dtype, head dim, device) — the dispatcher then tries the next backend.
A backend may also raise `BackendUnsupported` from `attend` before writing anything.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from astrai.model.context import ForwardContext


class BackendUnsupported(Exception):
    """This backend cannot serve this call; the dispatcher falls through to the next one."""


class InferenceBackend(Protocol):
    name: str

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               ctx: ForwardContext) -> torch.Tensor: ...


def write_kv(k: torch.Tensor, v: torch.Tensor, layer: int, ctx: ForwardContext) -> None:
    """Store this step's k, v [1, N, K, D] at the record's out_cache_loc slots of `layer`."""
    c = ctx.cache
    kb, vb = c.k_buf[layer], c.v_buf[layer]  # (S, K, D)
    k, v = k[0], v[0]  # (N, K, D)
    if k.dtype != kb.dtype:
        k, v = k.to(kb.dtype), v.to(vb.dtype)
    kb.index_copy_(0, c.out_cache_loc, k)
    vb.index_copy_(0, c.out_cache_loc, v)


def worst_row_similarity(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The least similar row of `out` against `ref` (both [..., D], compared over D): the
    cosine similarity, or 1 where the two rows are equal to 1e-3 of the reference's norm
    (rows of zeros included); NaN when `out` is not finite. Accelerated paths are checked
    against their reference with it: rounding keeps it near 1, a wrong kernel near 0."""
    a = out.reshape(-1, out.shape[-1]).double()
    b = ref.reshape(-1, ref.shape[-1]).double()
    if not torch.isfinite(a).all():
        return float("nan")
    if not a.numel():
        return 1.0
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    close = (a - b).norm(dim=-1) <= 1e-3 * b.norm(dim=-1).clamp_min(1e-12)
    return cos.masked_fill(close, 1.0).min().item()


def mismatch(out: torch.Tensor, ref: torch.Tensor, what: str, reference: str,
             min_cosine: float = 0.99) -> str | None:
    """Why an accelerated path's `out` differs from its reference's `ref` (a shape, a
    non-finite value, a row less similar than `min_cosine`), or None: the first-use check
    of the decode paths and of the attention backends."""
    if out.shape != ref.shape:
        return f"{what} of shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    worst = worst_row_similarity(out, ref)
    if math.isnan(worst):
        return f"non-finite {what}"
    if not worst >= min_cosine:
        return f"{what}: cosine {worst:.4f} against {reference}, below {min_cosine}"
    return None
