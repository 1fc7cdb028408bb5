"""Weight-only int8 for inference: symmetric absmax per output row (per-channel scales).

    q[n, :] = round(W[n, :] / s[n]),   s[n] = max|W[n, :]| / 127,   W ≈ s[:, None] · q

computed at load time from the fp32/bf16 weights. Decode reads every weight once per token
(llama.cpp's q8_0 for the same reason: int8 values beside their scale), so a quarter of the
fp32 bytes is most of the gain. Which layers, and which kernel, are stated in docs/engine.md
"Weight formats": every linear layer of the blocks (attention q/k/v/o, SwiGLU gate/up/down,
MoE experts and shared experts; not the router) and the LM head, as llama.cpp quantizes its
output matrix; the embedding table stays in the model's dtype (a lookup reads one row per
token, no bandwidth to save) — with tied embeddings the head gets its own int8 copy.

The product, for a few rows (decoding): astrai's CPU decode kernel where one is installed
(astrai/model/fast_path.py; the engine installs astrai/kernels/cpu_linear.py's on a CPU),
else torch's `aten._weight_int8pack_mm` (bf16 activations, int8 weights, bf16 row scales,
fp32 accumulation) on a CPU with torch's AVX-512 kernel;
otherwise the dequantized weight in the activations' dtype (`F.linear(x, q) · s`), which is
exact to the dequantized model and as fast as the unquantized GEMM for prefill.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model import fast_path
from astrai.model.lora import has_lora

QUANTIZE = ("int8",)
"""Weight formats `--quantize` accepts (besides none)."""
FAST_ROWS = 16
"""Most rows sent through the int8 kernel; above it the dequantized GEMM is faster (the
kernel costs per row; figures in docs/engine.md "Weight formats")."""


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (q [N, K] int8 in [-127, 127], scale [N] fp32): symmetric absmax
    per row, computed in fp32. An all-zero row gets scale 1 (its q is 0)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(q [N, K] int8, scale [N]) -> W [N, K] in `dtype` (computed in fp32)."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def int8_kernel_available(device: torch.device) -> bool:
    """Whether `_weight_int8pack_mm` has a fast path here: torch's CPU kernel is vectorised
    for AVX-512 only (its scalar fallback is slower than the fp32 GEMM)."""
    if device.type != "cpu" or not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return False
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None, *, fast: bool = True,
                scale_bf16: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] = x (s·q)ᵀ + bias, in x's dtype. `fast` allows the int8
    kernel (bf16 activations) when x has at most FAST_ROWS rows."""
    out = fast_path.int8_product(x, q, scale, bias)  # a decode kernel, where active
    if out is not None:
        return out
    x2 = x.reshape(-1, x.shape[-1])  # (M, K), M = all leading dims
    if fast and x2.shape[0] <= FAST_ROWS:
        sb = scale.to(torch.bfloat16) if scale_bf16 is None else scale_bf16
        out = torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16), q, sb).to(x.dtype)
    else:
        out = F.linear(x2, q.to(x.dtype)) * scale.to(x.dtype)  # (M, N)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.view(*x.shape[:-1], q.shape[0])


class Int8Linear(nn.Module):
    """An inference-only nn.Linear with int8 weights and per-row scales (buffers, no
    parameters: nothing trains through it)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("qweight", q)  # (N, K) int8
        self.register_buffer("scale", scale.float())  # (N,) fp32
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16))  # the kernel's dtype
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.fast = int8_kernel_available(q.device)

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> Int8Linear:
        q, scale = quantize_rows(layer.weight)
        return cls(q, scale, layer.bias)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) must not turn the int8 values or the fp32 scales into floats:
        # only the bias follows the model's dtype; a device move re-checks the kernel.
        q, scale, sb = self.qweight, self.scale, self.scale_bf16
        super()._apply(fn, recurse)
        dev = self.qweight.device
        if self.qweight.dtype != torch.int8:
            self.qweight = q.to(dev)
        self.scale, self.scale_bf16 = scale.to(dev), sb.to(dev)
        self.fast = int8_kernel_available(dev)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias, fast=self.fast,
                           scale_bf16=self.scale_bf16)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [N, K] this layer multiplies by."""
        return dequantize_rows(self.qweight, self.scale, dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8 per-row")


def quantize_model(model: nn.Module, fmt: str = "int8", *, head: bool = True) -> nn.Module:
    """Replace every plain nn.Linear of the decoder blocks (not an MoE router: it picks the
    experts, a flip there changes the computation, and it is tiny) by an Int8Linear, and,
    with `head`, the LM head (tied embeddings: an int8 copy of the table becomes
    `lm_head`; the table stays for the lookup). Merge LoRA adapters first (they are refused
    here). In place; returns the model, with `model.quantize = fmt`."""
    if fmt not in QUANTIZE:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {QUANTIZE}")
    if has_lora(model):
        raise ValueError("merge the LoRA adapters (merge_lora) before quantizing")
    with torch.no_grad():
        for parent_name, parent in list(model.named_modules()):
            if not parent_name.startswith("layers."):
                continue
            for leaf, child in list(parent.named_children()):
                if type(child) is nn.Linear and leaf != "router":
                    setattr(parent, leaf, Int8Linear.from_linear(child))
        if head:
            lm = getattr(model, "lm_head", None)
            if type(lm) is nn.Linear:
                model.lm_head = Int8Linear.from_linear(lm)
            elif lm is None and hasattr(model, "embed_tokens"):
                q, scale = quantize_rows(model.embed_tokens.weight)
                model.lm_head = Int8Linear(q, scale)
    model.quantize = fmt
    return model


def weight_count(model: nn.Module) -> int:
    """The model's weights, int8 ones included (they are buffers, not parameters), the
    int8 copy of a tied head counted once, as the table it copies."""
    tied = getattr(getattr(model, "config", None), "tie_embeddings", False)
    n = sum(p.numel() for p in model.parameters())
    return n + sum(m.qweight.numel() for name, m in model.named_modules()
                   if isinstance(m, Int8Linear) and not (tied and name == "lm_head"))
