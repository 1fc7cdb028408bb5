"""Lock-in checks on live parameters, and a training callback that runs them.

`check_lockin` applies the checkpoint inspection to in-memory parameters (any device; a
tensor is read in row chunks, never copied whole). `LockInGuard` is a callback with the
trainer's hook names and arguments (astrai.train.callbacks.base), duck-typed so this room
never imports the trainer: a context object with `.model` (an nn.Module), a step counter
(`.step` or `.state.step`) and optionally `.logger` (info / warning); a step report with
`.step` and `.lr`; a control object whose `add_metric(name, value)` puts its figures in
the step's record (metrics.jsonl). It

  * logs per-layer gradient norms (and, with `histograms`, log10 |g| histograms) during the
    first `grad_steps` optimizer steps, as the paper recommends (§Solution), and
  * every `every` steps counts locked, overflowed and non-finite weights and the BF16 dead
    zone at the current lr, and warns when locked weights appear or grow.

Its figures land in that step's metrics line whatever the registration order (the trainer
calls record writers last).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field

from astrai.inspect.config import InspectConfig
from astrai.inspect.names import clean_name as _clean_name
from astrai.inspect.names import parse_name
from astrai.inspect.scan import CheckpointScan, summarize
from astrai.inspect.tensor import analyze_tensor
from astrai.inspect.update_watch import (
    UpdateWatch,
    lr_for_visible,
    peak_lr,
    rounds_away_share,
)
from astrai.inspect.verdict import Finding, findings, verdict
from astrai.typed_config import TypedConfig

log = logging.getLogger("astrai.inspect.guard")

def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2); the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


@dataclass
class LockInCheck:
    """The result of `check_lockin`."""

    scan: CheckpointScan
    findings: list[Finding]
    verdict: str

    def counts(self) -> dict[str, float]:
        """The figures the guard logs (metrics.jsonl keys without the `lockin/` prefix)."""
        s = self.scan
        out: dict[str, float] = {
            "locked": s.locked, "overflow": s.overflowed, "nonfinite": s.nonfinite,
            "extreme_rows": s.extreme_rows, "locked_gain": sum(p.count for p in s.gain_patterns),
        }
        if s.lr:
            out["dead_zone"] = round(s.dead_zone[0].fraction, 6)
        return out


def check_lockin(named_params: Iterable[tuple[str, torch.Tensor]],
                 config: InspectConfig | None = None, *, lr: float | None = None) -> LockInCheck:
    """Inspect live parameters (e.g. `model.named_parameters()`) like a checkpoint."""
    cfg = config or InspectConfig()
    stats = []
    with torch.no_grad():
        for raw, p in named_params:
            name = _clean_name(raw)
            t = _local(p.detach())
            shape = tuple(t.shape)
            param = parse_name(name, len(shape))
            if not t.is_floating_point():
                continue
            rows = shape[0] if shape else 1
            t2 = t.reshape(rows, -1) if t.numel() else t.reshape(rows, 0)  # (rows, cols)
            stats.append(analyze_tensor(lambda a, b, x=t2: x[a:b], param, shape, t.dtype, cfg))
    scan = summarize("<live model>", "live", None, lr, "trainer" if lr else None, stats, cfg)
    found = findings([scan], None, cfg)
    return LockInCheck(scan, found, verdict(found))


def grad_norms(named_params: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """L2 gradient norm per block (`layer_3`) and for the rest (`embed`, `head`, `other`)."""
    sq: dict[str, float] = {}
    for raw, p in named_params:
        g = p.grad
        if g is None:
            continue
        g = _local(g.detach())
        name = _clean_name(raw)
        pn = parse_name(name, g.dim())
        key = (f"layer_{pn.layer}" if pn.layer is not None else
               "embed" if pn.role == "embedding" else "head" if pn.role == "lm_head" else "other")
        sq[key] = sq.get(key, 0.0) + float(g.double().square().sum())
    return {k: math.sqrt(v) for k, v in sq.items()}


HIST_LOW, HIST_HIGH = -12, 4
"""log10 |g| histogram range: bins [10^k, 10^(k+1)) for k in [-12, 4), under- and overflow
clamped into the end bins; exact zeros counted apart."""


def grad_histograms(named_params: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[int]]:
    """Per block, counts of |g| per decade (HIST_LOW..HIST_HIGH) followed by the zero count."""
    out: dict[str, torch.Tensor] = {}
    nb = HIST_HIGH - HIST_LOW
    for raw, p in named_params:
        if p.grad is None:
            continue
        g = _local(p.grad.detach()).reshape(-1).float().abs()
        pn = parse_name(_clean_name(raw), p.dim())
        key = f"layer_{pn.layer}" if pn.layer is not None else "other"
        nz = g[g > 0]
        dec = torch.floor(torch.log10(nz)).clamp(HIST_LOW, HIST_HIGH - 1).long() - HIST_LOW
        h = torch.bincount(dec, minlength=nb).cpu()
        h = torch.cat([h, torch.tensor([int(g.numel() - nz.numel())])])
        out[key] = h if key not in out else out[key] + h
    return {k: v.tolist() for k, v in out.items()}


class GuardConfig(TypedConfig):
    """When the guard runs and what it logs."""

    every: int = Field(100, ge=1)
    """Check the weights every N optimizer steps (and at the first and last)."""
    grad_steps: int = Field(100, ge=0)
    """Log per-layer gradient norms during the first N optimizer steps."""
    histograms: bool = False
    """Also log per-layer log10 |g| histograms during those steps."""
    thresholds: InspectConfig = Field(default_factory=InspectConfig)
    """What counts as locked / overflowed (the inspect-weights thresholds)."""
    visible_sample: int = Field(4096, ge=0)
    """Entries per bf16/fp16 tensor sampled for the visible-update fraction on check steps
    (astrai.inspect.update_watch); 0 = off."""
    visible_warn: float = Field(0.1, ge=0.0, le=1.0)
    """Warn (once per parameter group) when a step changes less than this share of a
    group's sampled low-precision weights; 0 = never."""


