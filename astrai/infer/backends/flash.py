"""FlashAttnBackend: a thin adapter over flash-attn's varlen kernel (optional).

flash-attn cannot be installed on the CPU build machines, so this adapter is exercised in
tests against a stand-in with flash-attn's call signature; on a GPU with `flash_attn`
importable it serves fp16/bf16 CUDA calls. It writes the step's K/V into the pool, gathers
every request's slots through kv_indices into one packed [nnz, K, D] tensor and calls
`flash_attn_varlen_func` with cu_seqlens_q = qo_indptr and cu_seqlens_k = kv_indptr.
flash-attn's causal mask is bottom-right aligned for seqlen_q != seqlen_k, which is exactly
"query i of a request sits at position kv_len - qo_len + i".
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from astrai.infer.backends.base import write_kv
from astrai.model.context import ForwardContext


class FlashAttnBackend:
    name = "flash"
    devices = ("cuda",)
    dtypes = (torch.float16, torch.bfloat16)

    @staticmethod
    def unavailable_reason() -> str | None:
        if importlib.util.find_spec("flash_attn") is None:
            return "the flash_attn package is not installed (pip install astrai[flash])"
        if not torch.cuda.is_available():
            return "flash-attn needs CUDA"
        return None

    def __init__(self) -> None:
        self._varlen = importlib.import_module("flash_attn").flash_attn_varlen_func

    def supports(self, q: torch.Tensor, ctx: ForwardContext) -> str | None:
        c = ctx.cache
        if c is None:
            return "no KV-cache record (training path)"
        if q.device.type not in self.devices:
            return f"tensors on {q.device.type}"
        if q.dtype not in self.dtypes or c.k_buf.dtype != q.dtype:
            return f"dtype {q.dtype} (KV {c.k_buf.dtype}); flash-attn takes fp16/bf16"
        if q.shape[-1] > 256 or q.shape[-1] % 8:
            return f"head dim {q.shape[-1]}"
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
               ctx: ForwardContext) -> torch.Tensor:
        write_kv(k, v, layer, ctx)  # first: the new tokens attend to themselves
        c = ctx.cache
        slots = c.kv_indices.long()
        kk = c.k_buf[layer].index_select(0, slots)  # (nnz, K, D)
        vv = c.v_buf[layer].index_select(0, slots)
        w = ctx.sliding_window
        out = self._varlen(
            q[0], kk, vv, cu_seqlens_q=c.qo_indptr, cu_seqlens_k=c.kv_indptr,
            max_seqlen_q=max(c.qo_lens_cpu), max_seqlen_k=max(c.seq_lens_cpu),
            causal=True, window_size=(w - 1, 0) if w else (-1, -1),
        )  # (N, H, D)
        return out.unsqueeze(0)
