"""Continuous batching (Orca; vLLM v1 style), pure Python over the PagePool.

Each step gets a token budget. Running requests come first, in admission order: a decode
takes one token, an unfinished prefill takes a chunk of what budget is left (chunked
prefill). Then waiting requests are admitted first-come first-served while rows, budget
and pages (above a watermark) allow; their prompts skip the prefix the radix cache holds.
Prefill chunks and decodes share one ragged step.

When a running request needs a page and the pool has none (after evicting cache-only
pages), the most recently admitted request is preempted: its KV is released (complete
pages stay in the radix cache, so the replay is cheap) and it goes back to the front of the
queue to be recomputed from prompt + output so far — never an out-of-memory crash.

With LoRA adapters (`loras`, astrai.infer.loras), a request joins the batch only when its
adapter has a slot or one is free; the others are passed over until a running request for
another adapter finishes and frees one. Its prefix is looked up under its adapter's key.
A request whose adapter cannot be put in a slot (the bank's write failed) is not admitted:
it is set aside in `rejected` for the engine to fail alone, and the others go on.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from astrai.infer.cache.pool import PagePool
from astrai.infer.config import SchedulerConfig
from astrai.infer.request import Request, Status

LOOKAHEAD = 128
"""Waiting requests considered for admission in one step."""
AGE_LIMIT = 8
"""Admission rounds a request may be passed over before it goes first."""


@dataclass
class Chunk:
    """One request's share of a step: tokens[start:start + n] are fed."""

    req: Request
    start: int
    n: int
    sample: bool
    """The chunk reaches the end of the request's tokens: a new token is sampled."""
    draft: list[int] = field(default_factory=list)
    """Proposed tokens fed after the decode token (speculative decoding): every one of
    them is sampled too, and the verification keeps a prefix (astrai.infer.speculative)."""

    @property
    def num_fed(self) -> int:
        return self.n + len(self.draft)


@dataclass
class StepBatch:
    chunks: list[Chunk]

    @property
    def num_tokens(self) -> int:
        return sum(c.num_fed for c in self.chunks)

    @property
    def is_decode(self) -> bool:
        return all(c.num_fed == 1 for c in self.chunks)

    @cached_property
    def sampled(self) -> list[Request]:
        """The requests that get a new token this step, in chunk order."""
        return [c.req for c in self.chunks if c.sample]


