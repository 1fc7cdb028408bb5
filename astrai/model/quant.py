"""Int8 for inference: weights symmetric absmax per output row (per-channel scales),
activations symmetric absmax per row and per block of ACT_BLOCK values, made at each product.

    q[n, :] = round(W[n, :] / s[n]),   s[n] = max|W[n, :]| / 127,   W ≈ s[:, None] · q
    xq[m, b] = round(x[m, b] / t[m, b]),   t[m, b] = max|x[m, b]| / 127   (block b of row m)
    y[m, n] = s[n] · Σ_b t[m, b] · (xq[m, b] · q[n, b])

the weights computed at load time from the fp32/bf16 weights. Decode reads every weight once
per token (llama.cpp's q8_0 for the same reason: int8 values beside their scale), so a quarter
of the fp32 bytes is most of the gain. Which layers, and which kernel, are stated in
docs/engine.md "Weight formats": every linear layer of the blocks (attention q/k/v/o, SwiGLU
gate/up/down, MoE experts and shared experts; not the router) and the LM head, as llama.cpp
quantizes its output matrix; the embedding table stays in the model's dtype (a lookup reads
one row per token, no bandwidth to save) — with tied embeddings the head gets its own int8
copy.

The activations are quantized as llama.cpp's q8_0 × q8_0 dot does (blocks with their own
scale), and each row only by its own values: a row's result never depends on the rows
computed with it, so a request's output does not change with the other requests of its batch
(a scale per tensor, or per batch, would make it). The product is the same function of each
row whatever serves it: astrai's CPU decode kernel for a few rows (astrai/model/fast_path.py;
the engine installs astrai/kernels/cpu_linear.py's on a CPU), else `int8_dot` in torch for
any number of rows, whose block dots are exact integers (|Σ| <= 128 · 127² < 2²⁴, exact in
fp32 in any order) summed over the blocks in one fixed order: bit-identical per row whatever
the batch. A kernel set that keeps fp32 activations (`int8_act="fp32"`, exact to the
dequantized model) makes the torch path keep them too (`F.linear(x, q) · s`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from astrai.errors import UnsupportedModelError
from astrai.model import fast_path
from astrai.model.act_quant import ACT_BLOCK, quantize_activations
from astrai.model.lora import has_lora

QUANTIZE = ("int8", "int4")
"""Weight formats `--quantize` accepts (besides none)."""
DOT_ELEMENTS = 1 << 24
"""Most block dots `int8_dot` holds at once (64 MB of fp32): rows are taken in chunks."""


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


def int8_dot(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
             block: int = ACT_BLOCK) -> torch.Tensor:
    """x [M, K] quantized per row and block (`quantize_activations`) against int8 q [N, K]
    with row scales [N] -> fp32 [M, N]. Each block dot is an exact integer (fp32 holds
    |Σ| <= block · 127² < 2²⁴ in any summation order), the blocks summed in order b = 0, 1, ...
    by elementwise ops: a row's result is bit-identical whatever rows come with it."""
    xq, t = quantize_activations(x, block)  # (M, nb, B), (M, nb)
    M, nb, B = xq.shape
    N, K = q.shape
    qf = q.float() if nb * B == K else F.pad(q.float(), (0, nb * B - K))  # (N, nb·B)
    qb = qf.view(N, nb, B).transpose(0, 1)  # (nb, N, B): strided rows, no copy for the BLAS
    out = torch.empty(M, N, dtype=torch.float32, device=x.device)
    step = max(1, DOT_ELEMENTS // max(1, nb * N))
    for m0 in range(0, M, step):
        dots = torch.bmm(qb, xq[m0:m0 + step].permute(1, 2, 0))  # (nb, N, r), exact
        tb = t[m0:m0 + step].T  # (nb, r)
        acc = dots[0] * tb[0]
        for b in range(1, nb):
            acc += dots[b] * tb[b]
        out[m0:m0 + step] = acc.T
    return out * scale.float()


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None,
                kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] ≈ x (s·q)ᵀ + bias in x's dtype, the activations quantized per
    row and block (the module docstring), through a decode kernel of `kernels` where one
    takes it."""
    out = fast_path.int8_product(x, q, scale, bias, kernels)
    if out is not None:
        return out
    x2 = x.reshape(-1, x.shape[-1])  # (M, K), M = all leading dims
    if fast_path.int8_activations(kernels):
        out = int8_dot(x2, q, scale).to(x.dtype)
    else:  # the kernels keep fp32 activations: so does torch
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
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> Int8Linear:
        q, scale = quantize_rows(layer.weight)
        return cls(q, scale, getattr(layer, "bias", None))  # an nn.Embedding (tied head): none

    def _apply(self, fn, recurse=True):
        # model.to(dtype) must not turn the int8 values or the fp32 scales into floats:
        # only the bias follows the model's dtype.
        q, scale = self.qweight, self.scale
        super()._apply(fn, recurse)
        dev = self.qweight.device
        if self.qweight.dtype != torch.int8:
            self.qweight = q.to(dev)
        self.scale = scale.to(dev)
        return self

    def forward(self, x: torch.Tensor,
                kernels: fast_path.DecodeKernels | None = None) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias, kernels)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [N, K] this layer multiplies by."""
        return dequantize_rows(self.qweight, self.scale, dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8 per-row, activations per row and block")


def quantize_model(model: nn.Module, fmt: str = "int8", *, head: bool = True) -> nn.Module:
    """Replace every plain nn.Linear of the decoder blocks (not an MoE router: it picks the
    experts, a flip there changes the computation, and it is tiny) by an Int8Linear (or an
    Int4Linear, astrai/model/quant4.py), and, with `head`, the LM head (tied embeddings: a
    quantized copy of the table becomes `lm_head`; the table stays for the lookup). Merge
    LoRA adapters first (they are refused here). In place; returns the model, with
    `model.quantize = fmt`."""
    from astrai.model.quant4 import GROUP, Int4Linear

    if fmt not in QUANTIZE:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {QUANTIZE}")
    if has_lora(model):
        raise ValueError("merge the LoRA adapters (merge_lora) before quantizing")
    layer = Int8Linear if fmt == "int8" else Int4Linear
    targets = [(parent, leaf, child) for name, parent in model.named_modules()
               if name.startswith("layers.") for leaf, child in parent.named_children()
               if type(child) is nn.Linear and leaf != "router"]
    if fmt == "int4":
        odd = next((c for _, _, c in targets if c.in_features % GROUP), None)
        if odd is not None:
            raise UnsupportedModelError(f"--quantize int4 needs layers whose inputs are a multiple of "
                             f"{GROUP} wide; this model has one of {odd.in_features}: use int8")
    with torch.no_grad():
        for parent, leaf, child in targets:
            setattr(parent, leaf, layer.from_linear(child))
        if head:
            lm = getattr(model, "lm_head", None)
            if type(lm) is nn.Linear:
                model.lm_head = layer.from_linear(lm)
            elif lm is None and hasattr(model, "embed_tokens"):
                model.lm_head = layer.from_linear(model.embed_tokens)
    model.quantize = fmt
    return model


def weight_count(model: nn.Module) -> int:
    """The model's weights, int8 ones included (they are buffers, not parameters), the
    int8 copy of a tied head counted once, as the table it copies."""
    tied = getattr(getattr(model, "config", None), "tie_embeddings", False)
    n = sum(p.numel() for p in model.parameters())
    return n + sum(m.out_features * m.in_features for name, m in model.named_modules()
                   if "qweight" in m._buffers and not (tied and name == "lm_head"))
