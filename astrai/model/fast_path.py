"""The few-row work of a decode step — linear products, norms, decode attention — through
faster kernels where a caller hands some in.

    y = fast_path.linear(x, w, b, kernels)              # F.linear(x, w, b), or the kernel
    y = fast_path.int8_product(x2, q, scale, None, kernels)   # None unless a kernel takes it
    fast_path.int8_activations(kernels)                 # int8 products quantize activations?
    q, k, v = fast_path.project_many(x, (q_proj, k_proj, v_proj), kernels)   # or None
    y = fast_path.rms_norm(x, w, eps, kernels)          # None unless a kernel takes it
    o = fast_path.paged_decode(kernels, q, k_buf, v_buf, req_to_token, rows, lens, scale)

Decoding multiplies one row (a few, with concurrent requests) by every weight matrix once per
token, so its speed is the bytes of the weights over the memory bandwidth — if nothing else
costs: torch's int8 and bf16 GEMVs fall well short of it, and each eager op around them
(a norm: ~25 µs in a decode step) adds up over a model's layers. A set of kernels (`DecodeKernels`) is handed in from above —
the CPU decode GEMVs of astrai/kernels/cpu_linear.py, which an engine on a CPU puts in the
ForwardContext of its steps (`ForwardContext.kernels`, astrai/model/context.py) — because the
model room may not import the kernels room (docs/architecture.md "Order of rooms"). Nothing
here is process state: two engines in one process, each with its own kernels (or none), never
see each other's; without kernels every product is torch's. A product goes to the kernel only when it takes it: a CPU tensor, a row count in
the kernel's range for the weights' dtype (`DecodeKernels.rows`), fp32 or bf16
activations, no gradient; everything else, prefill included, stays on torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor


@dataclass(frozen=True)
class DecodeKernels:
    """Kernels for products of a few rows. Each takes x [..., K] fp32 or bf16 and returns
    [..., N] in x's dtype (fp32 products); biases in any float dtype or None."""

    name: str
    """e.g. "avx512, int8 x int8 vnni", for logs and the benchmark."""
    float_gemv: Callable[[Tensor, Tensor, Tensor | None], Tensor]
    """(x, w [N, K] fp32 or bf16, bias) -> x (w)ᵀ + bias."""
    int8_gemv: Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]
    """(x, q [N, K] int8, scale [N] fp32, bias) -> ≈ x (s·q)ᵀ + bias."""
    float_many: Callable[[Tensor, list[Tensor], list[Tensor | None]], list[Tensor]]
    """The float product against several weights (one call, one parallel region)."""
    int8_many: Callable[[Tensor, list[Tensor], list[Tensor], list[Tensor | None]], list[Tensor]]
    """The int8 product against several (q, scale) pairs."""
    rms_norm: Callable[[Tensor, Tensor, float], Tensor] | None = None
    """(x [..., C], w [C] of x's dtype, eps) -> astrai.model.norm.rms_norm(x, w, eps)."""
    paged_decode: Callable[..., Tensor] | None = None
    """Decode attention over the paged KV pool, astrai.kernels.ops.paged_decode's contract
    (q [B, H, D], k_buf, v_buf [S, K, D], req_to_token, req_pool_indices, seq_lens, scale)."""
    decode_plan: Callable[..., object] | None = None
    """(weights, shape, eps, embed, norm) -> a model's decode plan: its blocks' weights
    checked once and held as the kernels take them (csrc/cpu/decode_layers.h)."""
    decode_layers: Callable[..., Tensor] | None = None
    """(plan, rows, cos, sin, k_buf, v_buf, req_to_token, head) -> every block of the
    plan's model for a few query rows, the final norm and the LM head
    (astrai/infer/native_step.py calls it)."""
    layer_slots: tuple[str, ...] = ()
    """decode_layers' per-block weight slots by name, in its order (the library's
    `slot_names`)."""
    int8_quantized: bool = False
    """int8 products quantize the activations (int8_gemv is the q8 dot)."""
    first_argmax: Callable[[Tensor], Tensor] | None = None
    """logits [B, V] fp32 -> each row's first maximal index, as max(dim=-1).indices (greedy
    sampling), on one thread: no OpenMP region to contend with the decode threads."""
    fp32_rows: tuple[int, int] = (1, 16)
    """(fewest, most) rows of a product with fp32 weights the kernel takes: outside, torch's
    GEMM is as fast or faster (astrai/kernels/cpu_linear.py measures the fewest)."""
    bf16_rows: tuple[int, int] = (1, 8)
    """The same for bf16 weights (from 16 rows torch's AMX GEMM wins where there is one)."""
    int8_rows: tuple[int, int] = (1, 16)
    """The same for int8 weights."""
    int4_many: Callable[[Tensor, list[Tensor], list[Tensor], list[Tensor | None]],
                        list[Tensor]] | None = None
    """The int4 product against several (packed [N, K/2] uint8, scale [N, K/32] fp32) pairs
    (astrai/model/quant4.py), or their tiles (`int4_tile`), activations quantized as int8's;
    None: no int4 kernel."""
    int4_rows: tuple[int, int] = (1, 16)
    """The same for int4 weights (beyond, torch's GEMM on the dequantized weights; the
    kernels of cpu_linear take every row count)."""
    int4_tile: int = 0
    """Rows of a tile of int4 weights in tiles (astrai/model/quant4.py tile_rows), which
    int4_many takes besides rows (0: rows only): an engine over its own model tiles its int4
    layers for them."""
    int4_dequant: Callable[[Tensor, Tensor], Tensor] | None = None
    """(packed, scale) -> the fp32 weights [N, K], dequantize_groups' bits, for the products
    torch's GEMM takes (9x faster than torch's elementwise ops)."""

    def rows(self, dtype: torch.dtype) -> tuple[int, int]:
        """The row range of weights of `dtype` (uint8: int4's packed values; (0, 0): none)."""
        return {torch.float32: self.fp32_rows, torch.bfloat16: self.bf16_rows,
                torch.int8: self.int8_rows,
                torch.uint8: self.int4_rows if self.int4_many else (0, 0)}.get(dtype, (0, 0))


