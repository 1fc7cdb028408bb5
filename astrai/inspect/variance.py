"""Residual-stream variance with and without residual scaling (paper §"Stage 1").

The closed form reproduces the paper's table: for a unit-variance, RMS-normed block input a
Linear(d_in, d_out) with N(0, s) weights gives variance d_in * s^2; the per-block residual
term is attention out (q_width * s_o^2 * qkv variance) plus FFN down (ffn * s_down^2 *
up * SiLU(gate)), 0.689 at the paper's shapes, and after L blocks Var(x_L) = Var(x_0) + L *
per-block: 1 + 24 * 0.689 = 17.5 unscaled. Residual scaling (s_o = s_down = s / sqrt(2L))
divides the per-block term by 2L = 48: 1 + 24 * 0.014 = 1.34. (The paper's table writes the
scaled terms as x/L, but its own 0.014 and 1.34 use x/(2L); variance scales with s^2.)

The measurement runs the real blocks on real (or random) tokens and reports Var(x_l) after
each block relative to the variance entering block 0. Embeddings drawn from N(0, 0.02) give
Var(x_0) = 4e-4, not the closed form's 1, so the measured ratios are reported beside it, with
a second series whose input is rescaled to unit variance (the closed form's assumption).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from astrai.errors import UnsupportedModelError
from astrai.model.block import DecoderBlock
from astrai.model.config import ModelConfig
from astrai.model.context import ForwardContext
from astrai.model.init import RESIDUAL_PROJECTIONS, init_weights
from astrai.model.presets import PRESETS, get_preset
from astrai.model.rope import rope_factors, rope_table

PAPER_SILU_FACTOR = 0.298
"""The paper's Var(SiLU(z)) / Var(z) at z ~ N(0, 0.6144)."""


@dataclass(frozen=True)
class BlockVariance:
    """The paper's per-stage variances for a unit-variance block input."""

    qkv: float
    attn_out: float
    gate: float
    silu: float
    product: float
    down: float

    @property
    def block(self) -> float:
        """Per-block residual term R = R_attn + R_ffn."""
        return self.attn_out + self.down


def block_variance(c: ModelConfig, *, scaled: bool,
                   silu_factor: float = PAPER_SILU_FACTOR) -> BlockVariance:
    """The paper's Stage-1 table for config `c` (attention modelled as passing V's variance)."""
    s = c.init_std
    s_res = s / math.sqrt(2 * c.n_layers) if scaled else s
    qkv = c.dim * s * s  # 1536 * 0.02^2 = 0.6144
    attn = c.n_heads * c.hdim * s_res * s_res * qkv  # W_o: Linear(H*D, d)
    gate = up = c.dim * s * s
    silu = gate * silu_factor
    prod = up * silu
    down = c.ffn_dim * s_res * s_res * prod
    return BlockVariance(qkv, attn, gate, silu, prod, down)


def closed_form_final(per_block: float, n_layers: int, input_var: float = 1.0) -> float:
    """Var(x_L) = Var(x_0) + L * per-block (the paper's additive model)."""
    return input_var + n_layers * per_block


def silu_second_moment_ratio(var: float, n: int = 80) -> float:
    """E[SiLU(z)^2] / Var(z) for z ~ N(0, var), by Gauss-Hermite quadrature (the exact value
    of the factor the paper rounds to 0.298)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)  # weight exp(-x^2 / 2)
    z = x * math.sqrt(var)
    silu = z / (1 + np.exp(-z))
    return float((w * silu**2).sum() / math.sqrt(2 * math.pi) / var)


@dataclass
class VarianceSeries:
    """One forward pass: variance after each block."""

    name: str
    entry_var: float
    """Var(x_0): what enters block 0."""
    after: list[float] = field(default_factory=list)
    """Var(x_{l+1}) after each block l."""
    branch: list[float] = field(default_factory=list)
    """Var(x_{l+1} - x_l): the block's residual contribution."""

    @property
    def ratio(self) -> list[float]:
        return [v / self.entry_var for v in self.after]


@dataclass
class VarianceReport:
    """Measured residual variance beside the paper's closed form."""

    target: str
    config: ModelConfig
    tokens: tuple[int, int]
    """(B, T) of the forward pass."""
    closed_unscaled: BlockVariance
    closed_scaled: BlockVariance
    series: list[VarianceSeries]
    silu_exact: float
    """The exact SiLU factor at the config's gate variance (the paper uses 0.298)."""

    def get(self, name: str) -> VarianceSeries | None:
        return next((s for s in self.series if s.name == name), None)

    def contribution_ratio(self, prefix: str = "") -> float:
        """Mean per-block residual contribution unscaled / scaled (expected ~ 2L)."""
        u, s = self.get(prefix + "unscaled"), self.get(prefix + "scaled")
        if u is None or s is None:
            return math.nan
        return (sum(u.branch) / len(u.branch)) / (sum(s.branch) / len(s.branch))

    @property
    def closed_final(self) -> tuple[float, float]:
        """(unscaled, scaled) Var(x_L) for unit input: (17.5, 1.34) at the paper's shapes."""
        L = self.config.n_layers
        return (closed_form_final(self.closed_unscaled.block, L),
                closed_form_final(self.closed_scaled.block, L))


def _variance(x: torch.Tensor) -> float:
    return float(x.double().var(unbiased=False))


def _fresh_block(c: ModelConfig, i: int, gen: torch.Generator) -> DecoderBlock:
    # Built on meta and initialised once (no default init) with the model's own rule.
    with torch.device("meta"):
        block = DecoderBlock(c, i)
    block.to_empty(device="cpu")
    holder = nn.Module()
    holder.config, holder.block = c, block
    init_weights(holder, gen)  # type: ignore[arg-type]  # needs .config and modules only
    return block


