"""Rotary position embedding (Su et al., 2021) with HF-compatible frequency scaling.

Convention: "rotate half" — dimension i is paired with i + D/2 — the layout HF Llama,
Qwen2 and Mistral checkpoints use, so their weights load without permutation. The cos/sin
table is precomputed in fp32 as [max_len, D/2] and indexed by position ids.
"""

from __future__ import annotations

import math

import torch

from astrai.model.config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies [D/2] (fp32) and the attention factor applied to cos/sin."""
    d = head_dim
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = scaling or RopeScaling()
    if s.type == "none" or (s.type != "yarn" and s.factor == 1.0):
        return inv_freq.float(), 1.0
    if s.type == "linear":  # position interpolation: positions / factor
        return (inv_freq / s.factor).float(), 1.0
    if s.type == "ntk":  # static NTK-aware base change (bloc97): theta' = theta * f^(d/(d-2))
        base = theta * s.factor ** (d / (d - 2))
        return (1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))).float(), 1.0
    if s.type == "llama3":
        return _llama3(inv_freq, s).float(), 1.0
    if s.type == "yarn":
        return _yarn(d, theta, s)
    raise ValueError(f"unknown rope scaling type {s.type}")


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth blend between.
    old_len = s.original_max_position_embeddings or 8192
    low_wavelen = old_len / s.low_freq_factor
    high_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def _yarn(d: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    # YaRN (Peng et al., 2023): NTK-by-parts interpolation plus a cos/sin attention factor.
    old_len = s.original_max_position_embeddings or 4096
    factor = s.factor
    attn = s.attention_factor
    if attn is None:
        attn = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

    def correction_dim(rotations: float) -> float:
        return (d * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 = keep the original (high-frequency) dimension
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq.float(), float(attn)


def rope_table(head_dim: int, max_len: int, theta: float, scaling: RopeScaling | None = None,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each [max_len, D/2] fp32."""
    inv_freq, attn = rope_inv_freq(head_dim, theta, scaling)
    t = torch.arange(max_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # (max_len, D/2)
    return (freqs.cos() * attn).to(device), (freqs.sin() * attn).to(device)


def rope_factors(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, D/2] -> ([cos, cos], [-sin, sin]), each [B, T, 1, D] (same dtype):
    with them, rotate-half is one multiply-add (`rotate`). Built once per forward pass."""
    c = torch.cat((cos, cos), dim=-1).unsqueeze(-2)  # (B, T, 1, D)
    s = torch.cat((-sin, sin), dim=-1).unsqueeze(-2)
    return c, s


def rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, D] by the factors of `rope_factors` (rounded to x's dtype):
    x * [cos, cos] + [x2, x1] * [-sin, sin] = [x1 cos - x2 sin, x2 cos + x1 sin]."""
    if c.dtype != x.dtype:
        c, s = c.to(x.dtype), s.to(x.dtype)
    return x * c + x.roll(x.shape[-1] // 2, dims=-1) * s  # roll by D/2: [x2, x1]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, D] by cos/sin [B, T, D/2] (rotate-half pairing)."""
    return rotate(x, *rope_factors(cos, sin))
