"""Engine-level counters for serving benchmarks and chat statistics."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def prefix_hit_rate(self) -> float:
        return self.pool.prefix_hit_rate

    @property
    def kv_utilization(self) -> float:
        return self.pool.utilization
