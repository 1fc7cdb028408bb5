"""Batch sampling: gathers per-request settings into row tensors and applies the pure
functions of `sampling_math.py`, skipping every stage no request in the batch uses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from astrai.infer import sampling_math as S
from astrai.infer.request import Request
from astrai.infer.structured import ConstraintError, fill_bitmask, matcher_error


CANDIDATES = 1024
"""The largest logits a row's draw looks at where its masks (top-k, top-p) keep no more
(Sampler._draw_candidates); a top-p whose nucleus they do not hold draws from the whole row."""


@dataclass
class PenaltyState:
    """One request's running statistics for the penalties."""

    counts: torch.Tensor
    """[V] float: how often each token occurs in the output."""
    prompt_mask: torch.Tensor
    """[V] bool: the tokens of the prompt."""
    seen: int
    """Output tokens already counted."""


@dataclass
class Pick:
    """One request's draw."""

    token: int
    logprob: float | None = None
    """Raw-model log-probability of `token` (None when no request of the batch asked)."""
    top: dict[int, float] | None = None
    """The request's top_logprobs most likely ids -> log-probability (None: not asked)."""


class Sampler:
    """Draws the batch's tokens; keeps each penalised request's token counts by request id
    until `release` (the engine calls it when the request ends)."""

    def __init__(self, device: torch.device | str, seed: int = 0,
                 argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 one_thread: bool = False) -> None:
        self.device = torch.device(device)
        self.argmax = argmax or S.first_argmax
        """Plain greedy rows' pick: fp32 logits [B, V] -> [B] (S.first_argmax's contract;
        the CPU decode kernels' one-thread version where the engine has them)."""
        self.one_thread = one_thread
        """Draw with torch's ops on one thread (`drawing`): set where the engine's decode
        steps run on the CPU decode kernels' own thread pool."""
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._penalties: dict[str, PenaltyState] = {}
        self._mask_worker: ThreadPoolExecutor | None = None

    @contextmanager
    def drawing(self) -> Iterator[None]:
        """The span of a step's draws. With `one_thread`, torch's ops run in this thread: a
        draw's ops over [B, V] logits (sort, softmax, noise) open OpenMP regions from 32K
        elements, whose threads then spin on the cores the next decode step's pool wants
        (4 concurrent requests sampling at temperature 0.8, top-p 0.95, top-k 50, 125m
        int8, 2 cores of an AMD EPYC Zen 4: 1.28x the tokens per second)."""
        if not self.one_thread:
            yield
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def release(self, request_id: str) -> None:
        """Forget a finished request's state."""
        self._penalties.pop(request_id, None)

    def _penalty_state(self, req: Request, V: int) -> PenaltyState:
        st = self._penalties.get(req.id)
        if st is None:
            pm = torch.zeros(V, dtype=torch.bool, device=self.device)
            pm[torch.tensor(req.tokens[:req.prompt_len], device=self.device)] = True
            st = self._penalties[req.id] = PenaltyState(
                torch.zeros(V, dtype=torch.float32, device=self.device), pm, 0)
        out = req.tokens[req.prompt_len + st.seen:]
        if out:
            idx = torch.tensor(out, device=self.device)
            st.counts.index_add_(0, idx, torch.ones(len(out), device=self.device))
            st.seen += len(out)
        return st

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, reqs: list[Request],
               masks: Future | None = None) -> list[Pick]:
        """logits [B, V] fp32 for `reqs` (in order) -> one new token per request; `masks`
        from `start_masks(reqs, V)` (None: computed here when needed)."""
        _B, V = logits.shape
        ps = [r.params for r in reqs]
        if all(p.is_greedy and not (p.logprobs or p.top_logprobs or p.has_penalties)
               for p in ps) and all(r.constraint is None for r in reqs):
            pick = self.argmax if logits.dtype == torch.float32 else S.first_argmax
            return [Pick(t) for t in pick(logits).tolist()]  # plain greedy rows
        if any(r.constraint is not None for r in reqs):
            logits = self._constrain(logits, reqs, masks)
        raw = logits  # log-probabilities are the masked distribution's
        if any(p.has_penalties for p in ps):
            states = [self._penalty_state(r, V) for r in reqs]
            f32 = {"dtype": torch.float32, "device": self.device}
            logits = S.apply_penalties(
                logits, torch.stack([s.counts for s in states]),
                torch.stack([s.prompt_mask for s in states]),
                torch.tensor([p.repetition_penalty for p in ps], **f32),
                torch.tensor([p.frequency_penalty for p in ps], **f32),
                torch.tensor([p.presence_penalty for p in ps], **f32),
            )
        greedy = [p.is_greedy for p in ps]
        if all(greedy):
            tokens = S.first_argmax(logits)
        else:
            tokens = self._draw(logits, reqs, greedy)
        picks = [Pick(t) for t in tokens.tolist()]
        if any(p.logprobs or p.top_logprobs for p in ps):
            logp = raw.float().log_softmax(dim=-1)
            for pick, lp in zip(picks, logp.gather(1, tokens[:, None]).squeeze(1).tolist()):
                pick.logprob = lp
            n_top = min(max(p.top_logprobs for p in ps), V)
            if n_top:
                vals, ids = logp.topk(n_top, dim=-1)  # (B, n_top)
                for b, (pick, p) in enumerate(zip(picks, ps)):
                    if p.top_logprobs:
                        n = p.top_logprobs
                        pick.top = dict(zip(ids[b, :n].tolist(), vals[b, :n].tolist()))
        return picks

    def start_masks(self, reqs: list[Request], vocab_size: int) -> Future | None:
        """Begin computing the constrained requests' grammar masks in a worker thread (the
        engine calls it before the forward pass, which then hides their cost, as vLLM
        does); None when no request of the batch has a constraint."""
        cs = [r.constraint for r in reqs if r.constraint is not None]
        if not cs:
            return None
        if self._mask_worker is None:
            self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="astrai-grammar")
        return self._mask_worker.submit(fill_bitmask, cs, vocab_size)

    def _constrain(self, logits: torch.Tensor, reqs: list[Request],
                   masks: Future | None) -> torch.Tensor:
        """Tokens outside each constrained request's grammar set to -inf."""
        rows = [b for b, r in enumerate(reqs) if r.constraint is not None]
        bitmask = masks.result() if masks is not None else None
        if bitmask is None or bitmask.shape[0] != len(rows):  # masks of other rows: redo
            bitmask = fill_bitmask([reqs[b].constraint for b in rows], logits.shape[1])
        allowed = S.unpack_bitmask(bitmask.to(self.device, non_blocking=True), logits.shape[1])
        empty = (~allowed.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            c = reqs[rows[empty[0]]].constraint
            raise ConstraintError(f"the {c.kind} constraint allows no next token: "
                                  f"{matcher_error(c.matcher) or 'the grammar is exhausted'}")
        return S.apply_token_mask(logits, torch.tensor(rows, device=self.device), allowed)

    def warp(self, logits: torch.Tensor, ps: list) -> torch.Tensor:
        """Temperature, then the top-k, top-p and min-p masks of each row's params (`ps`,
        one per row) over penalised logits [B, V]; softmax of the result is what a row
        draws from."""
        return self.masks(self.tempered(logits, ps), ps)

    def tempered(self, logits: torch.Tensor, ps: list) -> torch.Tensor:
        """Logits [B, V] divided by each row's temperature."""
        t = torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=self.device)
        return S.apply_temperature(logits, t)

    def masks(self, x: torch.Tensor, ps: list) -> torch.Tensor:
        """The top-k, top-p and min-p masks of each row's params over tempered logits x."""
        f32 = {"dtype": torch.float32, "device": self.device}
        if any(p.top_k > 0 for p in ps):
            x = S.top_k_mask(x, torch.tensor([max(p.top_k, 0) for p in ps], device=self.device))
        if any(p.top_p < 1.0 for p in ps):
            x = S.top_p_mask(x, torch.tensor([p.top_p for p in ps], **f32))
        if any(p.min_p > 0.0 for p in ps):
            x = S.min_p_mask(x, torch.tensor([p.min_p for p in ps], **f32))
        return x

    def penalize_rows(self, logits: torch.Tensor, req: Request,
                      drafts: list[int]) -> torch.Tensor:
        """The penalties of `req` over its verify rows [k+1, V] (speculative decoding): row
        j comes after the output so far and the first j proposed tokens `drafts`, so their
        counts are added (astrai.infer.speculative)."""
        p = req.params
        if not p.has_penalties:
            return logits
        rows, V = logits.shape
        st = self._penalty_state(req, V)
        extra = torch.zeros(rows, V, dtype=torch.float32, device=self.device)
        if drafts:
            ids = torch.tensor(drafts[:rows - 1], dtype=torch.long, device=self.device)
            extra[1:].scatter_(1, ids[:, None], 1.0)
            extra = extra.cumsum(dim=0)
        f32 = {"dtype": torch.float32, "device": self.device}
        return S.apply_penalties(
            logits, st.counts[None] + extra, st.prompt_mask[None].expand(rows, V),
            torch.full((rows,), p.repetition_penalty, **f32),
            torch.full((rows,), p.frequency_penalty, **f32),
            torch.full((rows,), p.presence_penalty, **f32))

    def _draw(self, logits: torch.Tensor, reqs: list[Request], greedy: list[bool]) -> torch.Tensor:
        x = self.tempered(logits, [r.params for r in reqs])  # once, for either draw
        sampled = self._draw_candidates(x, reqs, greedy)
        if sampled is None:
            sampled = self._draw_whole_rows(x, reqs, greedy)
        if any(greedy):
            g = torch.tensor(greedy, device=self.device)
            sampled = torch.where(g, S.first_argmax(logits), sampled)
        return sampled

    def _draw_candidates(self, x: torch.Tensor, reqs: list[Request],
                         greedy: list[bool]) -> torch.Tensor | None:
        """The draw from tempered logits x [B, V] over each row's candidates (S.candidates:
        its CANDIDATES largest logits) where they hold what its masks keep, else None
        (_draw_whole_rows); greedy rows' picks are _draw's. Where every sampling row has a
        top-k or a top-p the distribution is the same: the masks and the
        exponential race over the candidates alone, instead of a sort and a noise value for
        each of the V tokens of every row. A seeded row's noise goes to its kept tokens in
        the order of their ids, one value each, so its draw does not depend on the batch."""
        ps = [r.params for r in reqs]
        f32 = {"dtype": torch.float32, "device": self.device}
        cand = S.candidates(
            x, torch.tensor([1 if g else p.top_k for p, g in zip(ps, greedy)], device=self.device),
            torch.tensor([1.0 if g else p.top_p for p, g in zip(ps, greedy)], **f32),
            torch.tensor([0.0 if g else p.min_p for p, g in zip(ps, greedy)], **f32),
            CANDIDATES)
        if cand is None:
            return None
        ids, w = cand
        probs = w.softmax(dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for b, (r, p) in enumerate(zip(reqs, ps)):
            if p.seed is not None and not greedy[b]:
                kept = (w[b] > S.NEG_INF).nonzero().flatten()
                kept = kept[ids[b, kept].argsort()]  # by token id
                seed = S.seed_for(p.seed, r.num_output)
                g = torch.Generator(device=self.device).manual_seed(seed)
                noise[b, kept] = torch.empty(len(kept), **f32).exponential_(generator=g)
        return ids.gather(1, S.exponential_race(probs, noise)[:, None]).squeeze(1)

    def _draw_whole_rows(self, x: torch.Tensor, reqs: list[Request],
                         greedy: list[bool]) -> torch.Tensor:
        """The draw from tempered logits x [B, V] over every token of each row: the masks,
        then the exponential race with a noise value per token (a seeded row's from its own
        generator)."""
        ps = [r.params for r in reqs]
        probs = self.masks(x, ps).softmax(dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for b, (r, p) in enumerate(zip(reqs, ps)):
            if p.seed is not None and not greedy[b]:
                g = torch.Generator(device=self.device).manual_seed(S.seed_for(p.seed, r.num_output))
                noise[b].exponential_(generator=g)
        return S.exponential_race(probs, noise)