_DTYPES = (torch.float32, torch.bfloat16)


def _takes(k: DecodeKernels, x: Tensor, wdtype: torch.dtype) -> bool:
    """A few CPU rows of fp32/bf16 activations (within the kernel's range for weights of
    `wdtype`), and no gradient to flow."""
    if x.device.type != "cpu" or x.dtype not in _DTYPES or torch.is_grad_enabled():
        return False
    lo, hi = k.rows(wdtype)
    return lo * x.shape[-1] <= x.numel() <= hi * x.shape[-1]


def takes(x: Tensor, w: Tensor, k: DecodeKernels | None) -> bool:
    """Whether kernels `k` take x · wᵀ (float weights of x's dtype)."""
    return k is not None and w.dtype == x.dtype and w.dim() == 2 and _takes(k, x, w.dtype)


def linear(x: Tensor, w: Tensor, b: Tensor | None = None,
           k: DecodeKernels | None = None) -> Tensor:
    """F.linear(x, w, b), through kernels `k` when they take the product: a few rows, no
    gradient, fp32 weights with fp32 activations or bf16 with bf16 (the result in x's
    dtype, the products in fp32)."""
    if not takes(x, w, k):
        return F.linear(x, w, b)
    return k.float_gemv(x, w, b)


def int8_product(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None,
                 k: DecodeKernels | None = None) -> Tensor | None:
    """x [..., K] · (scale · q)ᵀ + bias in x's dtype through kernels `k`, or None when
    they do not take it (the caller computes it)."""
    if k is None or q.dtype != torch.int8 or not _takes(k, x, torch.int8):
        return None
    return k.int8_gemv(x, q, scale, bias)


