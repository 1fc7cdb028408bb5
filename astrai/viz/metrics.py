"""A run's metrics.jsonl as curves: records in step order, one series per metric.

A resumed run needs no stitching: resuming drops the records after the checkpoint's step
before appending, so the file already holds one record per step, in order. Lines cut by a
kill are skipped, and should a step still appear twice the later record wins.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astrai.errors import ConfigError, DataError

X_AXES = {"step": "step", "tokens": "consumed_tokens", "time": "elapsed_s"}
"""--x choice -> the record key giving the x coordinate."""
X_LABELS = {"step": "optimizer step", "tokens": "tokens consumed", "time": "seconds of training"}


RENAMED = {
    "grpo_reward_mean": "reward", "grpo_reward_std": "reward_std", "grpo_kl": "kl",
    "grpo_clip_fraction": "clip_ratio/region_mean",
    "dpo_chosen_reward": "rewards/chosen", "dpo_rejected_reward": "rewards/rejected",
    "dpo_margin": "rewards/margins", "dpo_accuracy": "rewards/accuracies",
}
"""Metric names of earlier runs -> the TRL names the grpo and dpo strategies log now
(docs/alignment.md), so old and new metrics.jsonl files plot on the same panels. The old
grpo_reward_std was the population std, and with --dpo-reduction mean the old dpo_* used
mean log-ratios: their curves keep those definitions."""


def metric_name(name: str) -> str:
    """The current name of a metric (an earlier run's name maps through RENAMED)."""
    return RENAMED.get(name, name)


def metrics_file(run: str | Path) -> Path:
    """RUN_DIR/metrics.jsonl (a metrics.jsonl path itself is accepted too)."""
    run = Path(run)
    path = run if run.is_file() else run / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{run}: no metrics.jsonl; pass a run directory written by "
                        "`astrai train`")
    return path


def read_metrics(run: str | Path) -> list[dict[str, Any]]:
    """The run's records, one per step, sorted by step."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in metrics_file(run).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            by_step[rec["step"]] = {metric_name(k) if metric_name(k) not in rec else k: v
                                    for k, v in rec.items()}
    return [by_step[s] for s in sorted(by_step)]


def scalar(value: Any) -> float | None:
    """A record value as a float: numbers, booleans, and the strings 'nan'/'inf' that
    metrics.jsonl writes for non-finite floats; None for anything else."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str) and value.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(value)
    return None


def scalar_keys(records: list[dict[str, Any]]) -> list[str]:
    """Every key with a scalar value in some record, in first-seen order (step excluded)."""
    keys: dict[str, None] = {}
    for rec in records:
        for k, v in rec.items():
            if k != "step" and scalar(v) is not None:
                keys.setdefault(k)
    return list(keys)


@dataclass
class Series:
    """One metric of one run: the records that have it, as (x, y)."""

    run: str
    metric: str
    x: list[float]
    y: list[float]


def series(records: list[dict[str, Any]], metric: str, x: str = "step",
           run: str = "") -> Series:
    """The points of `metric` against `x` (step | tokens | time)."""
    if x not in X_AXES:
        raise ConfigError(f"--x: '{x}' is not one of {', '.join(X_AXES)}")
    xs, ys = [], []
    for rec in records:
        y, xv = scalar(rec.get(metric)), scalar(rec.get(X_AXES[x]))
        if y is not None and xv is not None:
            xs.append(xv)
            ys.append(y)
    return Series(run, metric, xs, ys)


def ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: a debiased exponential moving average,
    s_t = sum_{i<=t} w^(t-i) (1-w) v_i / (1 - w^(t+1)), over the finite values (a
    non-finite value passes through unchanged). weight 0 returns the values."""
    if not 0 <= weight < 1:
        raise ConfigError(f"--smooth: weight {weight} must be in [0, 1)")
    out, last, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight**n))
    return out
