"""Int4 weights for inference: groups of GROUP = 32 values along each weight row, one scale per
group, stored as llama.cpp's q4_0 block, so a q4_0 GGUF tensor and astrai's int4 layer hold
the same numbers (docs/engine.md "Weight formats").

    group g of row n: d = m / -8, m the value of largest magnitude (with its sign);
    u_j = min(15, floor(w_j / d + 8.5)),   W[n, 32g + j] ≈ d · (u_j - 8)

d is kept as the fp16 value q4_0 stores (in an fp32 tensor); the 32 values u_j in [0, 15] are
packed two per byte: byte j holds u_j in its low nibble and u_{j+16} in its high one. A
decode step reads 0.625 bytes per weight (half of int8's), which is what bounds it.

The products quantize the activations as the int8 ones do (per row and block of ACT_BLOCK,
astrai.model.act_quant): the CPU kernel (csrc/cpu/decode_gemv.cpp gemv_q4)
takes exact int32 dots of each group; torch's path multiplies the same dequantized
activations by the dequantized weights, so both compute one function of each row (up to the
order of the float sums).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model import fast_path
from astrai.model.act_quant import quantize_activations

GROUP = 32
"""Weights per scale (q4_0's block)."""


def quantize_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float (K a multiple of GROUP) -> (packed [N, K/2] uint8, d [N, K/GROUP] fp32
    holding fp16 values), the q4_0 rule of the module docstring, computed in fp32."""
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"int4 weights need rows of a multiple of {GROUP} values, got {K}")
    g = w.detach().float().reshape(N, K // GROUP, GROUP)
    m = g.gather(-1, g.abs().argmax(-1, keepdim=True))  # (N, G, 1): signed largest magnitude
    d = m / -8.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    u = torch.floor(g * inv + 8.5).clamp_(0, 15).to(torch.uint8)  # (N, G, 32)
    packed = u[..., :GROUP // 2] | (u[..., GROUP // 2:] << 4)
    return packed.reshape(N, K // 2).contiguous(), d.squeeze(-1).half().float()


def dequantize_groups(packed: torch.Tensor, d: torch.Tensor,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(packed [N, K/2] uint8, d [N, K/GROUP]) -> W [N, K] in `dtype` (computed in fp32)."""
    N = packed.shape[0]
    p = packed.reshape(N, -1, GROUP // 2)
    u = torch.cat([p & 0x0F, p >> 4], dim=-1).float()  # (N, G, 32) in [0, 15]
    return ((u - 8.0) * d.float()[..., None]).reshape(N, -1).to(dtype)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, d: torch.Tensor,
                bias: torch.Tensor | None = None,
                kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] ≈ x Wᵀ + bias in x's dtype, the activations quantized per row
    and block (the module docstring), through kernels `k` where they take it."""
    out = fast_path.int4_product(x, packed, d, bias, kernels)
    if out is not None:
        return out
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    xq, t = quantize_activations(x2)  # (M, nb, B), (M, nb)
    xh = (xq * t[..., None]).reshape(x2.shape[0], -1)[:, :K]  # what the kernel multiplies
    w = fast_path.int4_weights(packed, d, kernels)
    y = F.linear(xh, dequantize_groups(packed, d) if w is None else w)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], packed.shape[0])


class Int4Linear(nn.Module):
    """An inference-only nn.Linear with int4 weights in groups of GROUP (buffers, no
    parameters: nothing trains through it)."""

    def __init__(self, packed: torch.Tensor, d: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        self.register_buffer("qweight", packed)  # (N, K/2) uint8
        self.register_buffer("scale", d.float())  # (N, K/GROUP) fp32
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, layer: nn.Module) -> Int4Linear:
        packed, d = quantize_groups(layer.weight)
        return cls(packed, d, getattr(layer, "bias", None))  # an nn.Embedding: none

    def _apply(self, fn, recurse=True):
        # model.to(dtype) must not turn the packed values or the fp32 scales into floats:
        # only the bias follows the model's dtype.
        packed, d = self.qweight, self.scale
        super()._apply(fn, recurse)
        dev = self.qweight.device
        if self.qweight.dtype != torch.uint8:
            self.qweight = packed.to(dev)
        self.scale = d.to(dev)
        return self

    def forward(self, x: torch.Tensor,
                kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
        return int4_linear(x, self.qweight, self.scale, self.bias, kernels)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [N, K] this layer multiplies by."""
        return dequantize_groups(self.qweight, self.scale, dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int4 groups of {GROUP} (q4_0), activations "
                "per row and block")
