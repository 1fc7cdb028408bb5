"""Request intake: a prompt and its SamplingParams become a checked `Request`.

Everything a caller can get wrong about one request is refused here, before the request
joins the queue, so that a step never meets it: a text prompt without a tokenizer, an
empty prompt, token ids outside the vocabulary, a prompt longer than the context (or cut
to its last tokens with prompt_overflow="truncate"), stop strings without a tokenizer.
The SamplingParams themselves were checked when they were built.
"""

from __future__ import annotations

import itertools
import logging
import operator
import time
from collections.abc import Sequence
from typing import Any

from astrai.errors import ConfigError, DataError
from astrai.infer.params import SamplingParams
from astrai.infer.request import Request
from astrai.infer.structured import GrammarCompiler
from astrai.infer.text_stream import TextStream

log = logging.getLogger("astrai.infer")
Prompt = str | Sequence[int]
"""Text (needs a tokenizer) or token ids."""


class Intake:
    def __init__(self, tokenizer: Any, vocab_size: int, max_context: int,
                 prompt_overflow: str = "error") -> None:
        """`tokenizer` is duck-typed: encode, stream_decoder, eos_id, stop_ids (None:
        token ids in, token ids out)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.prompt_overflow = prompt_overflow
        eos: frozenset[int] = frozenset()
        if tokenizer is not None:
            stops = getattr(tokenizer, "stop_ids", None)
            eos_id = getattr(tokenizer, "eos_id", None)
            eos = frozenset(stops or ()) | (frozenset() if eos_id is None else {eos_id})
        self.eos = eos
        """The tokenizer's end tokens: they stop every request unless ignore_eos."""
        self._ids = itertools.count()
        self.grammars = GrammarCompiler(tokenizer, vocab_size)
        """Compiles requests' structured-output constraints (once per distinct spec)."""

    def request(self, prompt: Prompt, params: SamplingParams | None = None,
                request_id: str | None = None, index: int | None = None,
                lora: Any = None) -> Request:
        """A new waiting Request (id `req-N` unless given) under the adapter `lora`
        (astrai.infer.loras.Adapter; None: the base); raises ConfigError / DataError naming
        what to fix."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"sampling params must be a SamplingParams, got "
                              f"{type(params).__name__}")
        ids, truncated = self.prompt_ids(prompt)
        if params.stop and self.tokenizer is None:
            raise ConfigError("sampling stop strings need a tokenizer; use stop_token_ids")
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos
                                                       else self.eos)
        text = None
        if self.tokenizer is not None:
            text = TextStream(self.tokenizer.stream_decoder(), params.stop,
                              params.include_stop_str_in_output)
        spec = params.structured_outputs
        constraint = None if spec is None else self.grammars.constraint(spec)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        req = Request(rid, ids, params, time.perf_counter(), stop_ids, truncated=truncated,
                      text=text, index=index, constraint=constraint)
        req.lora = lora
        return req

    def prompt_ids(self, prompt: Prompt) -> tuple[list[int], bool]:
        """(token ids within the vocabulary and the context, whether they were cut)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("a text prompt needs a tokenizer: pass token ids or give "
                                  "the engine a tokenizer")
            ids = list(self.tokenizer.encode(prompt))
        else:
            try:
                ids = [operator.index(t) for t in prompt]
            except TypeError:
                raise DataError("a prompt is text or a sequence of integer token ids, got "
                                f"{_describe(prompt)}") from None
        if not ids:
            raise DataError("the prompt is empty: give at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise DataError(f"prompt token id {bad[0]} is outside the vocabulary "
                            f"[0, {self.vocab_size})")
        if len(ids) < self.max_context:
            return ids, False
        if self.prompt_overflow == "error":
            raise DataError(
                f"the prompt has {len(ids)} tokens but the context holds "
                f"{self.max_context} (prompt + output): shorten it, raise max_context, "
                "or set prompt_overflow='truncate'")
        log.warning("prompt of %d tokens truncated to its last %d", len(ids),
                    self.max_context - 1)
        return ids[len(ids) - self.max_context + 1:], True


def _describe(prompt: Any) -> str:
    text = repr(prompt)
    return text if len(text) <= 60 else text[:57] + "..."
