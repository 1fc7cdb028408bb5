"""The engine's side of speculative decoding: proposals into a step, verification after it.

After the scheduler has chosen a step, every decode chunk that may speculate gets up to k
proposed tokens (`Chunk.draft`, pages reserved for them — never by preempting anyone: a
request the pool cannot extend just decodes one token). The step's one forward then feeds
each such request its last token and the proposals, a multi-token extend over the paged KV
like a prefill chunk, and keeps the logits of all 1 + k positions. `verify` turns those
rows into the tokens kept (`accept.py`), with the same penalties, temperature and masks as
the ordinary sampler (`Sampler.penalize_rows`, `Sampler.warp`). The engine appends them one
by one, checking every stop condition after each, then gives back the pages of what was
rejected (`Scheduler.trim`): the request's computed length counts kept tokens only, so the
radix cache never holds a rejected one.
"""

from __future__ import annotations

import torch

from astrai.infer import sampling_math as S
from astrai.infer.config import SpeculativeConfig
from astrai.infer.params import SamplingParams
from astrai.infer.request import Request
from astrai.infer.sampler import Pick, Sampler
from astrai.infer.scheduler import Chunk, StepBatch
from astrai.infer.speculative.accept import greedy_accept, rejection_accept
from astrai.infer.speculative.draft import DraftProposer
from astrai.infer.speculative.ngram import propose_ngram
from astrai.model.context import AttentionBackend

DRAFT_SALT = 0x5DEECE66D
"""Mixed into a seeded request's draft-model draws, so they differ from its verify draws."""


def refusal(params: SamplingParams) -> str | None:
    """Why a request never speculates, or None. The hook for constrained decoding: a row
    under a structured-output constraint masks each token by the grammar state the previous
    one leaves, which a proposal made without the mask would break; such a row decodes one
    token a step (vLLM's `structured_outputs`, earlier `guided_decoding`)."""
    for name in ("structured_outputs", "guided_decoding"):
        if getattr(params, name, None) is not None:
            return f"{name}: constrained rows decode one token per step"
    return None