class Scheduler:
    def __init__(self, pool: PagePool, config: SchedulerConfig, max_context: int,
                 loras: Any = None) -> None:
        """`loras`: the engine's LoraSet (can_admit / acquire / release), or None."""
        self.pool = pool
        self.loras = loras
        self.config = config
        self.max_context = max_context
        self.max_running = min(config.max_running or pool.config.max_requests,
                               pool.config.max_requests)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.peak_running = 0
        self.rejected: list[tuple[Request, Exception]] = []
        """Requests refused at admission and why (still waiting: the engine fails them)."""

    # -- queue verbs -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, req: Request, now: float) -> bool:
        """Drop a waiting or running request, freeing its KV; False if already finished."""
        if req.finished:
            return False
        self.finish(req, "abort", now)
        return True

    def finish(self, req: Request, reason: str, now: float,
               stop_reason: int | str | None = None, error: str | None = None) -> None:
        """Take `req` off the queues, give its pages back (complete ones stay in the radix
        cache), and end it (`Request.finish`)."""
        self._unlist(req)
        if req.kv is not None:
            self.pool.close(req.kv, req.tokens[:req.num_computed])
            req.kv = None
        if self.loras is not None:
            self.loras.release(req)
        req.finish(reason, now, stop_reason, error)

    def _unlist(self, req: Request) -> None:
        """Take `req` off the queue that holds it: the one its status names, else the other
        (a failed step may end a request in either), else none (finished already)."""
        queues = ((self.running, self.waiting) if req.status is Status.RUNNING
                  else (self.waiting, self.running))
        for q in queues:
            with contextlib.suppress(ValueError):  # by identity: Request has no __eq__
                q.remove(req)
                return

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.close(req.kv, req.tokens[:req.num_computed])
        req.kv, req.num_computed = None, 0
        if self.loras is not None:
            self.loras.release(req)
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- one step --------------------------------------------------------------------------
    def schedule(self) -> StepBatch | None:
        budget = self.config.max_step_tokens
        chunks: list[Chunk] = []
        preempted = False
        i = 0
        while i < len(self.running):
            req = self.running[i]
            left = len(req.tokens) - req.num_computed
            n = 1 if left == 1 else min(left, budget)  # decodes always run
            if n <= 0:
                i += 1
                continue
            while not self.pool.reserve(req.kv, req.num_computed + n):
                victim = self.running[-1]  # the newest admitted: vLLM's recompute policy
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                chunks.append(Chunk(req, req.num_computed, n, n == left))
                budget -= n
                i += 1
        if not preempted:
            budget = self._admit(chunks, budget)
        self.peak_running = max(self.peak_running, len(self.running))
        return StepBatch(chunks) if chunks else None

    def _candidates(self) -> list[Request]:
        """Admission order. FCFS; with the radix cache, the longest cached prefix first
        (SGLang's LPM policy: a hit is a short prefill, so waiting time and TTFT fall),
        except that a request passed over AGE_LIMIT times goes first (no starvation)."""
        window = list(itertools.islice(self.waiting, LOOKAHEAD))
        radix = self.pool.radix
        if radix is None or len(window) < 2:
            return window

        def key(item: tuple[int, Request]) -> tuple[bool, int, int]:
            j, r = item
            hit = len(radix.match(r.tokens[:len(r.tokens) - 1], touch=False,
                                  salt=r.cache_salt))
            return (r.passed_over < AGE_LIMIT, -hit, j)

        return [r for _, r in sorted(enumerate(window), key=key)]

    def _admit(self, chunks: list[Chunk], budget: int) -> int:
        admitted: list[Request] = []
        try:
            for req in self._candidates():
                if budget <= 0 or len(self.running) >= self.max_running:
                    break
                if self.loras is not None and not self.loras.can_admit(req.lora):
                    continue  # every slot holds another adapter in use: wait for one
                n = self._admit_one(req, budget, admitted)
                if n is None:
                    break
                if n:
                    chunks.append(Chunk(req, req.num_computed, n,
                                        req.num_computed + n == len(req.tokens)))
                    budget -= n
        finally:  # the queue stays whole whatever failed: each request in one list
            if admitted:
                self._requeue(admitted)
        return budget

    def _admit_one(self, req: Request, budget: int, admitted: list[Request]) -> int | None:
        """Admit `req` with its first chunk of at most `budget` tokens: the chunk's size;
        0 when it waits (or was set aside in `rejected`) while others may still come in,
        None when nothing more fits this step."""
        pool = self.pool
        handle = pool.open(req.tokens, count_hits=False, salt=req.cache_salt)
        if handle is None:
            return None
        start = handle.cached_len
        if self._defer(req, start, admitted):
            pool.close(handle)
            return 0
        n = min(len(req.tokens) - start, budget)
        need = pool.pages_for(start + n) - len(handle.pages)
        floor = int(self.config.watermark * pool.num_pages) if self.running else 0
        if pool.available_pages() - need < floor or not pool.reserve(handle, start + n):
            pool.close(handle)
            return None
        if self.loras is not None:
            try:
                self.loras.acquire(req)
            except Exception as e:  # noqa: BLE001 - this request's adapter alone failed
                pool.close(handle)
                self.rejected.append((req, e))
                return 0
        if not req.admitted_once:  # hit rate over first admissions (not replays)
            req.admitted_once, req.cached_tokens = True, start
            pool.prefix_query_tokens += req.prompt_len
            pool.prefix_hit_tokens += start
        req.kv, req.num_computed, req.status = handle, start, Status.RUNNING
        self.running.append(req)
        admitted.append(req)
        return n

    def _requeue(self, admitted: list[Request]) -> None:
        """The waiting queue without the requests just admitted; those they passed count it."""
        ids = {id(r) for r in admitted}
        last = max(j for j, r in enumerate(self.waiting) if id(r) in ids)
        waiting: deque[Request] = deque()
        for j, r in enumerate(self.waiting):
            if r.status is Status.WAITING:
                r.passed_over += j < last  # someone behind it went first
                waiting.append(r)
        self.waiting = waiting

    def _defer(self, req: Request, start: int, admitted: list[Request]) -> bool:
        """In-batch prefix sharing: a request whose next page is being computed by a request
        admitted this very step waits one step, then finds that page in the radix cache."""
        if self.pool.radix is None or not admitted:
            return False
        end = start + self.pool.page_size
        if len(req.tokens) <= end:
            return False
        head = req.tokens[:end]
        return any(a.num_computed <= start and len(a.tokens) > end and a.tokens[:end] == head
                   and a.cache_salt == req.cache_salt for a in admitted)

    def postprocess(self, batch: StepBatch, tokens: list[int], now: float) -> None:
        """Advance every chunk and append the sampled `tokens` (one per sampling chunk, in
        order). Whether a request ends with its new token the engine decides (stop token,
        stop string, max_tokens, context length) before it calls `finish`."""
        it = iter(tokens)
        for c in batch.chunks:
            req = c.req
            tok = next(it) if c.sample else None
            if req.status is not Status.RUNNING:  # finished during the step
                continue
            req.num_computed = c.start + c.n
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = now
            if not c.sample:
                self.pool.cache(req.kv, req.tokens[:req.num_computed])  # chunk done: share it
                continue
            if c.n > 1:
                self.pool.cache(req.kv, req.tokens[:req.num_computed])
            self._append(req, tok, now)

    def advance(self, req: Request, token: int, now: float) -> None:
        """One more accepted token of a speculating request: the token before it (a kept
        proposal) has its K/V written by the verify step."""
        req.num_computed += 1
        self._append(req, token, now)

    def trim(self, req: Request) -> None:
        """After a verify step: give back the pages past what the request's tokens need,
        holding rejected proposals' K/V (never cached: they lie past num_computed)."""
        if req.status is Status.RUNNING and req.kv is not None:
            self.pool.trim(req.kv, len(req.tokens))

    @staticmethod
    def _append(req: Request, token: int, now: float) -> None:
        req.tokens.append(token)
        m = req.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.token_times.append(now)
