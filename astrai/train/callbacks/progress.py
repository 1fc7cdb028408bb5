"""Progress on stderr: step, loss, lr, tokens/s, ETA.

On a terminal, a live rich bar, with a sparkline of the recent logged losses beside the
loss; elsewhere (a log file, CI, a pipe, `nohup`), one plain line every `interval_s` seconds
and at the last step, so a long run is never silent. Figures are shown only from logged
steps (their loss is read from the device); when a line or a bar refresh is due the callback
asks the trainer to log that step (StepControl.request_log), so --log-interval never
silences the progress line.
"""

from __future__ import annotations

import time
from collections import deque

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from astrai.train.callbacks.base import Callback
from astrai.viz.sparkline import sparkline

SPARK_STEPS = 24
"""Recent step losses drawn by the sparkline."""


class ProgressCallback(Callback):
    name = "progress"

    def __init__(self, console: Console | None = None, interval_s: float = 30.0,
                 refresh_s: float = 1.0) -> None:
        self.console = console or Console(stderr=True)
        self.interval_s = interval_s
        self.refresh_s = refresh_s
        """The bar's loss and tokens/s are read at most this often (and at logged steps)."""
        self.progress: Progress | None = None
        self.task = None
        self.lines = False  # plain lines instead of the bar (not a terminal)
        self._t0 = self._last = 0.0
        self._step0 = 0
        self._tokens, self._time = 0, 0.0  # since the last figures shown
        self.losses: deque[float] = deque(maxlen=SPARK_STEPS)

    def on_train_begin(self, ctx) -> None:
        if not ctx.is_main:
            return
        self._t0 = self._last = time.perf_counter()
        self._step0 = ctx.state.step
        if not self.console.is_terminal:
            self.lines = True
            return
        self.progress = Progress(
            TextColumn("[bold]train[/] epoch {task.fields[epoch]}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("loss {task.fields[loss]} {task.fields[spark]}"),
            TextColumn("lr {task.fields[lr]}"), TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=ctx.total_steps, completed=ctx.state.step, epoch=ctx.state.epoch,
            loss="-", spark="", lr="-", tps="-",
        )

    def on_epoch_begin(self, ctx) -> None:
        if self.progress is not None:
            self.progress.update(self.task, epoch=ctx.state.epoch)

    def on_optimizer_step(self, ctx, control) -> None:
        # A line (or the bar's loss) is due: have the trainer read this step's figures. At
        # most one read per interval, so a fast run on a GPU is not synced every step.
        if not ctx.is_main or (not self.lines and self.progress is None):
            return
        due = self.interval_s if self.lines else self.refresh_s
        if time.perf_counter() - self._last >= due:
            control.request_log()

    def on_step_end(self, ctx, report, control) -> None:
        self._tokens += report.tokens
        self._time += report.step_time
        if self.progress is not None and not report.logged:
            self.progress.update(self.task, completed=report.step)
        if not ctx.is_main or not report.logged:
            return
        now = time.perf_counter()
        tps = self._tokens / max(1e-9, self._time)  # since the last read; validation not counted
        if self.lines:
            if report.done or now - self._last >= self.interval_s:
                self._last, self._tokens, self._time = now, 0, 0.0
                self.console.print(progress_line(
                    report.step, ctx.total_steps, report.loss, report.lr, tps,
                    (now - self._t0) / max(1, report.step - self._step0)),
                    markup=False, highlight=False, soft_wrap=True)
            return
        if self.progress is None:
            return
        self._last, self._tokens, self._time = now, 0, 0.0
        self.losses.append(report.loss)
        self.progress.update(self.task, completed=report.step, loss=f"{report.loss:.4f}",
                             spark=sparkline(self.losses, SPARK_STEPS), lr=f"{report.lr:.2e}",
                             tps=f"{tps:,.0f}")

    def on_epoch_end(self, ctx) -> None:
        self.on_epoch_begin(ctx)

    def on_train_end(self, ctx) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def progress_line(step: int, total: int, loss: float, lr: float, tokens_per_s: float,
                  s_per_step: float) -> str:
    """`step 120/696 (17%) · loss 2.3456 · lr 1.00e-03 · 1,234 tok/s · ETA 3m12s`."""
    eta = round(max(0, total - step) * s_per_step)
    h, m, sec = eta // 3600, eta // 60 % 60, eta % 60
    eta_text = f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"
    return (f"step {step}/{total} ({100 * step // max(1, total)}%) · loss {loss:.4f} · "
            f"lr {lr:.2e} · {tokens_per_s:,.0f} tok/s · ETA {eta_text}")
