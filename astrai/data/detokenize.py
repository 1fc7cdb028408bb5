"""Incremental detokenization for streaming chat.

A byte-level BPE token can end in the middle of a UTF-8 character. We decode a small window
of recent ids and emit only the text beyond what the window's settled prefix already gave;
while the window ends in an incomplete character (decoded as U+FFFD) we hold the text back.
Decoding a window that starts one token before the new text also keeps decoders that strip
a leading space (Metaspace) from eating the space between tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_REPLACEMENT = "\ufffd"


class StreamDecoder:
    """`push(token_id) -> str` returns the new complete text; `flush()` returns the rest."""

    def __init__(self, decode: Callable[..., str], skip_special_tokens: bool = True) -> None:
        self._decode = decode
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: text before `_read` was already emitted
        self._read = 0

    def _text(self, ids: Sequence[int]) -> str:
        return self._decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        settled = self._text(self._ids[self._prefix:self._read])
        text = self._text(self._ids[self._prefix:])
        if text.endswith(_REPLACEMENT) or not text.startswith(settled):
            return ""  # an unfinished multi-byte character: wait for the next token
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix > 64:  # keep the buffer small on long generations
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return text[len(settled):]

    def flush(self) -> str:
        """Emit whatever is held back (a dangling partial character decodes as U+FFFD)."""
        settled = self._text(self._ids[self._prefix:self._read])
        text = self._text(self._ids[self._prefix:])
        self._ids.clear()
        self._prefix = self._read = 0
        return text.removeprefix(settled)
