"""Progress bar (rich) on stderr: step, loss with a sparkline of the recent losses, lr,
tokens/s, ETA. Only on a terminal."""

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

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress: Progress | None = None
        self.task = None
        self._last = 0.0
        self.losses: deque[float] = deque(maxlen=SPARK_STEPS)

    def on_train_begin(self, ctx) -> None:
        if not (ctx.is_main and self.console.is_terminal):
            return  # quiet when not a TTY (logs, CI, pipes)
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
        self._last = time.perf_counter()

    def on_epoch_begin(self, ctx) -> None:
        if self.progress is not None:
            self.progress.update(self.task, epoch=ctx.state.epoch)

    def on_step_end(self, ctx) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        tps = ctx.window_tokens / max(1e-9, now - ctx.window_start)
        self.losses.append(ctx.step_loss)
        self.progress.update(self.task, completed=ctx.state.step, loss=f"{ctx.step_loss:.4f}",
                             spark=sparkline(self.losses, SPARK_STEPS), lr=f"{ctx.lr:.2e}",
                             tps=f"{tps:,.0f}")

    def on_epoch_end(self, ctx) -> None:
        self.on_epoch_begin(ctx)

    def on_train_end(self, ctx) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
