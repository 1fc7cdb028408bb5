"""Decoder-only transformer: embeddings → L pre-norm blocks → RMSNorm → LM head."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from astrai.model.block import DecoderBlock
from astrai.model.config import ModelConfig
from astrai.model.context import ForwardContext
from astrai.model.norm import RMSNorm, rms_norm
from astrai.model.rope import rope_factors, rope_table


class ModelOutput(NamedTuple):
    logits: torch.Tensor | None
    """[B, T, V] next-token logits (None when only hidden states were asked for)."""
    aux_loss: torch.Tensor | None
    """Mean MoE load-balancing loss over the MoE layers (unweighted), or None without MoE."""
    hidden: torch.Tensor | None = None
    """[B, T, dim] final normed hidden states when return_hidden=True."""


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(DecoderBlock(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = rope_table(config.hdim, config.max_seq_len, config.rope_theta, config.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_len, D/2) fp32
        self.register_buffer("rope_sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # Keep the RoPE tables fp32 and exact whatever dtype or device the model moves to
        # (model.to(bf16), FSDP's to_empty from meta): recompute them on the new device.
        super()._apply(fn, recurse)
        self.reset_rope(self.rope_cos.device)
        return self

    def reset_rope(self, device: torch.device | str) -> None:
        """(Re)build the fp32 RoPE tables on `device` (after meta-device construction)."""
        c = self.config
        self.rope_cos, self.rope_sin = rope_table(
            c.hdim, c.max_seq_len, c.rope_theta, c.rope_scaling, device=device
        )

    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext | None = None, *,
                return_hidden: bool = False, compute_logits: bool = True) -> ModelOutput:
        """input_ids [B, T] -> ModelOutput(logits [B, T, V], aux_loss, hidden).

        The one forward pass of training and inference alike: `ctx` carries the positions
        and who attends (the training mask, or the inference engine's KV-cache step record;
        the engine's ragged step arrives as B = 1, T = the step's tokens)."""
        ctx = ctx or ForwardContext()
        ctx.sliding_window = self.config.sliding_window
        B, T = input_ids.shape
        pos = ctx.positions
        if pos is None:
            pos = torch.arange(T, device=input_ids.device).expand(B, T)
        rope = rope_factors(self.rope_cos[pos], self.rope_sin[pos])  # 2 x (B, T, 1, D) fp32
        emb = self.embed_tokens
        # a module call where tensor parallelism hooked it (vocab-parallel: each rank looks up
        # its rows, then one all-reduce), else F.embedding on the weight (block.py: no module
        # call per leaf layer)
        hooked = emb._forward_pre_hooks or emb._forward_hooks
        x = emb(input_ids) if hooked else F.embedding(input_ids, emb.weight)  # (B, T, C)
        aux_total, n_moe = None, 0
        for block in self.layers:
            x, aux = block(x, rope, ctx)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
                n_moe += 1
        h = rms_norm(x, self.norm.weight, self.norm.eps, ctx.kernels)
        logits = None
        if compute_logits:
            logits = self.lm_head(h) if self.lm_head is not None else h @ self.embed_tokens.weight.T
        aux_loss = aux_total / n_moe if n_moe else None
        return ModelOutput(logits, aux_loss, h if return_hidden else None)
