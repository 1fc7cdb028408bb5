"""A one-line chart of recent values in Unicode block characters (▁▂▃▄▅▆▇█)."""

from __future__ import annotations

import math
from collections.abc import Sequence

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 24) -> str:
    """The last `width` values scaled between their min (▁) and max (█); a non-finite value
    shows as '!' and a flat series as a row of ▄."""
    vals = list(values)[-width:] if width > 0 else []
    finite = [v for v in vals if math.isfinite(v)]
    if not finite:
        return "!" * len(vals)
    lo, hi = min(finite), max(finite)
    out = []
    for v in vals:
        if not math.isfinite(v):
            out.append("!")
        elif hi == lo:
            out.append(BARS[len(BARS) // 2 - 1])
        else:
            out.append(BARS[min(len(BARS) - 1, int((v - lo) / (hi - lo) * len(BARS)))])
    return "".join(out)
