"""Activations quantized for the int8 and int4 products (astrai.model.quant, quant4): per
row and block of ACT_BLOCK values, symmetric absmax, as llama.cpp's q8_0 quantizes a row."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACT_BLOCK = 128
"""Activation values per quantization block (csrc/cpu/decode_gemv.cpp's QK)."""


def quantize_activations(x: torch.Tensor, block: int = ACT_BLOCK
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq [M, nb, block] int-valued fp32 in [-127, 127], t [M, nb] fp32): per row
    and block of `block` values (the last zero-padded), t = max|x| / 127 and
    xq = round(x · (127 / max|x|)) in fp32, ties to even — the kernel's arithmetic, so both
    quantize a row to the same values. Each row by its own values only."""
    M, K = x.shape
    nb = -(-K // block)
    xb = F.pad(x.float(), (0, nb * block - K)).view(M, nb, block)  # (M, nb, B)
    amax = xb.abs().amax(-1, keepdim=True)  # (M, nb, 1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(xb * inv), (amax / 127.0).squeeze(-1)