class Speculator:
    def __init__(self, config: SpeculativeConfig, sampler: Sampler, max_context: int,
                 max_step_tokens: int, draft: DraftProposer | None = None) -> None:
        self.config, self.sampler, self.draft = config, sampler, draft
        self.max_context, self.max_step_tokens = max_context, max_step_tokens
        self.num_drafts = 0
        """Verify rows run (requests that had at least one proposal, per step)."""
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self._q: dict[str, list[torch.Tensor | None]] = {}

    def release(self, request_id: str) -> None:
        """A finished request: the draft model's sequence of it is freed."""
        if self.draft is not None:
            self.draft.release_one(request_id)

    def _room(self, c: Chunk) -> int:
        """Proposals the chunk may carry: k, no more than the request can still emit
        (max_tokens) or fit in the context, and none for constrained rows."""
        req = c.req
        if not (c.n == 1 and c.sample) or refusal(req.params) is not None:
            return 0
        left = req.params.max_tokens - req.num_output - 1
        return max(0, min(self.config.num_speculative_tokens, left,
                          self.max_context - len(req.tokens)))

    def propose(self, batch: StepBatch, scheduler_pool, backend: AttentionBackend,
                running: set[str]) -> None:
        """Fill `Chunk.draft` of the step's speculating chunks, within the step's token
        budget, with pages reserved for the proposals."""
        self._q = {}
        if self.draft is not None:
            self.draft.release(running)
        budget = self.max_step_tokens - batch.num_tokens
        items = []
        for c in batch.chunks:
            k = min(self._room(c), budget)
            if k > 0:
                items.append((c, k))
                budget -= k
        if not items:
            return
        if self.draft is None:
            cfg = self.config
            props = {c.req.id: (propose_ngram(c.req.tokens, k, cfg.prompt_lookup_max,
                                              cfg.prompt_lookup_min), None) for c, k in items}
        else:
            props = self.draft.propose([(c.req, k) for c, k in items], backend, self._draw)
        for c, _ in items:
            tokens, qs = props.get(c.req.id, ([], None))
            if tokens and scheduler_pool.reserve(c.req.kv, c.start + 1 + len(tokens)):
                c.draft = list(tokens)
                if qs is not None:
                    self._q[c.req.id] = qs

    def _draw(self, logits: torch.Tensor, reqs: list[Request], j: int
              ) -> tuple[list[int], list[torch.Tensor | None]]:
        """The draft model's proposals: greedy rows its argmax (q unused), sampled rows a
        draw from its distribution q (the target's temperature and masks, no penalties)."""
        ps = [r.params for r in reqs]
        tokens = logits.argmax(dim=-1).tolist()
        qs: list[torch.Tensor | None] = [None] * len(reqs)
        sampled = [b for b, p in enumerate(ps) if not p.is_greedy]
        if sampled:
            q = self.sampler.warp(logits[sampled], [ps[b] for b in sampled]).softmax(dim=-1)
            for i, b in enumerate(sampled):
                g = self._generator(reqs[b], j, DRAFT_SALT)
                noise = torch.empty_like(q[i]).exponential_(generator=g)
                tokens[b] = int((q[i] / noise).argmax())
                qs[b] = q[i]
        return tokens, qs

    def _generator(self, req: Request, j: int, salt: int = 0) -> torch.Generator:
        """Draw j of this step of `req`: a seeded request's own generator (seed, index),
        else the engine's."""
        p = req.params
        if p.seed is None:
            return self.sampler.generator
        g = torch.Generator(device=self.sampler.device)
        return g.manual_seed(S.seed_for(p.seed ^ salt, req.num_output + j))

    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, c: Chunk) -> list[Pick]:
        """logits [1 + k, V] of a chunk with k proposals -> the tokens kept (1 to k + 1)."""
        req, draft, p = c.req, c.draft, c.req.params
        x = self.sampler.penalize_rows(logits, req, draft)
        if p.is_greedy:
            tokens = greedy_accept(x.argmax(dim=-1).tolist(), draft)
        else:
            probs = self.sampler.warp(x, [p] * x.shape[0]).softmax(dim=-1)
            qs = self._q.get(req.id)
            q = torch.stack(qs) if qs is not None else None
            uniforms, noise = self._randomness(req, probs)
            tokens = rejection_accept(probs, q, draft, uniforms, noise)
        self.num_drafts += 1
        self.num_draft_tokens += len(draft)
        self.num_accepted_tokens += len(tokens) - 1
        return self._picks(logits, req, tokens)

    def _randomness(self, req: Request, probs: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """uniforms [k] and Exp(1) noise [k + 1, V]; a seeded request draws position j's
        from its generator (seed, output index), whatever else is batched."""
        rows, dev = probs.shape[0], probs.device
        if req.params.seed is None:
            g = self.sampler.generator
            return (torch.rand(rows - 1, generator=g, device=dev),
                    torch.empty_like(probs).exponential_(generator=g))
        u, noise = torch.empty(rows, device=dev), torch.empty_like(probs)
        for j in range(rows):
            g = self._generator(req, j)
            u[j] = torch.rand(1, generator=g, device=dev)[0]
            noise[j].exponential_(generator=g)
        return u[:rows - 1], noise

    def _picks(self, logits: torch.Tensor, req: Request, tokens: list[int]) -> list[Pick]:
        picks = [Pick(t) for t in tokens]
        p = req.params
        if p.logprobs or p.top_logprobs:
            logp = logits[:len(tokens)].float().log_softmax(dim=-1)
            ids = torch.tensor(tokens, device=logp.device)
            lps = logp.gather(1, ids[:, None]).squeeze(1).tolist()
            for j, pick in enumerate(picks):
                pick.logprob = lps[j]
                if p.top_logprobs:
                    vals, top = logp[j].topk(min(p.top_logprobs, logp.shape[-1]))
                    pick.top = dict(zip(top.tolist(), vals.tolist()))
        return picks

    def stats(self) -> tuple[int, int, int]:
        """(verify rows, proposed tokens, accepted tokens) so far."""
        return self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
