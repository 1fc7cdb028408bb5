"""Training curves of one or more runs, one panel per metric, runs overlaid."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from astrai.errors import ConfigError, DataError
from astrai.viz.figure import new_figure
from astrai.viz.metrics import X_LABELS, ema, metric_name, read_metrics, scalar_keys, series

DEFAULT_METRICS = ("loss", "val_bpb", "lr", "grad_norm", "tokens_per_s")
"""Shown when --metrics is not given (those no run has are left out; val_loss stands in
for val_bpb when no run knows the bytes of its tokens)."""
LOG_SCALE = {"lr"}
UNSMOOTHED = {"lr"}
"""A schedule is exact, and validation metrics (val_*) are already means over a held-out
set taken at a few steps: --smooth leaves them alone."""
UNSMOOTHED_PREFIXES = ("val_", "update_visible/", "rounds_away_at_peak/")
"""Also exact: the lock-in guard's shares of weights, measured over whole tensors at its
own interval. An average over a few such points would draw a value never measured (0.19
where the run measured 0.086), so --smooth leaves them as they are."""
FEW_POINTS = 12
"""Curves of at most this many points also mark each point."""


def _smoothed(metric: str) -> bool:
    return metric not in UNSMOOTHED and not metric.startswith(UNSMOOTHED_PREFIXES)


def run_names(runs: Sequence[str | Path]) -> list[str]:
    """Legend names: the shortest trailing path parts that tell the runs apart."""
    parts = [Path(r).absolute().parts for r in runs]
    for k in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(r) for r in runs]


def choose_metrics(records: Sequence[list[dict[str, Any]]],
                   metrics: Sequence[str] | None) -> list[str]:
    have: dict[str, None] = {}
    for recs in records:
        have.update(dict.fromkeys(scalar_keys(recs)))
    if not have:
        raise DataError("the runs' metrics.jsonl files hold no records yet")
    if metrics is None:
        wanted = [("val_loss" if m == "val_bpb" and m not in have else m)
                  for m in DEFAULT_METRICS]
        chosen = [m for m in wanted if m in have]
        return chosen or list(have)[:4]
    metrics = [metric_name(m) for m in metrics]  # an earlier run's name asks for its metric
    missing = [m for m in metrics if m not in have]
    if missing:
        raise ConfigError(f"--metrics: {', '.join(missing)} in none of the runs' metrics.jsonl; "
                          f"they have {', '.join(have)}")
    return list(metrics)


def plot_runs(runs: Sequence[str | Path], *, metrics: Sequence[str] | None = None,
              x: str = "step", smooth: float = 0.0, size: tuple[int, int] = (1200, 800)) -> Any:
    """A Figure with one panel per metric and one curve per run (a resumed run is one
    curve). With smooth > 0 each curve is drawn faint and its TensorBoard-style EMA on top
    (not the learning rate, not validation metrics).
    Every curve carries gid 'RUN|METRIC' ('RUN|METRIC|raw' for the faint one)."""
    if not runs:
        raise ConfigError("plot: pass at least one RUN_DIR")
    records = [read_metrics(r) for r in runs]
    names = run_names(runs)
    chosen = choose_metrics(records, metrics)
    fig = new_figure(size)
    cols = 1 if len(chosen) == 1 else 2
    rows = math.ceil(len(chosen) / cols)
    axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, metric in zip(axes, chosen, strict=False):
        for name, recs, color in zip(names, records, colors, strict=True):
            s = series(recs, metric, x, run=name)
            if not s.x:
                continue
            marker = "o" if len(s.x) <= FEW_POINTS else None
            if smooth > 0 and _smoothed(metric):
                ax.plot(s.x, s.y, color=color, alpha=0.25, linewidth=1, gid=f"{name}|{metric}|raw")
                ax.plot(s.x, ema(s.y, smooth), color=color, linewidth=1.5, label=name,
                        gid=f"{name}|{metric}", marker=marker, markersize=3)
            else:
                ax.plot(s.x, s.y, color=color, linewidth=1.5, label=name, gid=f"{name}|{metric}",
                        marker=marker, markersize=3)
        ax.set_title(metric)
        ax.set_xlabel(X_LABELS[x])
        if metric in LOG_SCALE and all(v > 0 for ln in ax.get_lines() for v in ln.get_ydata()):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    if len(runs) > 1:
        axes[0].legend(fontsize="small")
    return fig
