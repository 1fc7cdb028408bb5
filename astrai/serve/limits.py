"""The per-request bounds of `astrai serve` (docs/serve.md#limits) and the capacity check.

Every bound caps work a single request can make the server do before it is refused: a
body of `--max-body-bytes` can otherwise name 300,000 stop strings (searched after every
token) or 5,000 prompts times n = 64 choices (each a SamplingParams and an engine
request). OpenAI's API allows 4 stop strings and one prompt list; vLLM bounds n by its
running set. A request over a bound is a 400 naming the field, checked before any work.
"""

from __future__ import annotations

from typing import Any

from astrai.infer.params import MAX_STOP, MAX_STOP_CHARS, MAX_TOP_LOGPROBS
from astrai.serve.errors import APIError, bad_request

__all__ = ["MAX_MESSAGES", "MAX_N", "MAX_PROMPTS", "MAX_STOP", "MAX_STOP_CHARS",
           "MAX_TOP_LOGPROBS", "check_capacity", "max_prompt_chars", "queue_full"]

MAX_N = 64
"""Choices per prompt (`n`)."""
MAX_PROMPTS = 64
"""Prompts in one /v1/completions request (a list of strings or of token-id lists)."""
MAX_MESSAGES = 1024
"""Chat messages in one request (each is rendered through the chat template)."""


def max_prompt_chars(tokenizer: Any, max_context: int) -> int | None:
    """The longest prompt text (in characters) that could fit the context: a token covers
    at most as many characters as its longest vocabulary entry has (a byte-level entry has
    one character per byte it covers), so a longer text needs more than `max_context`
    tokens. Refusing it before tokenizing costs nothing and refuses nothing that could be
    served; tokenizing 3.8 MB takes seconds. None when the vocabulary cannot be read."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return None
    longest = max((len(t) for t in backend.get_vocab()), default=0)
    return max_context * max(longest, 1)


def queue_full() -> APIError:
    return APIError(503, "the server is at capacity (max-running + max-queue requests in "
                    "flight); retry later", type="service_unavailable", code="queue_full",
                    headers={"Retry-After": "1"})


def check_capacity(choices: int, in_flight: int, bound: int) -> None:
    """Refuse a request of `choices` engine requests (prompts x n) before anything is built
    for it: 400 when it could never fit (more than --max-running + --max-queue), 503 when
    it does not fit now. The engine loop's own admission stays the authority (it counts
    atomically); this check only keeps a request that cannot run from costing work."""
    if choices > bound:
        raise bad_request(f"this request asks for {choices} choices (prompts x n); this "
                          f"server holds at most {bound} (--max-running + --max-queue)", "n")
    if in_flight + choices > bound:
        raise queue_full()
