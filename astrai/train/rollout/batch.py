"""A rollout: G responses per prompt with their engine log-probs and rewards.

`Rollout.to_batch` lays it out exactly like an offline grpo batch (prompts left-padded
[N, P] + prompt_mask, responses [N, G, R] + masks, rewards [N, G]), plus the engine's token
log-probs `gen_logps` [N, G, R], so the GRPO loss reads both alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Rollout:
    prompt_ids: list[list[int]]
    """N prompts as fed to the engine (rendered, ending with the generation prompt)."""
    group_size: int
    completion_ids: list[list[int]]
    """N*G generated token lists, prompt-major (prompt i owns rows i*G .. i*G+G-1); a
    response that stopped ends with its stop token (the model generated it)."""
    logprobs: list[list[float]]
    """N*G lists: each generated token's log-prob under the policy that sampled it."""
    texts: list[str] = field(default_factory=list)
    """N*G decoded completions (stop token and stop strings removed)."""
    finish_reasons: list[str] = field(default_factory=list)
    """N*G: "stop" or "length"."""
    rewards: torch.Tensor | None = None
    """[N, G] float32 scores (None before scoring)."""
    references: list[str] | None = None
    """N reference answers (the dataset's), when known."""

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    def metrics(self) -> dict[str, float]:
        n = max(1, len(self.completion_ids))
        return {
            "rollout_len": sum(len(c) for c in self.completion_ids) / n,
            "rollout_truncated": sum(r == "length" for r in self.finish_reasons) / n,
        }

    def to_batch(self, pad_id: int) -> dict[str, torch.Tensor]:
        N, G = self.num_prompts, self.group_size
        P = max(len(p) for p in self.prompt_ids)
        R = max(1, max(len(c) for c in self.completion_ids))
        prompts = torch.full((N, P), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((N, P), dtype=torch.long)
        for i, p in enumerate(self.prompt_ids):
            if p:  # left padding: every prompt ends where generation starts
                prompts[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
                prompt_mask[i, P - len(p):] = 1
        responses = torch.full((N * G, R), pad_id, dtype=torch.long)
        masks = torch.zeros((N * G, R), dtype=torch.long)
        gen_logps = torch.zeros((N * G, R), dtype=torch.float32)
        for j, (c, lp) in enumerate(zip(self.completion_ids, self.logprobs)):
            if c:
                responses[j, :len(c)] = torch.tensor(c, dtype=torch.long)
                masks[j, :len(c)] = 1
            if lp:
                gen_logps[j, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
        rewards = self.rewards if self.rewards is not None else torch.zeros(N, G)
        return {"prompts": prompts, "prompt_mask": prompt_mask,
                "responses": responses.view(N, G, R), "masks": masks.view(N, G, R),
                "gen_logps": gen_logps.view(N, G, R), "rewards": rewards.float()}

    def record(self) -> dict[str, Any]:
        """Per-completion record columns handed to reward functions (see rewards/base.py)."""
        G = self.group_size
        refs = self.references
        out: dict[str, Any] = {
            "prompt_ids": [self.prompt_ids[j // G] for j in range(len(self.completion_ids))],
            "completion_ids": self.completion_ids,
            "group": [j // G for j in range(len(self.completion_ids))],
            "finish_reason": self.finish_reasons,
        }
        if refs is not None:
            out["reference"] = [refs[j // G] for j in range(len(self.completion_ids))]
        return out
