"""Prompt lookup (n-gram) proposals: continue the request's own text where it repeats.

The last n tokens of prompt + output are looked up earlier in the same sequence, for n
from `n_max` down to `n_min`; the tokens that followed an occurrence of the longest
matching n-gram are the proposal — the most recent occurrence followed by k tokens (a
repeat close to the end leaves fewer), else the earliest ("prompt lookup decoding", Saxena 2023; vLLM's
prompt_lookup_max / prompt_lookup_min). Summaries, edits, code and quoted passages repeat
their input, so the proposals are often right, at no model cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def propose_ngram(tokens: Sequence[int], k: int, n_max: int, n_min: int = 1) -> list[int]:
    """Up to `k` tokens continuing `tokens`: the ones after an earlier match of its longest
    suffix n-gram, n_min <= n <= n_max (an empty list: no match) — the latest match with k
    tokens after it, else the earliest. Equal to the loop "for n = n_max..n_min: the
    matches i < len - n with tokens[i:i+n] == tokens[-n:], ..." of
    tests/infer/test_speculative.py, vectorised over the candidate positions."""
    L = len(tokens)
    if k <= 0 or L < 2:
        return []
    a = np.asarray(tokens, dtype=np.int64)
    ends = np.flatnonzero(a[:-1] == a[-1])  # candidate match ends c < L - 1
    if ends.size == 0:
        return []
    length = np.zeros(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for m in range(min(n_max, L - 1)):  # match length grows backwards from each end
        back = ends - m
        ok = alive & (back >= 0)
        ok[ok] = a[back[ok]] == a[L - 1 - m]
        length += ok
        alive = ok
        if not alive.any():
            break
    best = int(length.max())
    if best < n_min:
        return []
    longest = ends[length == best]
    full = longest[longest + k < L]  # followed by k tokens
    c = int(full[-1] if full.size else longest[0])
    return a[c + 1:c + 1 + k].tolist()