@dataclass
class LockInGuard:
    """Training callback: cheap lock-in checks every N steps, early gradient logging."""

    config: GuardConfig = field(default_factory=GuardConfig)
    log_fn: Callable[[dict[str, Any]], None] | None = None
    """Optional sink for each record ({"step": N, ...}); the step's control.add_metric is
    used as well."""
    name: str = "bf16_guard"
    records: list[dict[str, Any]] = field(default_factory=list)
    """Everything logged, in order (also useful in tests)."""
    last: LockInCheck | None = None
    _locked: int = 0
    _bad: int = 0
    _checked_at: int | None = None
    _lr: float | None = None  # the latest step's lr (for the dead zone)
    _watch: UpdateWatch | None = None
    _warned_groups: set[str] = field(default_factory=set)
    _past_warmup: bool = False  # some group's lr has reached its schedule's peak

    # -- hooks ---------------------------------------------------------------------------
    def on_train_begin(self, ctx) -> None:
        self._check(ctx, _step(ctx), None)

    def on_optimizer_step(self, ctx, control=None) -> None:
        # Gradients of this window are complete here (before optimizer.step and zero_grad).
        step = _step(ctx) + 1  # the step being taken
        if step == 1 or step % self.config.every == 0:
            if control is not None and hasattr(control, "request_record"):
                control.request_record()  # the step's record holds the guard's figures
            if self.config.visible_sample:
                self._watch = self._watch or UpdateWatch(self.config.visible_sample)
                self._watch.take(getattr(ctx, "optimizer", None))
        if step > self.config.grad_steps:
            return
        params = list(ctx.model.named_parameters())
        rec = {f"grad_norm/{k}": round(v, 8) for k, v in grad_norms(params).items()}
        if self.config.histograms:
            rec.update({f"grad_hist/{k}": v for k, v in grad_histograms(params).items()})
        self._emit(ctx, control, step, rec)

    def on_step_end(self, ctx, report=None, control=None) -> None:
        step = int(getattr(report, "step", _step(ctx)))
        self._lr = _positive(getattr(report, "lr", None))
        if self._watch is not None:
            fractions = self._watch.fractions()
            if fractions and not getattr(report, "skipped", False):
                self._visible(ctx, step, control, fractions)
        if step % self.config.every == 0:
            self._check(ctx, step, control)

    def on_train_end(self, ctx) -> None:
        step = _step(ctx)
        if self._checked_at != step:
            self._check(ctx, step, None)

    def on_epoch_begin(self, ctx) -> None: ...
    def on_batch_begin(self, ctx, micro=None) -> None: ...
    def on_batch_end(self, ctx, micro=None) -> None: ...
    def on_epoch_end(self, ctx) -> None: ...
    def on_error(self, ctx, error: BaseException) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {"locked": self._locked, "bad": self._bad, "warned": sorted(self._warned_groups),
                "past_warmup": self._past_warmup}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._locked = int(state.get("locked", 0))
        self._bad = int(state.get("bad", 0))
        self._warned_groups = set(state.get("warned", []))
        self._past_warmup = bool(state.get("past_warmup", False))

    # -- work ----------------------------------------------------------------------------
    def _check(self, ctx, step: int, control) -> None:
        self.last = check_lockin(ctx.model.named_parameters(), self.config.thresholds,
                                 lr=self._lr)
        self._checked_at = step
        counts = self.last.counts()
        self._emit(ctx, control, step, {f"lockin/{k}": v for k, v in counts.items()})
        locked = int(counts["locked"])
        bad = int(counts["overflow"] + counts["nonfinite"])
        if locked > self._locked or bad > self._bad:  # warn when it appears or grows
            what = "; ".join(f.message for f in self.last.findings if f.level == "found")
            _warn(ctx, f"step {step}: BF16 lock-in check: {locked:,} locked, "
                       f"{int(counts['overflow']):,} overflowed, {int(counts['nonfinite']):,} "
                       f"non-finite weights ({what[:300]}); run `astrai inspect-weights` on "
                       "the checkpoints for the full report")
        self._locked, self._bad = max(self._locked, locked), max(self._bad, bad)

    def _visible(self, ctx, step: int, control, fractions: dict[str, float]) -> None:
        """Log the visible-update fractions; for weights written round-to-nearest, warn once
        per group whose updates are lost: a share of its sampled next updates at least
        rounds_away_max under half an ulp at the schedule's peak lr, or a step past warmup
        that changed less than visible_warn. Stochastic rounding and Kahan carry small
        updates (a small changed share per step is how they move), so they never warn."""
        self._emit(ctx, control, step,
                   {f"update_visible/{k}": round(v, 6) for k, v in fractions.items()})
        optimizer = getattr(ctx, "optimizer", None)
        if _write_mode(optimizer) != "nearest":
            return
        limit = self.config.thresholds.rounds_away_max
        for group, frac in fractions.items():
            peak, now = peak_lr(optimizer, group)
            share = rounds_away_share(optimizer, group, peak) if peak else None
            if share is not None:
                self._emit(ctx, control, step, {f"rounds_away_at_peak/{group}": round(share, 6)})
            past_warmup = peak is not None and now is not None and now >= peak * (1 - 1e-6)
            self._past_warmup = self._past_warmup or past_warmup
            lost = (share is not None and share >= limit) or (
                self._past_warmup and frac < self.config.visible_warn)
            if not lost or group in self._warned_groups:
                continue
            self._warned_groups.add(group)
            at_peak = (f"; at the schedule's peak lr {peak:g}, {100 * share:.3g}% of its next "
                       "updates round away" if share is not None else "")
            lr_now = f" (lr {now:.2g})" if now else ""
            _warn(ctx, f"step {step}: bf16 weights of group '{group}' are written "
                       f"round-to-nearest and lose their updates: {100 * frac:.3g}% changed "
                       f"at this step{lr_now}{at_peak}: {_fix(optimizer, group, peak)}")

    def _emit(self, ctx, control, step: int, rec: dict[str, Any]) -> None:
        add = getattr(control, "add_metric", None)
        if add is not None:
            for k, v in rec.items():
                add(k, v)
        full = {"step": step, **rec}
        self.records.append(full)
        if self.log_fn is not None:
            self.log_fn(full)
        logger = getattr(ctx, "logger", None)
        if logger is not None and hasattr(logger, "info"):
            logger.info("bf16 guard %s", full)


