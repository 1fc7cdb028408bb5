"""The verdict: healthy, lock-in suspected or lock-in found, with the reasons.

Rules (thresholds in InspectConfig, documented in docs/inspect-weights.md):
  found      a matrix (embedding and LM head included) holds locked values; or any tensor holds
             non-finite entries, or entries with |w| > overflow.
  suspected  a token row's norm exceeds row_norm_factor x the median row norm; a matrix is
             dominated by one non-zero value; or, across checkpoints, at least stuck_min_count
             entries of moving matrices stayed bit-identical.
  healthy    otherwise. Locked values in 1-D gains are reported but never decide the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from astrai.inspect.config import InspectConfig
from astrai.inspect.patterns import fmt_value
from astrai.inspect.scan import CheckpointScan
from astrai.inspect.stuck import StuckReport

LEVELS = ("healthy", "suspected", "found")
LABELS = {"healthy": "healthy", "suspected": "lock-in suspected", "found": "lock-in found"}


@dataclass(frozen=True)
class Finding:
    """One reason for the verdict."""

    level: str
    """suspected | found"""
    checkpoint: str | None
    message: str


def findings(scans: list[CheckpointScan], stuck: StuckReport | None,
             cfg: InspectConfig) -> list[Finding]:
    out: list[Finding] = []
    for scan in scans:
        p = scan.path
        for pat in scan.patterns:
            out.append(Finding("found", p, f"locked: {pat.describe()}"))
        for g in scan.overflow:
            what = []
            if g.entries - g.nonfinite:
                what.append(f"{g.entries - g.nonfinite:,} entries with |w| > {cfg.overflow:g}")
            if g.nonfinite:
                what.append(f"{g.nonfinite:,} non-finite entries")
            noun = "token" if g.role in ("embedding", "lm_head") else "row"
            where = f" in {g.layers.named('layer')}" if g.layers.ranges else ""
            out.append(Finding("found", p, f"overflow: {g.kind}: {' and '.join(what)}, "
                                           f"{g.rows.named(noun)}{where}"))
        for st in scan.tensors:
            bad = set(st.bad_rows)
            extra = [r for r, _ in st.extreme_rows if r not in bad]
            if extra:
                out.append(Finding("suspected", p, (
                    f"{st.name}: {len(extra)} token row(s) with L2 norm over "
                    f"{cfg.row_norm_factor:g} x the median ({st.row_norm_median:.3g}): "
                    f"tokens {', '.join(map(str, extra[:8]))}" + (" …" if len(extra) > 8 else "")
                )))
            if st.dominant is not None:
                out.append(Finding("suspected", p, (
                    f"{st.name}: over half of its entries equal {fmt_value(st.dominant)}")))
    if stuck is not None and stuck.stuck >= cfg.stuck_min_count:
        worst = sorted((t for t in stuck.tensors if t.counted and t.stuck),
                       key=lambda t: -t.stuck)[:3]
        names = "; ".join(f"{t.name} ({t.stuck:,}, {t.rows.named('row', max_ranges=3)})" for t in worst)
        out.append(Finding("suspected", None, (
            f"{stuck.stuck:,} entries of moving matrices bit-identical across "
            f"{len(stuck.paths)} checkpoints: {names}")))
    return out


def verdict(found: list[Finding]) -> str:
    """The worst level among the findings ('healthy' when there are none)."""
    return max((f.level for f in found), key=LEVELS.index, default="healthy")
