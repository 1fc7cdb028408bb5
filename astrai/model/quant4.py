"""Int4 weights for inference: groups of GROUP = 32 values along each weight row, one scale per
group, stored as llama.cpp's q4_0 block, so a q4_0 GGUF tensor and astrai's int4 layer hold
the same numbers (docs/engine.md "Weight formats").

    group g of row n: d = m / -8, m the value of largest magnitude (with its sign);
    u_j = min(15, floor(w_j / d + 8.5)),   W[n, 32g + j] ≈ d · (u_j - 8)

d is kept as the fp16 value q4_0 stores (in an fp32 tensor); the 32 values u_j in [0, 15] are
packed two per byte: byte j holds u_j in its low nibble and u_{j+16} in its high one.

An engine whose CPU kernels take them (every build, `DecodeKernels.int4_tile`) lays
its layers out in tiles of TILE rows (`tile_rows`, the same numbers reordered): per tile and
group, bytes 4i..4i+3 of the 16 rows' groups side by side (one row per 32-bit lane of the
kernel's vectors), and beside them the 16 rows' scales as fp16, so a decode step reads 0.5625
bytes per weight (q4_0's) with no horizontal sums (csrc/cpu/decode_gemv.cpp q4t_tile). The
module's state dict and dequantized weights are the row layout's whatever it holds.

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
TILE = 16
"""Rows of a tile of the tiled layout (`tile_rows`)."""


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


def tile_rows(packed: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed [N, K/2] uint8, d [N, K/GROUP]) with N a multiple of TILE -> (tiles
    [N/TILE, K/GROUP, TILE·16] uint8, scales [N/TILE, K/GROUP, TILE] fp16): the module
    docstring's tiled layout, the same values."""
    N, half = packed.shape
    groups = half * 2 // GROUP
    if N % TILE:
        raise ValueError(f"tiles of {TILE} rows need a multiple of {TILE} rows, got {N}")
    t = packed.reshape(N // TILE, TILE, groups, 4, 4).permute(0, 2, 3, 1, 4)
    s = d.reshape(N // TILE, TILE, groups).permute(0, 2, 1).half()
    return t.reshape(N // TILE, groups, TILE * 16).contiguous(), s.contiguous()


def untile_rows(tiles: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `tile_rows`: (packed [N, K/2] uint8, d [N, K/GROUP] fp32)."""
    T, groups, _ = tiles.shape
    p = tiles.reshape(T, groups, 4, TILE, 4).permute(0, 3, 1, 2, 4)
    d = scales.float().permute(0, 2, 1)
    return p.reshape(T * TILE, groups * GROUP // 2).contiguous(), d.reshape(T * TILE, groups).contiguous()


def row_layout(packed: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, d) in the row layout, whichever layout they are in (tiles: three dims)."""
    return untile_rows(packed, d) if packed.dim() == 3 else (packed, d)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, d: torch.Tensor,
                bias: torch.Tensor | None = None,
                kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] ≈ x Wᵀ + bias in x's dtype, the activations quantized per row
    and block (the module docstring), through kernels `k` where they take it; `packed`, `d`
    in either layout."""
    out = fast_path.int4_product(x, packed, d, bias, kernels)
    if out is not None:
        return out
    packed, d = row_layout(packed, d)
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
    parameters: nothing trains through it), in the row layout or, after `tile_()`, in
    tiles."""

    def __init__(self, packed: torch.Tensor, d: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        self.register_buffer("qweight", packed)  # (N, K/2) uint8
        self.register_buffer("scale", d.float())  # (N, K/GROUP) fp32; tiles: module docstring
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

    @property
    def tiled(self) -> bool:
        """Whether the weights are in tiles (`tile_rows`)."""
        return self.qweight.dim() == 3

    def tile_(self) -> bool:
        """Lay the weights out in tiles (in place) where the rows fill them; whether they are."""
        if not self.tiled and self.out_features % TILE == 0:
            self.qweight, self.scale = tile_rows(self.qweight, self.scale)
        return self.tiled

    def untile_(self) -> None:
        """Back to the row layout (in place)."""
        if self.tiled:
            self.qweight, self.scale = untile_rows(self.qweight, self.scale)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        packed, d = row_layout(self.qweight, self.scale)  # the state is the row layout's
        destination[prefix + "qweight"], destination[prefix + "scale"] = packed, d

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.untile_()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor,
                kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
        return int4_linear(x, self.qweight, self.scale, self.bias, kernels)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [N, K] this layer multiplies by."""
        return dequantize_groups(*row_layout(self.qweight, self.scale), dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int4 groups of {GROUP} (q4_0)"
                f"{f', tiles of {TILE} rows' if self.tiled else ''}, activations per row and block")


def tile_layers(model: nn.Module) -> int:
    """Every Int4Linear of `model` whose rows fill tiles laid out in tiles (in place, for
    kernels that take them: `DecodeKernels.int4_tile`); how many are."""
    return sum(m.tile_() for m in model.modules() if isinstance(m, Int4Linear))
