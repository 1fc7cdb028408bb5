"""The tokens a step's logits give: sampled rows, and speculative verify rows.

Failures stay with their request: a draw or a verify that raises becomes that request's
exception in the result (the engine finishes it with "error"), the others keep their picks.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from astrai.infer.request import Request
from astrai.infer.sampler import Pick, Sampler
from astrai.infer.scheduler import Chunk
from astrai.infer.speculative.speculator import Speculator


def sample_rows(sampler: Sampler, logits: torch.Tensor, reqs: list[Request],
                masks: Future | None = None) -> list[Pick | Exception]:
    """One pick per request (row b of `logits` is reqs[b]'s); where the batched draw fails,
    each request is drawn alone to find whose fails."""
    if not reqs:
        return []
    try:
        return list(sampler.sample(logits, reqs, masks))
    except Exception:  # noqa: BLE001 - find whose draw fails: each request alone
        picks: list[Pick | Exception] = []
        for b, req in enumerate(reqs):
            try:
                picks.extend(sampler.sample(logits[b:b + 1], [req]))
            except Exception as e:  # noqa: BLE001 - reported in that request's output
                picks.append(e)
        return picks


def pick_tokens(sampler: Sampler, speculator: Speculator | None, logits: torch.Tensor,
                chunks: list[Chunk], masks: Future | None) -> list[list[Pick] | Exception]:
    """Per sampling chunk its new tokens: one drawn, or (a chunk with proposals) the
    proposals kept and the token after them. The plain rows sample together (with the
    grammar masks begun before the forward: constrained rows never speculate, so they are
    all plain); each speculating chunk's 1 + k rows are verified."""
    with sampler.drawing():
        return _pick_tokens(sampler, speculator, logits, chunks, masks)


def _pick_tokens(sampler: Sampler, speculator: Speculator | None, logits: torch.Tensor,
                 chunks: list[Chunk], masks: Future | None) -> list[list[Pick] | Exception]:
    if not any(c.draft for c in chunks):
        picks = sample_rows(sampler, logits, [c.req for c in chunks], masks)
        return [[p] if isinstance(p, Pick) else p for p in picks]
    first, row = [], 0
    for c in chunks:
        first.append(row)
        row += 1 + len(c.draft)
    plain = [b for b, c in enumerate(chunks) if not c.draft]
    drawn = iter(sample_rows(sampler, logits[[first[b] for b in plain]],
                             [chunks[b].req for b in plain], masks) if plain else [])
    out: list[list[Pick] | Exception] = []
    for b, c in enumerate(chunks):
        if not c.draft:
            pick = next(drawn)
            out.append([pick] if isinstance(pick, Pick) else pick)
            continue
        try:
            out.append(speculator.verify(logits[first[b]:first[b] + 1 + len(c.draft)], c))
        except Exception as e:  # noqa: BLE001 - reported in that request's output
            out.append(e)
    return out
