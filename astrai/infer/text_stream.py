"""Incremental detokenization with stop strings that may span token boundaries.

Text is released as soon as it cannot be the start of a stop string: after each token the
longest suffix that is a proper prefix of some stop string is held back. Any later match
must then begin inside the held-back text, so searching `held + new piece` finds every
stop string exactly once, at its earliest position. The held text is shorter than the
longest stop string, so each token's check reads that tail and the new piece only: its
cost does not grow with the length of the output.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    def __init__(self, decoder: Any, stop: list[str], include_stop: bool = False) -> None:
        self.decoder = decoder
        """The tokenizer's stream decoder: push(id) -> str, flush() -> str."""
        self.stop = list(stop)
        self.include_stop = include_stop
        self.held = ""
        self.text = ""
        """Everything released so far."""

    def push(self, token_id: int) -> tuple[str, str | None]:
        """Feed one token; returns (text released now, the stop string matched or None)."""
        return self._feed(self.decoder.push(token_id))

    def finish(self) -> tuple[str, str | None]:
        """The request ended: release everything still held (a stop string completed by
        the decoder's final flush still cuts the text). Returns (text, stop string)."""
        rest = self.held + self.decoder.flush()
        self.held = ""
        if not self.stop:
            self.text += rest
            return rest, None
        return self._scan(rest, final=True)

    def _feed(self, piece: str) -> tuple[str, str | None]:
        if not self.stop:
            self.text += piece
            return piece, None
        return self._scan(self.held + piece, final=False)

    def _scan(self, buf: str, final: bool) -> tuple[str, str | None]:
        best, hit = -1, None
        for s in self.stop:
            i = buf.find(s)
            if i != -1 and (best == -1 or i < best):
                best, hit = i, s
        if hit is not None:
            out = buf[: best + len(hit)] if self.include_stop else buf[:best]
            self.held = ""
            self.text += out
            return out, hit
        keep = 0 if final else self._partial(buf)
        out = buf[: len(buf) - keep]
        self.held = buf[len(buf) - keep:]
        self.text += out
        return out, None

    def _partial(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string.

        Only starts inside the last len(s) - 1 characters can begin one, and only starts
        that would beat the best so far are tried, each found by a C-level `find` of the
        string's first character: the cost is bounded by the number of stop strings
        (SamplingParams.MAX_STOP) times that tail, whatever came before it."""
        best, n = 0, len(buf)
        for s in self.stop:
            i = buf.find(s[0], max(n - len(s) + 1, 0), n - best)
            while i != -1:
                if s.startswith(buf[i:]):
                    best = n - i
                    break
                i = buf.find(s[0], i + 1, n - best)
        return best
