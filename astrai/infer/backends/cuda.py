"""CudaBackend: astrai's own paged-attention kernels (csrc/, docs/kernels.md).

Per layer it writes the step's k/v at `out_cache_loc`, then
  * a pure decode step (every request brings one token) runs `paged_decode`: page size 1,
    the req_to_token row is the page table, split-KV when the batch is too small to fill the
    GPU;
  * any other step runs the ragged `paged_prefill` over qo_indptr / kv_indptr / kv_indices,
    the prefix K/V read back from the pool.
It serves fp16/bf16 (decode also fp32) CUDA calls with head dim 32, 64 or 128, no sliding
window narrower than the step's longest sequence, and a KV pool of the query's dtype; for
anything else `supports` names the reason and the dispatcher falls through to the next
backend (or, when "cuda" was asked for by name, raises).
"""

from __future__ import annotations

import torch

from astrai.infer.backends.base import write_kv
from astrai.kernels import library as _lib
from astrai.kernels.ops import paged_decode, paged_prefill
from astrai.model.context import ForwardContext


class CudaBackend:
    name = "cuda"

    @staticmethod
    def unavailable_reason() -> str | None:
        if not torch.cuda.is_available():
            return "no CUDA device"
        try:
            _lib.get_library()  # builds on first use (cached) unless ASTRAI_BUILD_KERNELS=0
        except _lib.KernelUnavailable as e:
            return f"CUDA kernels unavailable: {e}"
        return None

    def supports(self, q: torch.Tensor, ctx: ForwardContext) -> str | None:
        c = ctx.cache
        if c is None:
            return "no KV-cache record (training path)"
        if not q.is_cuda:
            return f"tensors on {q.device.type}"
        q3 = q[0]  # (N, H, D)
        k_buf = c.k_buf[0]  # (S, K, D)
        why = (_lib.decode_supported(q3, k_buf) if c.is_decode
               else _lib.prefill_supported(q3, k_buf))
        if why is not None:
            return why
        w = ctx.sliding_window
        if w is not None and c.seq_lens_cpu and max(c.seq_lens_cpu) > w:
            return f"sliding window {w} (the kernels attend to the whole context)"
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               ctx: ForwardContext) -> torch.Tensor:
        c = ctx.cache
        write_kv(k, v, layer, ctx)
        kb, vb = c.k_buf[layer], c.v_buf[layer]  # (S, K, D)
        scale = q.shape[-1] ** -0.5
        if c.is_decode:
            rows = c.plans.get(self.name)
            if rows is None:  # once per step, shared by the layers
                rows = c.plans[self.name] = c.req_pool_indices.to(torch.int32)
            out = paged_decode(q[0], kb, vb, c.req_to_token, rows, c.seq_lens, scale)
        else:
            out = paged_prefill(q[0], kb, vb, c.qo_indptr, c.kv_indptr, c.kv_indices, scale,
                                True)
        return out.unsqueeze(0)  # (1, N, H, D)
