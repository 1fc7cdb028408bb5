"""The verdict: healthy, lock-in suspected or lock-in found, with the reasons.

Rules (thresholds in InspectConfig, documented in docs/inspect-weights.md):
  found      a matrix (embedding and LM head included) holds locked values; or any tensor holds
             non-finite entries, or entries with |w| > overflow.
  suspected  a token row's norm exceeds row_norm_factor x the median row norm; a matrix is
             dominated by one non-zero value; a bf16 checkpoint written round-to-nearest
             (astrai.inspect.update_mode) has at least rounds_away_max of its next updates
             under half an ulp, or, past step 0, a kind of norm gains at least
             frozen_gain_share exactly 1.0 (their init); or, across checkpoints, at least
             stuck_min_count entries stayed bit-identical and more than stuck_excess x the
             count an unbiased rounding leaves unchanged, plus 4 standard deviations
             (astrai.inspect.unchanged; without optimizer state: moving matrices only, and
             the raw count decides).
  healthy    otherwise. Locked values in 1-D gains are reported but never decide the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from astrai.inspect.config import InspectConfig
from astrai.inspect.patterns import fmt_value, gain_summaries
from astrai.inspect.scan import CheckpointScan
from astrai.inspect.stuck import StuckReport
from astrai.inspect.update_mode import UpdateMode

STUCK_Z = 4.0
"""Binomial standard deviations the stuck count must clear above its expectation."""

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
        out += _nearest_findings(scan, cfg)
    if stuck is not None:
        out += _stuck_findings(stuck, cfg)
    return out


def _how(mode: UpdateMode) -> str:
    return "bf16 weights written round-to-nearest" + (
        " (assumed: no record of the update mode)" if mode.assumed else "")


def _nearest_findings(scan: CheckpointScan, cfg: InspectConfig) -> list[Finding]:
    """A round-to-nearest bf16 checkpoint whose updates are lost: most next updates under
    half an ulp, or norm gains that never left their init value 1.0."""
    mode = scan.update
    if mode is None or not mode.loses_updates:
        return []
    out = []
    v = scan.visibility
    if v is not None and v.entries and v.fraction >= cfg.rounds_away_max:
        out.append(Finding("suspected", scan.path, (
            f"{100 * v.fraction:.1f}% of the next updates are under half an ulp and round "
            f"away ({_how(mode)}; alarming from {100 * cfg.rounds_away_max:g}%): those "
            f"weights do not learn; {advice(v)}")))
    if scan.step:
        for g in gain_summaries(_trained_gains(scan)):
            if g.entries and g.exact_one >= cfg.frozen_gain_share * g.entries:
                out.append(Finding("suspected", scan.path, (
                    f"{g.kind}: {g.exact_one:,} of {g.entries:,} gains still exactly 1.0, "
                    f"their init value, at step {scan.step} ({_how(mode)}): no update "
                    "reached half an ulp (2^-9 downwards from 1.0, 2^-8 upwards)")))
    return out


def _trained_gains(scan: CheckpointScan) -> list:
    """The checkpoint's norm gains that were trained: those its optimizer state names when
    it has one (a LoRA run's frozen base gains stay at 1.0 by design), else all."""
    trained = {t.name for t in scan.visibility.tensors} if scan.visibility else None
    return [st for st in scan.tensors if st.param.role == "gain" and
            (not trained or st.name in trained)]


def advice(v) -> str:
    """The cures of lost updates; a higher lr only when the schedule's peak is below the lr
    that moves half the entries (never a warmup step's lr)."""
    cures = "use --bf16-update stochastic or kahan, or --precision bf16-mixed"
    lrs = sorted(t.lr_to_move for t in v.tensors if t.lr_to_move)
    peaks = [t.peak_lr for t in v.tensors if t.peak_lr]
    if lrs and peaks:
        need, peak = lrs[len(lrs) // 2], max(peaks)
        if need > peak:
            cures += (f", or a peak lr of at least {need:.2g} (this run's schedule peaks at "
                      f"{peak:g})")
    return cures + " (docs/bf16-lockin.md)"


def _stuck_findings(stuck: StuckReport, cfg: InspectConfig) -> list[Finding]:
    """Stuck entries beyond what an unbiased rounding leaves unchanged."""
    if stuck.stuck < cfg.stuck_min_count or stuck.excess(cfg.stuck_excess, STUCK_Z) <= 0:
        return []
    worst = sorted((t for t in stuck.tensors if t.counted and t.stuck),
                   key=lambda t: -(t.stuck - (t.expected or 0.0)))[:3]
    names = "; ".join(f"{t.name} ({t.stuck:,}, {t.rows.named('row', max_ranges=3)})"
                      for t in worst)
    what = (f"{stuck.stuck:,} entries bit-identical across {len(stuck.paths)} checkpoints "
            f"where an unbiased rounding leaves about {stuck.expected:,.0f} "
            f"(± {stuck.variance ** 0.5:,.0f}) unchanged" if stuck.modelled else
            f"{stuck.stuck:,} entries of moving matrices bit-identical across "
            f"{len(stuck.paths)} checkpoints")
    return [Finding("suspected", None, f"{what}: {names}")]


def verdict(found: list[Finding]) -> str:
    """The worst level among the findings ('healthy' when there are none)."""
    return max((f.level for f in found), key=LEVELS.index, default="healthy")
