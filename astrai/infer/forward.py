"""The inference forward pass: the model's own weights, fewer kernel launches.

Single-request decoding of a small model on CPU is bound by per-operator overhead, not
FLOPs (gpt-fast's observation on GPU launch overhead holds here too). This is
`Transformer.forward` for the ragged step (B = 1, T = N) with the same math and the same
weights, read from the modules at every call (so an engine sharing a model being trained —
GRPO rollouts — always sees the current weights), but with
  * RMSNorm through the fused `F.rms_norm` (still fp32 normalise, cast, then gain);
  * q and k rotated together in one rotate-half pass, with the cos/sin of the step's
    positions prepared once for all layers;
  * no nn.Module dispatch per sub-layer.
`supports(model)` accepts only the exact module classes it mirrors; anything else runs the
model's own forward. tests/infer/test_forward.py holds the two equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from astrai.model.attention import Attention
from astrai.model.block import DecoderBlock
from astrai.model.context import SDPA, ForwardContext
from astrai.model.mlp import SwiGLU
from astrai.model.moe import MoE
from astrai.model.norm import RMSNorm
from astrai.model.transformer import Transformer


def supports(model: torch.nn.Module) -> bool:
    """True when `model` is exactly the astrai Transformer this forward mirrors."""
    if type(model) is not Transformer or type(model.norm) is not RMSNorm:
        return False
    return all(
        type(b) is DecoderBlock and type(b.attn) is Attention and type(b.attn_norm) is RMSNorm
        and type(b.mlp_norm) is RMSNorm and type(b.mlp) in (SwiGLU, MoE)
        for b in model.layers
    )


def _rms(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    # astrai.model.norm.RMSNorm: normalise in fp32, cast back, then multiply by the gain
    if x.dtype == torch.float32:  # one fused op; the same products in the same order
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps).to(x.dtype)


def _linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def forward_hidden(model: Transformer, input_ids: torch.Tensor, positions: torch.Tensor,
                   ctx: ForwardContext) -> torch.Tensor:
    """input_ids, positions [N] -> final normed hidden states [N, C]."""
    cfg = model.config
    ctx.sliding_window = cfg.sliding_window
    H, K, D = cfg.n_heads, cfg.kv_heads, cfg.hdim
    N = input_ids.shape[0]
    x = F.embedding(input_ids, model.embed_tokens.weight)  # (N, C)
    dtype = x.dtype
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]  # (N, D/2) fp32
    # rotate-half as one multiply-add: x * [cos, cos] + [x2, x1] * [-sin, sin]
    cos2 = torch.cat((cos, cos), -1).to(dtype)[:, None]  # (N, 1, D)
    sin2 = torch.cat((-sin, sin), -1).to(dtype)[:, None]
    half = D // 2
    backend = ctx.backend or SDPA
    for block in model.layers:
        attn = block.attn
        h = _rms(x, block.attn_norm)
        q = _linear(h, attn.q_proj).view(N, H, D)  # (N, H, D)
        k = _linear(h, attn.k_proj).view(N, K, D)  # (N, K, D)
        v = _linear(h, attn.v_proj).view(N, K, D)
        qk = torch.cat((q, k), 1)  # (N, H+K, D)
        qk = qk * cos2 + qk.roll(half, -1) * sin2  # roll(half) = [x2, x1]
        out = backend.attend(qk[None, :, :H], qk[None, :, H:], v[None], attn.layer, ctx)
        x = x + F.linear(out.reshape(N, H * D), attn.o_proj.weight)
        h = _rms(x, block.mlp_norm)
        mlp = block.mlp
        if block.is_moe:
            x = x + mlp(h[None])[0][0]
        else:
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight))
                             * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)
    return _rms(x, model.norm)
