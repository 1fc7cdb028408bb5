"""One streamed chat reply and its timing (astrai.infer.chat_session holds the conversation)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class ReplyStats:
    """Timing of one reply (seconds), for /stats."""

    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens whose KV came from the prefix cache (earlier turns)."""
    output_tokens: int
    ttft: float | None
    duration: float | None
    """First token to last token."""
    finish_reason: str | None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first, per second of decoding."""
        if self.output_tokens < 2 or not self.duration:
            return None
        return (self.output_tokens - 1) / self.duration

    def describe(self) -> str:
        ttft = "-" if self.ttft is None else f"{self.ttft * 1000:.1f} ms"
        tps = self.decode_tokens_per_s
        rate = "-" if tps is None else f"{tps:.1f} tokens/s"
        return (f"last reply: {self.output_tokens} tokens, {rate}, TTFT {ttft}; prompt "
                f"{self.prompt_tokens} tokens ({self.cached_tokens} from the prefix cache); "
                f"finish: {self.finish_reason}")


def speculation_line(engine: Any) -> str:
    """"; speculative (ngram): A of P proposed tokens accepted (R%)" since the engine
    started, or "" without speculative decoding."""
    stats = engine.stats()
    method = getattr(stats, "speculative", None)
    if method is None:
        return ""
    return (f"; speculative ({method}): {stats.spec_accepted_tokens} of "
            f"{stats.spec_draft_tokens} proposed tokens accepted "
            f"({100 * stats.spec_acceptance_rate:.1f}%)")


class Thinking(str):
    """A delta of the model's thinking (astrai.infer.reasoning), not of its answer."""


class Reply:
    """One streamed reply: iterate for text deltas ("" for tokens that add no text yet); a
    thinking model's thinking comes as `Thinking` deltas (a str), its answer as plain ones.

    Finishing (or `cancel()`) adds the reply's answer, partial or not, to the session
    history."""

    def __init__(self, session: Any, stream: Iterator[Any], user: str,
                 prompt_tokens: int, notice: str | None, splitter: Any = None) -> None:
        self.session = session
        self._stream = stream
        self.user = user
        self.prompt_tokens = prompt_tokens
        self.notice = notice
        """Set when old turns were dropped to fit the context."""
        self.text = ""
        """The answer (without the thinking)."""
        self.thinking = ""
        self.finish_reason: str | None = None
        self.error: str | None = None
        """Why generating the reply failed (finish_reason "error")."""
        self._split = splitter
        self._last: Any = None
        self._done = False

    def __iter__(self) -> Iterator[str]:
        for out in self._stream:
            self._last = out
            if out.finished:
                self.finish_reason, self.error = out.finish_reason, out.error
            yield from self._deltas(out.delta_text, out.finished)
            if self._done:
                return
        self._finish()

    def _deltas(self, text: str, last: bool) -> Iterator[str]:
        if self._split is None:
            self.text += text
            yield text
            return
        thought, said = self._split.take(text, last)
        self.thinking += thought
        self.text += said
        if thought:
            yield Thinking(thought)
        yield said

    def cancel(self) -> None:
        """Stop generating now (the engine frees the request); keeps what was said so far."""
        self._stream.close()  # Engine.generate's stream aborts unfinished requests on close
        if self.finish_reason is None:
            self.finish_reason = "abort"
        self._finish()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self.session._record(self)

    def stats(self) -> ReplyStats:
        out = self._last
        if out is None:
            return ReplyStats(self.prompt_tokens, 0, 0, None, None, self.finish_reason)
        m = out.metrics
        times = m.token_times
        return ReplyStats(self.prompt_tokens, out.usage.cached_tokens, len(out.token_ids),
                          m.ttft, times[-1] - times[0] if times else None, self.finish_reason)
