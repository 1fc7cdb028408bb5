"""A request's life in the engine, and what the engine reports about it.

Timestamps are `time.perf_counter()` seconds, so serving metrics (TTFT, TPOT, ITL,
end-to-end latency) are differences of them.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from astrai.infer.cache.pool import KVHandle
from astrai.infer.params import SamplingParams
from astrai.infer.structured import Constraint
from astrai.infer.text_stream import TextStream


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """When things happened to one request (perf_counter seconds)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    """When each output token was produced (the first one is first_token_time)."""
    finished_time: float | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        """End-to-end latency."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies (gaps between consecutive output tokens)."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot(self) -> float | None:
        """Time per output token, excluding the first (vLLM's definition)."""
        t = self.token_times
        return None if len(t) < 2 else (t[-1] - t[0]) / (len(t) - 1)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens served from the prefix cache at admission."""


@dataclass
class RequestOutput:
    """One step's news about a request: a delta while streaming, the end when finished."""

    request_id: str
    delta_token_ids: list[int]
    delta_text: str
    token_ids: list[int]
    """All output tokens so far."""
    text: str
    """All output text so far (empty without a tokenizer)."""
    finished: bool
    finish_reason: str | None
    """"stop" (EOS, stop token or stop string), "length" (max_tokens or context), "abort",
    or "error" (serving this request failed; `error` says why, other requests go on)."""
    usage: Usage
    metrics: RequestMetrics
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the request."""
    delta_logprobs: list[float] | None = None
    """Raw-model log-probabilities of delta_token_ids (SamplingParams.logprobs)."""
    logprobs: list[float] | None = None
    """Log-probabilities of all output tokens so far."""
    delta_top_logprobs: list[dict[int, float]] | None = None
    """Per new token: the top_logprobs most likely ids -> log-probability."""
    prompt_truncated: bool = False
    """The prompt was cut to fit the context (prompt_overflow='truncate')."""
    index: int | None = None
    """Position of the prompt in `Engine.generate`'s list."""
    error: str | None = None
    """Why the request failed (finish_reason "error")."""


class Request:
    """Mutable state of one request; owned by the scheduler. Its end is written in one
    place, `finish` (status, reason, stop reason, error, finished time)."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                 arrival_time: float, stop_ids: frozenset[int] = frozenset(), *,
                 truncated: bool = False, text: TextStream | None = None,
                 index: int | None = None, constraint: Constraint | None = None) -> None:
        self.id = request_id
        self.params = params
        self.tokens: list[int] = list(prompt_ids)
        """Prompt followed by the output so far."""
        self.prompt_len = len(prompt_ids)
        self.stop_ids = stop_ids
        """Token ids that end the request with "stop"."""
        self.truncated = truncated
        """The prompt was cut to fit the context."""
        self.text = text
        """Incremental detokenizer and stop-string matcher (None without a tokenizer)."""
        self.constraint = constraint
        """The structured-output grammar the output must follow (None: free)."""
        self.index = index
        """Position of the prompt in `Engine.generate`'s list (None: add_request)."""
        self.status = Status.WAITING
        self.kv: KVHandle | None = None
        self.num_computed = 0
        """Leading tokens whose K/V are in the pool (the last sampled token never is)."""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        """Why serving this request failed (finish_reason "error")."""
        self.metrics = RequestMetrics(arrival_time)
        self.cached_tokens = 0
        self.admitted_once = False
        self.num_preemptions = 0
        self.passed_over = 0
        """Admission rounds in which a later request was admitted before this one."""
        self.logprobs: list[float] = []
        """Log-probabilities of the output tokens so far (when params ask for them)."""
        self.lora: Any = None
        """The LoRA adapter it runs under (astrai.infer.loras.Adapter), None = the base."""
        self.lora_slot: int | None = None
        """Its adapter's bank slot while it runs."""

    @property
    def cache_salt(self) -> str | None:
        """The prefix cache's key for its adapter: prefixes are shared only under it."""
        return None if self.lora is None else self.lora.key

    def finish(self, reason: str, now: float, stop_reason: int | str | None = None,
               error: str | None = None) -> None:
        """End the request: "stop" (with the stop token or string), "length", "abort" or
        "error" (with what went wrong). An error may still overwrite an end decided in the
        same step (its output could not be built); the finished time stays the first."""
        self.status = Status.FINISHED
        self.finish_reason, self.stop_reason, self.error = reason, stop_reason, error
        if self.metrics.finished_time is None:
            self.metrics.finished_time = now

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (f"Request({self.id!r}, {self.status.value}, prompt={self.prompt_len}, "
                f"out={self.num_output}, computed={self.num_computed})")
