"""Prompt lookup (n-gram) proposals: continue the request's own text where it repeats.

The last n tokens of prompt + output are looked up earlier in the same sequence, for n
from `n_max` down to `n_min`; the tokens that followed an occurrence of the longest
matching n-gram are the proposal — the most recent occurrence followed by k tokens (a
repeat close to the end leaves fewer), else the earliest ("prompt lookup decoding", Saxena 2023; vLLM's
prompt_lookup_max / prompt_lookup_min). Summaries, edits, code and quoted passages repeat
their input, so the proposals are often right, at no model cost.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

WIDTH = array("i").itemsize
"""Bytes per token id in the searched buffer: the lookup is bytes.find over the ids'
machine representation (C speed; a step's proposal costs microseconds, not the tenth of a
millisecond a vectorised numpy scan of a few hundred tokens does)."""


def _find(hay: bytes, pat: bytes, end: int, last: bool) -> int:
    """The token index of the first (or last) occurrence of `pat` inside hay[:end] that
    starts on a token boundary, or -1."""
    if last:
        i = hay.rfind(pat, 0, end)
        while i > 0 and i % WIDTH:
            i = hay.rfind(pat, 0, i + len(pat) - 1)
    else:
        i = hay.find(pat, 0, end)
        while i > 0 and i % WIDTH:
            i = hay.find(pat, i + 1, end)
    return i // WIDTH if i >= 0 else -1


def propose_ngram(tokens: Sequence[int], k: int, n_max: int, n_min: int = 1) -> list[int]:
    """Up to `k` tokens continuing `tokens`: the ones after an earlier match of its longest
    suffix n-gram, n_min <= n <= n_max (an empty list: no match) — the latest match with k
    tokens after it, else the earliest. Equal to the loop "for n = n_max..n_min: the
    matches i < len - n with tokens[i:i+n] == tokens[-n:], ..." of
    tests/infer/test_speculative.py."""
    L = len(tokens)
    if k <= 0 or L < 2:
        return []
    hay = array("i", tokens).tobytes()
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        pat = hay[(L - n) * WIDTH:]
        first = _find(hay, pat, (L - 1) * WIDTH, last=False)  # ends before the last token
        if first < 0:
            continue
        latest = _find(hay, pat, (L - k) * WIDTH, last=True) if L - k >= n else -1
        start = (latest if latest >= 0 else first) + n
        return list(tokens[start:start + k])
    return []
