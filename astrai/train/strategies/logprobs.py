"""Teacher-forced token log-probabilities, and sequence layouts shared by dpo / grpo / reward.

Convention (the data room's dpo/grpo masks): mask[t] = 1 when token t is a response token
whose log-probability counts. Token t is predicted by the logits at t - 1, so the per-token
log-probs of a [B, T] row are a [B, T-1] tensor aligned with tokens 1..T-1 (mask[:, 1:]).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from astrai.train.executors import unwrap


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V], ids [B, T] -> log p(ids[:, t] | ids[:, :t]) for t >= 1, [B, T-1]
    in fp32 (cross_entropy never materialises a second [B, T, V] tensor)."""
    B, T, V = logits.shape
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), ids[:, 1:].reshape(-1),
                          reduction="none")
    return -nll.view(B, T - 1)


def policy_logprobs(model: nn.Module, ids: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token log-probs [B, T-1], MoE aux loss or None) of ids [B, T] under `model`."""
    out = model(ids)
    return token_logprobs(out.logits, ids), out.aux_loss


def sequence_logprob(token_lp: torch.Tensor, mask: torch.Tensor,
                     reduction: str = "sum") -> torch.Tensor:
    """token_lp [B, T-1], mask [B, T] -> [B]: the sum (or mean) over response tokens."""
    m = mask[:, 1:].to(token_lp.dtype)
    total = (token_lp * m).sum(dim=1)
    if reduction == "mean":
        return total / m.sum(dim=1).clamp(min=1)
    return total


def join_prompt_response(prompts: torch.Tensor, prompt_mask: torch.Tensor,
                         responses: torch.Tensor, response_mask: torch.Tensor,
                         pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts [N, P] (prompt_mask 1 on real tokens) + right-padded responses
    [N, R] (response_mask 1 on scored tokens) -> (ids [N, P+R], mask [N, P+R]): each row is
    its prompt followed directly by its response, right-padded with pad_id, so positions
    start at 0 and plain causal attention applies. mask is 1 on the scored response tokens.
    """
    P = prompts.shape[1]
    R = responses.shape[1]
    ids = torch.cat([prompts, responses], dim=1)  # (N, P+R)
    scored = torch.cat([torch.zeros_like(prompt_mask), response_mask], dim=1)
    shift = P - prompt_mask.sum(dim=1, keepdim=True)  # (N, 1) left pads per row
    src = torch.arange(P + R, device=ids.device)[None, :] + shift  # (N, P+R)
    inside = src < P + R
    src = src.clamp(max=P + R - 1)
    ids = torch.where(inside, ids.gather(1, src), torch.full_like(ids, pad_id))
    mask = torch.where(inside, scored.gather(1, src), torch.zeros_like(scored))
    return ids, mask


def trim_right(*tensors: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Cut [N, T] tensors after the last column where any row of `mask` is 1 (padding only
    beyond it), so no compute is spent on all-padding columns."""
    cols = mask.any(dim=0).nonzero()
    T = int(cols.max()) + 1 if len(cols) else 1
    return tuple(t[:, :T] for t in tensors)


def frozen_copy(model: nn.Module) -> nn.Module:
    """An eval-mode, gradient-free deep copy (a reference or old policy)."""
    ref = copy.deepcopy(unwrap(model))
    ref.eval().requires_grad_(False)
    return ref


def zero_loss(model: nn.Module) -> torch.Tensor:
    """A zero scalar connected to every parameter (a micro-batch with nothing to learn
    still gives every parameter a gradient, as DDP's reducer expects)."""
    return sum(p.reshape(-1)[0] * 0.0 for p in model.parameters() if p.requires_grad)
