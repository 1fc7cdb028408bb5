"""SamplingParams: how one request is decoded and when it stops.

Validated once, completely, when built (type, range and size of every field): a value the
engine could not serve is refused here with the field's name, never in the middle of a
step. The object is frozen; `dataclasses.replace(params, top_k=5)` builds (and checks) a
new one.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

from astrai.errors import ConfigError
from astrai.infer.structured import StructuredOutputs

GREEDY_BELOW = 1e-5
"""Temperatures below this decode greedily (vLLM's `_SAMPLING_EPS`): dividing a logit of
10 by a temperature near the float32 edge (1e-45 ... 1e-38) overflows to inf, the softmax
of a row of infs is NaN, and the draw then returns token 0 at every step; the limit of
softmax(x / t) as t -> 0 is the argmax anyway."""
MAX_TOP_LOGPROBS = 20
"""Most alternatives per token `top_logprobs` may ask for (OpenAI's limit)."""
INT32_MAX = 2**31 - 1
"""Bound of fields that become int32/int64 tensor entries (top_k, stop token ids)."""
SEED_RANGE = (-(2**63), 2**64 - 1)
"""What torch.Generator.manual_seed accepts."""
MAX_STOP = 16
"""Most stop strings (and most stop token ids) one request may give. OpenAI's API allows 4;
16 leaves room for chat formats with several end markers while keeping the per-token stop
check (one search per string over a bounded tail, docs/engine.md) small."""
MAX_STOP_CHARS = 256
"""Longest stop string, in characters: the text held back after each token is shorter."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings (OpenAI / vLLM names and semantics)."""

    max_tokens: int = 256
    """Most tokens to generate; the context length also stops a request ("length")."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy (argmax), as is any value below 1e-5 (GREEDY_BELOW)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 (or -1) = off."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with probability mass >= top_p."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one; 0 = off."""
    repetition_penalty: float = 1.0
    """CTRL penalty on prompt and output tokens: logit / p if positive else logit * p."""
    frequency_penalty: float = 0.0
    """Subtract penalty * count of each token in the output so far."""
    presence_penalty: float = 0.0
    """Subtract penalty from every token already in the output."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens whatever else is batched."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (may span tokens); the text ends before them. A single string is
    accepted."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end the request (kept in token_ids, not in text)."""
    ignore_eos: bool = False
    """Keep generating past the tokenizer's EOS / stop tokens (benchmarks)."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    logprobs: bool = False
    """Return each generated token's log-probability under the raw model distribution."""
    top_logprobs: int = 0
    """Also return the n most likely tokens and their log-probabilities per step."""
    structured_outputs: StructuredOutputs | None = None
    """Constrain the output to a JSON Schema, regex, choice or grammar (structured.py).
    With it, log-probabilities are those of the masked distribution: tokens outside the
    grammar have probability 0."""

    def __post_init__(self) -> None:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, list | tuple):
            raise _bad("stop", stop, "must be a string or a list of strings")
        if not isinstance(self.stop_token_ids, list | tuple):
            raise _bad("stop_token_ids", self.stop_token_ids, "must be a list of token ids")
        # own copies: the caller's lists may change later, this object may not
        object.__setattr__(self, "stop", list(stop))
        object.__setattr__(self, "stop_token_ids", list(self.stop_token_ids))
        _check(self)

    @classmethod
    def greedy(cls, max_tokens: int = 256, **kw: Any) -> SamplingParams:
        return cls(max_tokens=max_tokens, temperature=0.0, **kw)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)


def _bad(name: str, value: Any, why: str) -> ConfigError:
    # "sampling NAME=VALUE: why" -- callers (the HTTP server) read the field name from it;
    # reprlib keeps a long list or string to one short line
    return ConfigError(f"sampling {name}={reprlib.repr(value)}: {why}")


def _is_int(x: Any) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def _check(p: SamplingParams) -> None:
    """Every field's type and range; raises ConfigError naming the first bad one."""
    def real(name: str, ok: Callable[[float], bool], why: str) -> None:
        v = getattr(p, name)
        if not _is_real(v):
            raise _bad(name, v, "must be a finite number")
        if not ok(v):
            raise _bad(name, v, why)

    def integer(name: str, ok: Callable[[int], bool], why: str) -> None:
        v = getattr(p, name)
        if not _is_int(v) or not ok(v):
            raise _bad(name, v, why)

    integer("max_tokens", lambda v: v >= 1, "must be an integer >= 1")
    real("temperature", lambda v: v >= 0, "must be >= 0 (0 = greedy)")
    integer("top_k", lambda v: -1 <= v <= INT32_MAX,
            f"must be an integer in [-1, {INT32_MAX}] (0 or -1 = off)")
    real("top_p", lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")
    real("min_p", lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")
    real("repetition_penalty", lambda v: v > 0, "must be > 0 (1 = off)")
    for name in ("frequency_penalty", "presence_penalty"):
        real(name, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]")
    if p.seed is not None:
        lo, hi = SEED_RANGE
        integer("seed", lambda v: lo <= v <= hi,
                "must be None or an integer in [-2**63, 2**64 - 1]")
    _check_stops(p)
    for name in ("ignore_eos", "include_stop_str_in_output", "logprobs"):
        if not isinstance(getattr(p, name), bool):
            raise _bad(name, getattr(p, name), "must be true or false")
    integer("top_logprobs", lambda v: 0 <= v <= MAX_TOP_LOGPROBS,
            f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    so = p.structured_outputs
    if so is not None and not isinstance(so, StructuredOutputs):
        raise _bad("structured_outputs", so, "must be None or a StructuredOutputs")


def _check_stops(p: SamplingParams) -> None:
    """Stop strings and ids: their types, and the count and length bounds (MAX_STOP,
    MAX_STOP_CHARS) that keep the per-token stop check small."""
    if len(p.stop) > MAX_STOP:
        raise _bad("stop", p.stop, f"{len(p.stop)} stop strings; at most {MAX_STOP}")
    if not all(isinstance(s, str) and s for s in p.stop):
        raise _bad("stop", p.stop, "stop strings must be non-empty strings")
    if any(len(s) > MAX_STOP_CHARS for s in p.stop):
        raise _bad("stop", p.stop, f"a stop string is longer than {MAX_STOP_CHARS} characters")
    if len(p.stop_token_ids) > MAX_STOP:
        raise _bad("stop_token_ids", p.stop_token_ids,
                   f"{len(p.stop_token_ids)} stop token ids; at most {MAX_STOP}")
    if not all(_is_int(t) and 0 <= t <= INT32_MAX for t in p.stop_token_ids):
        raise _bad("stop_token_ids", p.stop_token_ids, f"must be token ids in [0, {INT32_MAX}]")
