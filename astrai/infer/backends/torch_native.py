"""TorchNativeBackend: write K/V, gather through the page table, torch SDPA. Always there.

Per step (on the first layer) it plans from the record alone, and the other layers reuse
the plan:
  * requests with one query token (decodes) form one padded batch: their pages are
    gathered page-wise — a page is P contiguous slots, so each copy is a memcpy of P rows
    rather than P scattered ones — into [Bd, Lg, K, D], with a key-padding (and window)
    mask;
  * requests with several query tokens (prefill chunks) run one by one: a fresh prompt
    attends over its own new k/v (is_causal); one with cached KV gathers its slots
    through kv_indices under a bottom-right-aligned causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai.infer.cache.record import KVCache
from astrai.model import fast_path
from astrai.model.context import SDPA, ForwardContext


@dataclass
class _DecodePlan:
    q_index: torch.Tensor | None  # (Bd,) flat token rows; None when all N tokens are decodes
    page_ids: torch.Tensor  # (Bd * n_pages,) int64
    page_size: int  # P
    span: int  # slots read from each page: P, or Lmax when one page covers every request
    mask: torch.Tensor | None  # (Bd, 1, 1, Lg) bool; None when nothing is masked
    first_page: int | None = None  # one request whose pages are consecutive: a view, no copy
    keys: slice | None = None  # one request: the gathered positions it attends to (no mask)


@dataclass
class _ExtendPlan:
    q0: int  # query rows q0:q1 of the step
    q1: int
    slots: torch.Tensor | None  # (kv_len,) int64; None = no cached prefix, use the new k/v
    mask: torch.Tensor | None  # (qo_len, kv_len) bool; None = plain causal


class TorchNativeBackend:
    name = "torch_native"

    def __init__(self) -> None:
        self._views: dict[tuple, tuple[torch.Tensor, ...]] = {}

    @staticmethod
    def unavailable_reason() -> str | None:
        return None

    def supports(self, q: torch.Tensor, ctx: ForwardContext) -> str | None:
        return None

    def _layer_views(self, c: KVCache, layer: int) -> tuple[torch.Tensor, ...]:
        """Layer `layer`'s buffers, flat [S, K, D] and paged [S/P, P, K*D] (views made
        once per pool and layer: single-token decoding is bound by per-op overhead)."""
        key = (c.k_buf.data_ptr(), c.v_buf.data_ptr(), tuple(c.k_buf.shape), layer, c.page_size)
        views = self._views.get(key)
        if views is None:
            kb, vb = c.k_buf[layer], c.v_buf[layer]
            S, K, D = kb.shape
            views = (kb, vb, kb.view(S // c.page_size, c.page_size, K * D),
                     vb.view(S // c.page_size, c.page_size, K * D))
            if len(self._views) > 1024:
                self._views.clear()
            self._views[key] = views
        return views

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               ctx: ForwardContext) -> torch.Tensor:
        c = ctx.cache
        if c is None:  # no cache: the training path
            return SDPA.attend(q, k, v, layer, ctx)
        kb, vb, kp, vp = self._layer_views(c, layer)
        k, v = k[0], v[0]  # (N, K, D)
        if k.dtype != kb.dtype:
            k, v = k.to(kb.dtype), v.to(vb.dtype)
        kb.index_copy_(0, c.out_cache_loc, k)  # write first: the new tokens attend to themselves
        vb.index_copy_(0, c.out_cache_loc, v)
        plan = c.plans.get(self.name)
        if plan is None:
            plan = c.plans[self.name] = plan_step(c, ctx.sliding_window)
        decode, extends = plan
        if decode is not None and decode.q_index is None:  # a pure decode step
            if ctx.sliding_window is None:  # a CPU decode kernel, where the step has one
                out = fast_path.paged_decode(ctx.kernels, q[0], kb, vb, c.req_to_token,
                                             c.req_pool_indices, c.seq_lens,
                                             q.shape[-1] ** -0.5)
                if out is not None:
                    return out.unsqueeze(0)
            return _decode(q[0], kp, vp, decode, kb.shape[1]).unsqueeze(0)  # (1, N, H, D)
        out = torch.empty_like(q[0])  # (N, H, D)
        if decode is not None:
            out[decode.q_index] = _decode(q[0, decode.q_index], kp, vp, decode, kb.shape[1])
        for e in extends:
            s = slice(e.q0, e.q1)
            out[s] = _extend(q[0, s], k[s], v[s], kb, vb, e)
        return out.unsqueeze(0)


def plan_step(c: KVCache, window: int | None) -> tuple[_DecodePlan | None, list[_ExtendPlan]]:
    """Split the step into the decode batch and the prefill requests (shared by layers)."""
    qo, seq, P = c.qo_lens_cpu, c.seq_lens_cpu, c.page_size
    dev = c.req_to_token.device
    qo_ptr, kv_ptr = [0], [0]
    for a, b in zip(qo, seq):
        qo_ptr.append(qo_ptr[-1] + a)
        kv_ptr.append(kv_ptr[-1] + b)
    dec = [b for b, n in enumerate(qo) if n == 1]
    decode = None
    if dec:
        all_dec = len(dec) == len(qo)
        seqs = [seq[b] for b in dec]
        l_max = max(seqs)
        n_pages = -(-l_max // P)
        span = P if n_pages > 1 else l_max
        first = None
        if c.pages_cpu is not None:  # host-side page lists: one small copy
            ids = [pg for b in dec for pg in (c.pages_cpu[b] + [0] * n_pages)[:n_pages]]
            if len(dec) == 1 and ids == list(range(ids[0], ids[0] + n_pages)):
                first = ids[0]  # e.g. a lone request on a fresh pool: read in place
            page_ids = torch.tensor(ids, dtype=torch.int64).to(dev)
        else:  # read the first slot of each page from req_to_token
            rows = (c.req_pool_indices if all_dec
                    else c.req_pool_indices[torch.tensor(dec, device=dev)])
            cols = torch.arange(n_pages, device=dev) * P
            page_ids = (c.req_to_token[rows[:, None], cols[None, :]] // P).long().flatten()
        l_g = n_pages * span
        mask = keys = None
        if len(dec) == 1:  # a lone decode reads exactly its positions: no mask to build
            keys = slice(0 if window is None else max(0, seqs[0] - window), seqs[0])
        elif min(seqs) < l_g or window is not None:
            s = torch.tensor(seqs, device=dev)[:, None]
            j = torch.arange(l_g, device=dev)[None, :]
            valid = j < s
            if window is not None:  # the query sits at position s - 1
                valid &= j >= s - window
            mask = valid[:, None, None, :]  # (Bd, 1, 1, Lg)
        q_index = None if all_dec else torch.tensor([qo_ptr[b] for b in dec], device=dev)
        decode = _DecodePlan(q_index, page_ids, P, span, mask, first, keys)
    extends = []
    for b, n in enumerate(qo):
        if n == 1:
            continue
        prefix = seq[b] - n
        slots = None if prefix == 0 else c.kv_indices[kv_ptr[b]:kv_ptr[b + 1]].long()
        mask = None
        if prefix > 0 or window is not None:
            i = torch.arange(n, device=dev)[:, None] + prefix  # query positions
            j = torch.arange(seq[b] if prefix else n, device=dev)[None, :]
            mask = j <= i
            if window is not None:
                mask &= j > i - window
        extends.append(_ExtendPlan(qo_ptr[b], qo_ptr[b + 1], slots, mask))
    return decode, extends


def _decode(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, d: _DecodePlan,
            K: int) -> torch.Tensor:
    """q [Bd, H, D] (one token per request), kp/vp paged views [S/P, P, K*D] -> [Bd, H, D]."""
    Bd, H, D = q.shape
    if d.span != d.page_size:
        kp, vp = kp[:, : d.span], vp[:, : d.span]
    if d.first_page is not None:  # consecutive pages: a view of the pool
        n = d.page_ids.shape[0]
        kk, vv = kp[d.first_page:d.first_page + n], vp[d.first_page:d.first_page + n]
    else:
        kk, vv = kp.index_select(0, d.page_ids), vp.index_select(0, d.page_ids)
    kk = kk.reshape(Bd, -1, K, D).transpose(1, 2)  # (Bd, K, Lg, D)
    vv = vv.reshape(Bd, -1, K, D).transpose(1, 2)
    if d.keys is not None:
        kk, vv = kk[:, :, d.keys], vv[:, :, d.keys]  # (1, K, L, D)
    if kk.dtype != q.dtype:
        kk, vv = kk.to(q.dtype), vv.to(q.dtype)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, attn_mask=d.mask,
                                         enable_gqa=H != K)  # (Bd, H, 1, D)
    return out.squeeze(2)


def _extend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kb: torch.Tensor,
            vb: torch.Tensor, e: _ExtendPlan) -> torch.Tensor:
    """One request's T query tokens q [T, H, D] -> [T, H, D]."""
    if e.slots is not None:  # cached prefix: read every position back from the pool
        k, v = kb.index_select(0, e.slots), vb.index_select(0, e.slots)  # (kv_len, K, D)
    # the pool's values (rounded where its dtype is narrower), attended in q's dtype
    k, v = k.to(q.dtype), v.to(q.dtype)
    # 4-D (a batch of one): torch's CPU flash kernel takes only 4-D inputs, and 3-D ones
    # fall to the math path, which materialises every score (3.6x slower at 512 tokens)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=e.mask, is_causal=e.mask is None, enable_gqa=q.shape[1] != k.shape[1],
    )  # (1, H, T, D)
    return out[0].transpose(0, 1)
