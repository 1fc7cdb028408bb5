"""Tiny models and preference / group batches for the dpo, grpo, reward and rollout tests."""

from __future__ import annotations

import torch

from astrai.model import build_model, get_preset

from .conftest import TINY, VOCAB, ListDataset

PAD = 0


def tiny_model(seed: int = 0, **kw) -> torch.nn.Module:
    return build_model(get_preset("tiny", **{"vocab_size": VOCAB, **TINY, **kw}), seed=seed)


def perturbed(model: torch.nn.Module, seed: int = 1, scale: float = 0.05) -> torch.nn.Module:
    """A copy of `model` with noise on every weight (a reference that differs)."""
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return other


def preference_samples(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Pairs sharing a prompt (mask 0) with responses of different lengths (mask 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        P = int(torch.randint(2, 6, (1,), generator=g))
        prompt = torch.randint(1, VOCAB, (P,), generator=g)
        sample = {}
        for key in ("chosen", "rejected"):
            R = int(torch.randint(1, 6, (1,), generator=g))
            resp = torch.randint(1, VOCAB, (R,), generator=g)
            sample[key] = torch.cat([prompt, resp])
            sample[f"{key}_mask"] = torch.cat([torch.zeros(P), torch.ones(R)]).long()
        out.append(sample)
    return out


def collate_pairs(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad chosen and rejected to one common length (the data room's dpo collate)."""
    T = max(max(len(s["chosen"]), len(s["rejected"])) for s in samples)
    out = {}
    for k in ("chosen", "rejected", "chosen_mask", "rejected_mask"):
        rows = torch.zeros(len(samples), T, dtype=torch.long)
        for b, s in enumerate(samples):
            rows[b, :len(s[k])] = s[k]
        out[k] = rows
    return out


def group_batch(B: int = 3, G: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """An offline grpo batch: left-padded prompts of different lengths, responses of
    different lengths, rewards with ties."""
    g = torch.Generator().manual_seed(seed)
    P, R = 6, 5
    prompts = torch.full((B, P), PAD)
    pmask = torch.zeros(B, P, dtype=torch.long)
    for b in range(B):
        n = int(torch.randint(2, P + 1, (1,), generator=g))
        prompts[b, P - n:] = torch.randint(1, VOCAB, (n,), generator=g)
        pmask[b, P - n:] = 1
    responses = torch.full((B, G, R), PAD)
    masks = torch.zeros(B, G, R, dtype=torch.long)
    for b in range(B):
        for i in range(G):
            n = int(torch.randint(1, R + 1, (1,), generator=g))
            responses[b, i, :n] = torch.randint(1, VOCAB, (n,), generator=g)
            masks[b, i, :n] = 1
    rewards = torch.randint(0, 3, (B, G), generator=g).float()
    return {"prompts": prompts, "prompt_mask": pmask, "responses": responses, "masks": masks,
            "rewards": rewards}


def dataset(samples) -> ListDataset:
    return ListDataset(samples)
