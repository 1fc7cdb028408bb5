"""A reward model: the transformer with a scalar head on its final hidden states.

    score(x) = w · h_T(x) + b        h_T: final normed hidden state at the last scored token

(the Bradley–Terry reward model of Ouyang et al. 2022 / Stiennon et al. 2020). The module
keeps the Transformer's state-dict names and adds `score_head.weight` [1, dim] and
`score_head.bias` [1]; it has no LM head (a reward model predicts no tokens, and unused
parameters would stall DDP). `load_checkpoint` builds a RewardModel when a checkpoint holds
`score_head.weight`, so reward checkpoints save, resume and load like any other.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from astrai.model.config import ModelConfig
from astrai.model.context import ForwardContext
from astrai.model.transformer import ModelOutput, Transformer

SCORE_KEY = "score_head.weight"


class RewardOutput(NamedTuple):
    scores: torch.Tensor
    """[B] one scalar per row (fp32)."""
    aux_loss: torch.Tensor | None
    """Mean MoE load-balancing loss, or None without MoE."""


class RewardModel(Transformer):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.lm_head = None
        self.score_head = nn.Linear(config.dim, 1, bias=True)

    @classmethod
    def from_transformer(cls, model: Transformer, *, seed: int = 0) -> RewardModel:
        """A reward model sharing `model`'s weights (no copy), with a fresh head:
        w ~ N(0, 1/(dim+1)) so initial scores are O(1), b = 0."""
        if isinstance(model, RewardModel):
            return model
        cfg = model.config
        p = next(model.parameters())
        with torch.device("meta"):
            rm = cls(cfg)
        gen = torch.Generator().manual_seed(seed)
        w = torch.randn(1, cfg.dim, generator=gen) / (cfg.dim + 1) ** 0.5
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head.")}
        state["score_head.weight"] = w.to(device=p.device, dtype=p.dtype)
        state["score_head.bias"] = torch.zeros(1, device=p.device, dtype=p.dtype)
        rm.load_state_dict(state, assign=True)
        rm.reset_rope(p.device)
        return rm.train(model.training)

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext | None = None, *,
                last_index: torch.Tensor | None = None, return_hidden: bool = False,
                compute_logits: bool = True) -> ModelOutput | RewardOutput:
        """With `last_index` [B] (the position of each row's last scored token): the
        RewardOutput of input_ids [B, T]. Without it: the Transformer's forward (so tools
        that describe or profile a model keep working)."""
        if last_index is None:
            return super().forward(input_ids, ctx, return_hidden=return_hidden,
                                   compute_logits=compute_logits)
        out = super().forward(input_ids, ctx, return_hidden=True, compute_logits=False)
        B = input_ids.shape[0]
        h = out.hidden[torch.arange(B, device=input_ids.device), last_index]  # (B, C)
        scores = self.score_head(h).squeeze(-1).float()  # (B,)
        return RewardOutput(scores, out.aux_loss)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """mask [B, T] (1 on scored tokens) -> [B] index of each row's last 1 (0 if none)."""
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), pos, torch.zeros_like(pos)).amax(dim=1)
