"""The linear products of inference, with a slot for faster kernels on a few rows (decoding).

    y = fast_linear.linear(x, w, b)              # F.linear(x, w, b), or an installed kernel
    y = fast_linear.int8_product(x2, q, scale)   # None unless a kernel takes it

Decoding multiplies one row (a few, with concurrent requests) by every weight matrix once per
token, so its speed is the bytes of the weights over the memory bandwidth; torch's CPU GEMV
reaches about half of that. A set of kernels (`DecodeKernels`) is installed here from above —
the CPU decode GEMVs of astrai/kernels/cpu_linear.py, which the engine installs on a CPU —
because the model room may not import the kernels room (docs/architecture.md "Order of
rooms"). A product goes to the kernel only when it takes it: a CPU tensor, at most
`max_rows` rows, fp32 (or bf16) activations and weights, nothing that needs a gradient;
everything else, prefill included, stays on torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


@dataclass(frozen=True)
class DecodeKernels:
    """Kernels for products of a few rows; each takes x [M, K] fp32 contiguous."""

    name: str
    """e.g. "avx512 (vnni)", for logs and the benchmark."""
    float_gemv: Callable[[Tensor, Tensor, Tensor | None], Tensor]
    """(x, w [N, K] fp32 or bf16, bias fp32 or None) -> fp32 [M, N]."""
    int8_gemv: Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]
    """(x, q [N, K] int8, scale [N] fp32, bias fp32 or None) -> fp32 [M, N] ≈ x (s·q)ᵀ."""
    max_rows: int = 16
    """Most rows of a float product sent to the kernel (above it torch's GEMM is faster)."""
    max_rows_int8: int = 16
    """The same for int8 weights."""
    bf16: bool = True
    """Whether bf16 weights go to float_gemv."""


_kernels: DecodeKernels | None = None


def install(kernels: DecodeKernels | None) -> DecodeKernels | None:
    """Make `kernels` serve the products they take (None: torch for all); returns the set
    that was installed before."""
    global _kernels
    before, _kernels = _kernels, kernels
    return before


def installed() -> DecodeKernels | None:
    return _kernels


def _rows(x: Tensor) -> int:
    return x.numel() // max(1, x.shape[-1])


def _takes(x: Tensor, w: Tensor, limit: int) -> bool:
    return (x.device.type == "cpu" and _rows(x) <= limit and w.stride(-1) == 1
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)))


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x, w, b), through the installed kernel when it takes the product (fp32
    weights with fp32 activations, bf16 with bf16; the result in x's dtype)."""
    k = _kernels
    if k is None or not _takes(x, w, k.max_rows) or w.dtype != x.dtype or w.dim() != 2:
        return F.linear(x, w, b)
    if x.dtype != torch.float32 and not (k.bf16 and x.dtype == torch.bfloat16):
        return F.linear(x, w, b)
    x2 = x.reshape(-1, x.shape[-1]).float().contiguous()  # (M, K)
    out = k.float_gemv(x2, w, None if b is None else b.float())
    return out.to(x.dtype).view(*x.shape[:-1], w.shape[0])


def int8_product(x2: Tensor, q: Tensor, scale: Tensor,
                 bias: Tensor | None = None) -> Tensor | None:
    """x2 [M, K] · (scale · q)ᵀ + bias in x2's dtype through the installed kernel, or None
    when no kernel takes it (the caller computes it)."""
    k = _kernels
    if k is None or not _takes(x2, q, k.max_rows_int8) or q.dtype != torch.int8:
        return None
    if x2.dtype not in (torch.float32, torch.bfloat16) or scale.dtype != torch.float32:
        return None
    out = k.int8_gemv(x2.float().contiguous(), q, scale, None if bias is None else bias.float())
    return out.to(x2.dtype)
