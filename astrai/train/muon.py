"""Muon on the hidden weight matrices, AdamW on everything else, as one optimizer.

Muon ("Muon: An optimizer for hidden layers in neural networks", Keller Jordan 2024) keeps
a Nesterov momentum of each 2-D weight's gradient and replaces the update by its nearest
semi-orthogonal matrix, approximated by five Newton-Schulz iterations:

    B <- lerp(B, g, 1 - mu)                 (momentum buffer)
    U <- lerp(g, B, mu)                     (Nesterov)
    O <- NewtonSchulz5(U)                   (~ U V^T of U's SVD, in bf16)
    W <- W * (1 - lr * wd) - lr * s(A, B) * O

`s` makes the update's RMS independent of the matrix shape [A, B]:
  original         sqrt(max(1, A / B))          (Jordan's; lr ~ 0.02)
  match_rms_adamw  0.2 * sqrt(max(A, B))        ("Muon is Scalable for LLM Training",
                                                 Moonshot AI 2025: the update's RMS is then
                                                 AdamW's typical 0.2, so AdamW's lr and
                                                 weight decay carry over unchanged)

This is torch.optim.Muon op for op (same Newton-Schulz coefficients, eps, bf16 iteration
and decay), tested against it; two things differ: the momentum buffer lives in
`state_dtype` (fp32 with bf16-true weights, as astrai.train.adamw keeps AdamW's moments),
and the update is computed in fp32 with only the final weight write rounded to the
parameter dtype (by astrai.train.bf16_update: nearest, stochastic or Kahan). Muon is for
hidden matrices only: embeddings, the output head, norms, biases, the MoE router and
reward heads take AdamW (as Jordan 2024 prescribes), in the same optimizer object so the LR schedule, checkpoints and resume treat it as one (its
state_dict is torch's layout, with a `muon` flag per group).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch

from astrai.train.adamw import AdamW

AdjustLR = Literal["match_rms_adamw", "original"]
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""Quintic Newton-Schulz coefficients of Jordan 2024 (torch.optim.Muon's defaults)."""
NS_STEPS = 5
NS_EPS = 1e-7

def newton_schulz(g: torch.Tensor, *, steps: int = NS_STEPS,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS) -> torch.Tensor:
    """g [A, B] -> ~ U V^T (singular values pushed into ~[0.7, 1.2]) in bf16, by `steps`
    quintic Newton-Schulz iterations X <- a X + (b X X^T + c (X X^T)^2) X on the wide
    orientation, after scaling to spectral norm <= 1 (Jordan 2024)."""
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T  # (B, A): iterate on the smaller Gram matrix
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, shape: torch.Size | tuple[int, ...], adjust: AdjustLR) -> float:
    """Muon's lr for a [A, B] matrix: lr * s(A, B) (module docstring)."""
    A, B = shape[:2]
    if adjust == "original":
        return lr * math.sqrt(max(1, A / B))
    if adjust == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(A, B))
    raise ValueError(f"muon_adjust_lr: unknown '{adjust}'; choose match_rms_adamw or original")


class MuonAdamW(AdamW):
    """Param groups with `muon: True` step with Muon (2-D parameters only), the others with
    AdamW (astrai.train.adamw, whose fp32 state and state-dtype-keeping resume it shares).
    Every group carries both option sets; defaults below."""

    def __init__(self, params: Iterable[dict[str, Any]], *, lr: float = 1e-3,
                 weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, momentum: float = 0.95, nesterov: bool = True,
                 adjust_lr: AdjustLR = "match_rms_adamw", ns_steps: int = NS_STEPS,
                 state_dtype: torch.dtype = torch.float32, bf16_update: str = "nearest",
                 rounding_seed: int = 0) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         state_dtype=state_dtype, bf16_update=bf16_update,
                         rounding_seed=rounding_seed, momentum=momentum, nesterov=nesterov,
                         adjust_lr=adjust_lr, ns_steps=ns_steps, muon=False)
        for group in self.param_groups:
            adjusted_lr(1.0, (1, 1), group["adjust_lr"])  # a bad name fails here
            bad = [tuple(p.shape) for p in group["params"] if group["muon"] and p.ndim != 2]
            if bad:
                raise ValueError(f"Muon trains 2-D matrices only; got shapes {bad}")

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        if not group["muon"]:
            super()._update(p, group)
            return
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, dtype=self.state_dtype,
                                                        memory_format=torch.preserve_format)
        buf, mu = state["momentum_buffer"], group["momentum"]
        lr, wd = float(group["lr"]), group["weight_decay"]
        g, b32 = p.grad.float(), buf.float()  # views when already fp32
        b32.lerp_(g, 1 - mu)
        update = g.lerp(b32, mu) if group["nesterov"] else b32
        ortho = newton_schulz(update, steps=group["ns_steps"])
        p32 = self.writer.read(p, state)
        p32.mul_(1 - lr * wd)
        p32.add_(ortho, alpha=-adjusted_lr(lr, p.shape, group["adjust_lr"]))
        self.writer.write(p, p32, state)  # nearest, stochastic or Kahan (--bf16-update)
        if buf.data_ptr() != b32.data_ptr():
            buf.copy_(b32)  # round to the stored dtype


def next_step(momentum: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
    """The step Muon would take next on a matrix from its saved momentum alone (the next
    gradient unknown, taken equal to the momentum, so Nesterov's blend is the momentum
    itself): adjusted lr x the orthogonalised momentum, before weight decay. What
    inspect-weights compares with half an ulp (astrai.inspect.next_update)."""
    ortho = newton_schulz(momentum.float(), steps=int(group.get("ns_steps", NS_STEPS)))
    return ortho.mul_(adjusted_lr(float(group["lr"]), momentum.shape,
                                  group.get("adjust_lr", "match_rms_adamw")))
