"""Engine-level counters for serving benchmarks and chat statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astrai.infer.cache.pool import PoolStats


@dataclass
class StepInfo:
    """One engine step, handed to `Engine.on_step` when set."""

    start: float
    """perf_counter() when the step began."""
    duration: float
    """Seconds spent in the step (schedule + forward + sample + postprocess)."""
    num_requests: int
    num_tokens: int
    """Query tokens fed (prefill chunks + decodes)."""
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_steps: int
    prefill_tokens: int
    """Tokens fed in prefill chunks (replays after preemption included)."""
    decode_tokens: int
    """Tokens fed as single-token decodes."""
    generated_tokens: int
    num_preemptions: int
    peak_running: int
    backend: str
    pool: PoolStats
    decode: str = "eager"
    """How decode steps run: native | graphs | static | eager (astrai.infer.native_step,
    astrai.infer.decode_step)."""
    speculative: str | None = None
    """Speculative decoding's method (ngram | draft), or None."""
    spec_drafts: int = 0
    """Verify rows run: a request's proposals checked in one step."""
    spec_draft_tokens: int = 0
    """Tokens proposed and verified."""
    spec_accepted_tokens: int = 0
    """Of those, tokens kept (the token each verify adds after them not counted)."""

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted over proposed tokens (0 before any proposal)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.pool.prefix_hit_rate


@dataclass
class StepCounters:
    """Running totals over an engine's steps (the counters of `EngineStats`)."""

    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    generated_tokens: int = 0

    def count(self, num_tokens: int, num_decode: int, num_sampled: int) -> None:
        """One step fed `num_tokens` (of them `num_decode` single-token decodes) and
        sampled `num_sampled` new tokens."""
        self.steps += 1
        self.decode_tokens += num_decode
        self.prefill_tokens += num_tokens - num_decode
        self.generated_tokens += num_sampled


def engine_stats(engine: Any) -> EngineStats:
    """`engine`'s counters, pool, decode path and speculation now (Engine.stats, which
    holds the engine's lock around it)."""
    c, s = engine.counters, engine.scheduler
    b = engine._backend_choice
    name = b if isinstance(b, str) else getattr(b, "name", None) or "auto"
    sp = engine.speculator
    spec = (None, 0, 0, 0) if sp is None else (sp.config.method, *sp.stats())
    return EngineStats(len(s.running), len(s.waiting), c.steps, c.prefill_tokens,
                       c.decode_tokens, c.generated_tokens, s.num_preemptions,
                       s.peak_running, name, engine.pool.stats(), engine.decode_path.name,
                       *spec)


def count_step(engine: Any, batch: Any, outs: list, t0: float, now: float) -> None:
    """Add a finished step (its StepBatch and output deltas, begun at `t0`) to `engine`'s
    counters, and tell its `on_step` listener."""
    dec = sum(c.num_fed for c in batch.chunks if c.n == 1)
    engine.counters.count(batch.num_tokens, dec, sum(len(o.delta_token_ids) for o in outs))
    if engine.on_step is not None:
        s = engine.scheduler
        engine.on_step(StepInfo(t0, now - t0, len(batch.chunks), batch.num_tokens,
                                batch.num_tokens - dec, dec, len(s.running), len(s.waiting)))