def int4_product(x: Tensor, packed: Tensor, scale: Tensor, bias: Tensor | None = None,
                 k: DecodeKernels | None = None) -> Tensor | None:
    """x [..., K] against int4 weights (astrai/model/quant4.py) + bias in x's dtype through
    kernels `k`, or None when they do not take it (the caller computes it)."""
    if k is None or packed.dtype != torch.uint8 or not _takes(k, x, torch.uint8):
        return None
    return k.int4_many(x, [packed], [scale], [bias])[0]


def int4_weights(packed: Tensor, scale: Tensor, k: DecodeKernels | None) -> Tensor | None:
    """The fp32 weights of int4 `packed`/`scale` through kernels `k`, or None when they have
    no dequantizer for them (the caller computes them)."""
    if k is None or k.int4_dequant is None or packed.device.type != "cpu":
        return None
    return k.int4_dequant(packed, scale)


def int8_activations(k: DecodeKernels | None) -> bool:
    """Whether int8 products quantize their activations per row and block
    (astrai/model/quant.py): yes, unless kernels `k` keep them fp32
    (`DecodeKernels.int8_quantized` False) — torch's products then do the same, so a row's
    result does not depend on which of the two serves it."""
    return k is None or k.int8_quantized


NORM_ELEMENTS = 1 << 16
"""Largest x (elements) a norm kernel takes: the rows of a decode step, not a prefill."""


def rms_norm(x: Tensor, w: Tensor, eps: float, k: DecodeKernels | None) -> Tensor | None:
    """The RMSNorm of kernels `k` for a few rows (x and w of one dtype, fp32 or bf16, no
    gradient), or None: the caller computes it."""
    if (k is None or k.rms_norm is None or x.device.type != "cpu" or x.dtype != w.dtype
            or x.dtype not in _DTYPES or x.numel() > NORM_ELEMENTS or torch.is_grad_enabled()):
        return None
    return k.rms_norm(x, w, eps)


def paged_decode(k: DecodeKernels | None, q: Tensor, k_buf: Tensor, v_buf: Tensor,
                 req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor,
                 scale: float) -> Tensor | None:
    """The decode attention of kernels `k` (one query per request over its first
    seq_lens[b] slots; q and the pool of one dtype, fp32 or bf16), or None."""
    if (k is None or k.paged_decode is None or q.device.type != "cpu" or q.dtype not in _DTYPES
            or k_buf.dtype != q.dtype or torch.is_grad_enabled()):
        return None
    return k.paged_decode(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale)


def project_many(x: Tensor, layers: tuple[nn.Module, ...],
                 k: DecodeKernels | None) -> list[Tensor] | None:
    """[layer(x) for layer in layers] in one kernel call — several projections of the same
    activations (q, k, v; gate, up) — or None when kernels `k` do not take them
    all (plain nn.Linear layers of x's dtype, or int8 layers, astrai/model/quant.py): the
    caller projects one by one. Decoding is bound by per-call overhead at this size, so
    the parameters are read from the modules' dicts."""
    if k is None:
        return None
    kind = type(layers[0])
    if any(type(m) is not kind for m in layers):
        return None
    if kind is nn.Linear:
        ws = [m._parameters["weight"] for m in layers]
        if any(w.dtype != x.dtype for w in ws) or not _takes(k, x, x.dtype):
            return None
        return k.float_many(x, ws, [m._parameters["bias"] for m in layers])
    if "qweight" not in layers[0]._buffers:
        return None
    bufs = [m._buffers for m in layers]
    wdtype = bufs[0]["qweight"].dtype  # int8, or uint8 for int4's packed values
    if not _takes(k, x, wdtype):
        return None
    if wdtype == torch.uint8:
        return k.int4_many(x, [b["qweight"] for b in bufs], [b["scale"] for b in bufs],
                           [b["bias"] for b in bufs])
    return k.int8_many(x, [b["qweight"] for b in bufs], [b["scale"] for b in bufs],
                       [b["bias"] for b in bufs])