def _write_mode(optimizer: Any) -> str:
    """How the optimizer writes bf16 weights (astrai.train.bf16_update's WeightWriter);
    nearest for optimizers without one (torch's own round to nearest)."""
    return getattr(getattr(optimizer, "writer", None), "mode", "nearest")


def _fix(optimizer: Any, group: str, peak: float | None) -> str:
    """The warning's advice: the cures, and a higher learning rate only when the schedule's
    peak is below the lr at which half the group's updates reach half an ulp."""
    fixes = ["--bf16-update stochastic (or kahan)", "--precision bf16-mixed (fp32 master "
             "weights)"]
    need = lr_for_visible(optimizer, group)
    if need is not None and peak is not None and need > peak:
        fixes.append(f"a peak learning rate of at least {need:.2g} (where half the updates "
                     f"reach half an ulp; the schedule peaks at {peak:g})")
    return ("updates below half an ulp round away (docs/bf16-lockin.md); use "
            + ", or ".join(fixes))


def _step(ctx) -> int:
    step = getattr(ctx, "step", None)
    if isinstance(step, int):
        return step
    return int(ctx.state.step)


def _positive(lr: Any) -> float | None:
    return float(lr) if isinstance(lr, (int, float)) and lr > 0 else None


def _warn(ctx, msg: str) -> None:
    logger = getattr(ctx, "logger", None)
    (logger if logger is not None and hasattr(logger, "warning") else log).warning(msg)