def _unscale(block: nn.Module, L: int) -> None:
    """W_o, W_down back to N(0, s): undo the 1/sqrt(2L) of residual-scaled init."""
    with torch.no_grad():
        for name, mod in block.named_modules():
            if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in RESIDUAL_PROJECTIONS:
                mod.weight.mul_(math.sqrt(2 * L))


def _step(block: nn.Module, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
          s: VarianceSeries) -> torch.Tensor:
    y, _ = block(x, rope, ForwardContext())
    s.after.append(_variance(y))
    s.branch.append(_variance(y - x))
    return y


@torch.no_grad()
def residual_variance(target: str | Path, *, tokens: list[int] | None = None, batch: int = 1,
                      seq_len: int = 64, seed: int = 0, fresh: bool = True) -> VarianceReport:
    """Forward residual-stream variance of a preset's fresh init (scaled and unscaled) or of
    a checkpoint (its weights, plus — unless fresh=False — fresh inits of its config)."""
    gen = torch.Generator().manual_seed(seed)
    model = None
    if str(target) in PRESETS:
        c = get_preset(str(target))
    else:
        model, c = _load(Path(target))
    if tokens is not None:
        ids = torch.tensor([tokens], dtype=torch.long)
        if int(ids.max()) >= c.vocab_size or int(ids.min()) < 0:
            raise UnsupportedModelError(
                f"--tokens: ids must lie in 0..{c.vocab_size - 1} for {target}")
    else:
        ids = torch.randint(c.vocab_size, (batch, seq_len), generator=gen)
    B, T = ids.shape
    if T > c.max_seq_len:
        raise UnsupportedModelError(f"{T} tokens exceed max_seq_len {c.max_seq_len} of {target}")
    cos_t, sin_t = rope_table(c.hdim, c.max_seq_len, c.rope_theta, c.rope_scaling)
    pos = torch.arange(T).expand(B, T)
    rope = rope_factors(cos_t[pos], sin_t[pos])  # 2 x (B, T, 1, D)
    series: list[VarianceSeries] = []
    if model is not None:
        x = model.embed_tokens(ids).float()  # (B, T, C)
        s = VarianceSeries("checkpoint", _variance(x))
        for block in model.layers:
            x = _step(block, x, rope, s)
        series.append(s)
        del model
        if not fresh:
            return _report(target, c, (B, T), series)
    # Fresh init: token rows of N(0, init_std), one per distinct token (as an embedding).
    uniq, inv = torch.unique(ids, return_inverse=True)
    rows = torch.randn(uniq.numel(), c.dim, generator=gen) * c.init_std
    x0 = rows[inv]  # (B, T, C)
    x_unit = x0 / x0.double().std(unbiased=False).float()
    names = ["scaled", "unscaled", "unit/scaled", "unit/unscaled"]
    starts = [x0, x0, x_unit, x_unit]
    streams = [VarianceSeries(n, _variance(x)) for n, x in zip(names, starts)]
    xs = list(starts)
    for i in range(c.n_layers):
        block = _fresh_block(c, i, gen)
        xs[0] = _step(block, xs[0], rope, streams[0])
        xs[2] = _step(block, xs[2], rope, streams[2])
        _unscale(block, c.n_layers)
        xs[1] = _step(block, xs[1], rope, streams[1])
        xs[3] = _step(block, xs[3], rope, streams[3])
        del block
    return _report(target, c, (B, T), series + streams)


def _report(target, c: ModelConfig, bt: tuple[int, int],
            series: list[VarianceSeries]) -> VarianceReport:
    return VarianceReport(
        target=str(target), config=c, tokens=bt,
        closed_unscaled=block_variance(c, scaled=False),
        closed_scaled=block_variance(c, scaled=True),
        series=series, silu_exact=silu_second_moment_ratio(c.dim * c.init_std**2),
    )


def _load(path: Path):
    """(fp32 model, config) from an astrai checkpoint or a HF directory."""
    from astrai.model.hf import load_pretrained  # the model room's boundary loader

    if not path.exists():
        raise UnsupportedModelError(
            f"{path}: neither a preset ({', '.join(PRESETS)}) nor a checkpoint directory")
    model, config, _ = load_pretrained(path, dtype=torch.float32)
    return model, config


def variance_dict(r: VarianceReport) -> dict:
    """JSON form of a VarianceReport."""
    L = r.config.n_layers
    closed_u, closed_s = r.closed_final
    out = {
        "target": r.target, "n_layers": L, "dim": r.config.dim, "ffn_dim": r.config.ffn_dim,
        "tokens": list(r.tokens),
        "closed_form": {
            "unscaled": {**r.closed_unscaled.__dict__, "block": r.closed_unscaled.block,
                         "final": closed_u},
            "scaled": {**r.closed_scaled.__dict__, "block": r.closed_scaled.block,
                       "final": closed_s},
            "ratio": r.closed_unscaled.block / r.closed_scaled.block,
            "silu_factor_paper": PAPER_SILU_FACTOR, "silu_factor_exact": r.silu_exact,
        },
        "expected_ratio": 2 * L,
        "contribution_ratio": r.contribution_ratio(),
        "contribution_ratio_unit_input": r.contribution_ratio("unit/"),
        "series": [{"name": s.name, "entry_var": s.entry_var, "after": s.after,
                    "ratio": s.ratio, "branch": s.branch} for s in r.series],
    }
    return out
