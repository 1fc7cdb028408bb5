"""Token losses as pure functions (docs/train.md: pretraining and SFT).

They return *sums* over the tokens that carry loss plus the count of those tokens, so the
caller can normalise over a whole accumulation window (accumulation == one big batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def masked_targets(target_ids: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """target_ids [B, T] with IGNORE_INDEX wherever loss_mask [B, T] (aligned with the
    targets) is 0."""
    if loss_mask is None:
        return target_ids
    return target_ids.masked_fill(loss_mask == 0, IGNORE_INDEX)


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor,
                      label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V], targets [B, T] (IGNORE_INDEX = no loss) ->
    (sum over loss tokens of the (label-smoothed) cross-entropy, number of loss tokens as
    an int64 tensor on the targets' device: counted, never read on the host).

    With smoothing eps the per-token loss is (1 - eps) * nll + eps * mean_v(-log p_v)
    (Szegedy et al. 2016), computed in fp32 whatever the logits dtype. The sum is taken in
    fp64 (a cheap cast of B*T values): the logged loss then does not depend on how a window
    is split into micro-batches, and the gradient is unchanged (d sum / d token = 1).
    """
    V = logits.shape[-1]
    flat_t = targets.reshape(-1)  # (B*T,)
    per_token = F.cross_entropy(
        logits.reshape(-1, V).float(), flat_t,
        ignore_index=IGNORE_INDEX, reduction="none", label_smoothing=label_smoothing,
    )  # (B*T,), 0 where ignored
    return per_token.double().sum(), (flat_t != IGNORE_INDEX).sum()


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood [B, T] in fp32 (0 where targets are ignored)."""
    B, T, V = logits.shape
    nll = F.cross_entropy(
        logits.reshape(-1, V).float(), targets.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="none",
    )
    return nll.view(B, T)
