"""What one structured-output constraint may cost, measured when it compiles.

llguidance builds its lexer lazily, inside the mask computation: a short pattern such as
`a{1000}{300}x` compiles in a millisecond and then takes half a second of CPU for its first
token mask and a quarter of a second for each later one, per row. The engine step waits on
the masks of every constrained row, so that work would stall every other client. Hence:

- llguidance's own bounds (`LLParserLimits`, its docs: "fuel" for the lexer's regex
  derivatives, lexer states, Earley items per step) on every matcher, stricter than its
  defaults where that costs real schemas nothing;
- a probe, run where the constraint compiles (in the request's worker thread, off the
  engine's step): the first `PROBE_STEPS` masks along the lowest allowed token, timed in
  CPU seconds of the calling thread (llguidance computes one matcher's mask there, without
  the GIL), so a loaded machine does not inflate it; a mask above `MASK_BUDGET` is refused;
- the compiled-grammar cache bounded by an estimate of each entry's bytes (`entry_bytes`).

Measured on Qwen3's 151,669-token vocabulary (one CPU core): the masks of the JSON schemas,
regexes and grammars of the tests take 0.1-3 ms each; `a{1000}{10}x` 9 ms, `a{1000}{30}x`
33 ms, `a{1000}{300}x` 540 ms.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

MASK_BUDGET = 0.02
"""CPU seconds one row's token mask may take (the worst of the probe's steps)."""
BATCH_MASK_BUDGET = 0.5
"""CPU seconds the masks of one request's rows may take together per step (n copies of
one constraint cost n masks)."""
PROBE_STEPS = 32
"""Most masks computed when a constraint compiles: enough to walk through a tool call's
fixed opening into its arguments, or a schema's first property."""
PROBE_SECONDS = 0.1
"""CPU seconds after which the probe stops walking (and accepts what it has seen): the
tests' long regexes take about 3 ms a step."""
LEXER_FUEL = 200_000
"""llguidance's `initial_lexer_fuel` (its default 1,000,000): the regex-derivative work a
lexer may do. Five times below the default, the tests' schemas and a 400-token walk through
a free JSON object stay far inside it; `a{1000}{300}x` runs out within 8 tokens."""
CACHE_BYTES = 256 * 2**20
"""Bytes of compiled constraints kept (estimated by `entry_bytes`)."""
ENTRY_BYTES = 64 * 1024
"""Bytes one compiled constraint keeps beyond its lexer: the resident-memory growth per
cached matcher of the tests' small schemas measured at about 60 kB."""
BYTES_PER_MASK_SECOND = 200 * 2**20
"""Bytes of lexer states built per CPU second of mask work: resident memory grew 104-165 MB
per second of first-mask CPU for `a{N}x`, N from 10,000 to 300,000 (llguidance's docs give
1-2 kB per lexer state); rounded up."""


def parser_limits(llg: Any) -> Any:
    """The `LLParserLimits` of every matcher and validation: `LEXER_FUEL`, and short error
    messages (the verbose ones include parser state and the grammar)."""
    return llg.LLParserLimits(initial_lexer_fuel=LEXER_FUEL, verbose_errors=False)


class Probe(NamedTuple):
    """What the first masks of a constraint showed."""

    worst: float
    """CPU seconds of the costliest mask."""
    first: float
    """CPU seconds of the first mask (the lexer states it built stay with the matcher)."""
    error: str
    """The grammar engine's error, "" if none."""
    empty: bool
    """The first mask allows no token at all (e.g. a regex whose language is empty)."""


def probe(matcher: Any, vocab_size: int, stop_ids: frozenset[int]) -> Probe:
    """Time the first `PROBE_STEPS` masks. The first mask is the matcher's own, so that its
    copies start with the lexer states it built (kept with it in the cache); the others walk
    a copy (whose states go with it) along the lowest allowed token that is not a stop
    token. Stops early once a mask exceeds `MASK_BUDGET` or all of them `PROBE_SECONDS`."""
    import torch

    row = torch.zeros(1, (vocab_size + 31) // 32, dtype=torch.int32)
    worst = total = first = 0.0
    empty = False
    m = matcher
    for step in range(PROBE_STEPS):
        t = time.thread_time()
        m.unsafe_compute_mask_ptr(row.data_ptr(), row.shape[1] * 4)
        spent = time.thread_time() - t
        worst, total = max(worst, spent), total + spent
        first = first or spent
        if m.is_error() or m.is_stopped() or worst > MASK_BUDGET or total > PROBE_SECONDS:
            break
        # bit j of word w is token 32w + j (llguidance's layout); sampling_math unpacks the
        # same way, but importing it here would close a cycle through params
        bits = (row[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.flatten()[:vocab_size].nonzero().flatten().tolist()
        empty = step == 0 and not allowed
        token = next((t for t in allowed if t not in stop_ids), None)
        if token is None:
            break
        if m is matcher:
            m = matcher.deep_copy()
        m.consume_token(token)
    return Probe(worst, first, m.get_error() if m.is_error() else "", empty)


def entry_bytes(grammar: str, mask_seconds: float) -> int:
    """Estimated bytes a cached compiled constraint keeps: a fixed part, its grammar text
    (llguidance keeps it compiled, a few bytes per character), and the lexer states its
    first mask built (`mask_seconds` of CPU)."""
    return ENTRY_BYTES + 4 * len(grammar) + int(BYTES_PER_MASK_SECOND * mask_seconds)
