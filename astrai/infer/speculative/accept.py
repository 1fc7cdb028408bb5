"""Which proposed tokens a step keeps: pure functions over the verify forward's rows.

The verify forward gives the target's distribution at each of the k proposed positions
and one past them (rows 0..k of one request). Greedy rows keep proposals while they equal
the target's argmax, then add the target's own next token: the tokens of plain greedy
decoding, exactly. Sampled rows follow the rejection rule of Leviathan et al. 2023 ("Fast
Inference from Transformers via Speculative Decoding") and Chen et al. 2023 ("Accelerating
Large Language Model Decoding with Speculative Sampling"): keep proposal x drawn from q
with probability min(1, p(x)/q(x)); on the first rejection draw from norm(max(0, p - q))
and stop; when all k are kept draw one more from p. Each emitted token is then distributed
as p. A proposal without a distribution (prompt lookup, a greedy draft) is a point mass
q = δ_x: keep x with probability p(x), else draw from p with x removed, renormalised.
"""

from __future__ import annotations

import torch


def greedy_accept(target: list[int], draft: list[int]) -> list[int]:
    """target: the argmax of rows 0..k; draft: the k proposals -> the tokens emitted (the
    accepted proposals, then the target's token after them)."""
    out: list[int] = []
    for j, d in enumerate(draft):
        if target[j] != d:
            break
        out.append(d)
    out.append(target[len(out)])
    return out


def rejection_accept(p: torch.Tensor, q: torch.Tensor | None, draft: list[int],
                     uniforms: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """p [k+1, V]: the target's (processed) probabilities; q [k, V] the proposal's, or None
    for point masses at `draft`; uniforms [k] in [0, 1); noise [k+1, V] Exp(1) for the
    draws (`sampling_math.exponential_race`) -> the tokens emitted (1 to k + 1)."""
    k = len(draft)
    idx = torch.tensor(draft, dtype=torch.long, device=p.device)
    rows = torch.arange(k, device=p.device)
    p_x = p[rows, idx]
    q_x = q[rows, idx] if q is not None else torch.ones_like(p_x)
    keep = (uniforms.to(p.dtype) * q_x < p_x).tolist()  # u < p/q
    out: list[int] = []
    for j, d in enumerate(draft):
        if not keep[j]:
            return out + [_draw(residual(p[j], None if q is None else q[j], d), noise[j])]
        out.append(d)
    return out + [_draw(p[k], noise[k])]


def residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """norm(max(0, p - q)) up to its scale (a draw needs no normalising); q None: the point
    mass at x, i.e. p with x removed. Falls back to p when nothing is left (p <= q
    everywhere happens only when p = q, where a rejection has probability 0)."""
    if q is None:
        r = p.clone()
        r[x] = 0
    else:
        r = (p - q).clamp(min=0)
    return r if bool(r.sum() > 0) else p


def _draw(probs: torch.Tensor, noise: torch.Tensor) -> int:
    return int((probs / noise).argmax())  # the exponential race: Categorical(probs)
