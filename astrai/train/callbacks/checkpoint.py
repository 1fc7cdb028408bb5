"""Checkpoint callback: every `interval` optimizer steps, at the end, and on error.

Saves run at on_step_end, after optimizer.step(), scheduler.step() and the step counter:
checkpoints/step_N holds the weights after step N and the state to take step N + 1.
On an error it saves the last good state (the committed boundary state) unless the
weights might be half-updated (an error inside optimizer.step()).
"""

from __future__ import annotations

from pathlib import Path

from astrai.train.callbacks.base import Callback
from astrai.train.checkpointing import save_training_checkpoint


class CheckpointCallback(Callback):
    name = "checkpoint"

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.last_saved: int | None = None
        self.saved: list[Path] = []

    def on_train_begin(self, ctx) -> None:
        # A resumed run starts from a checkpoint of this very step: do not write it again.
        self.last_saved = ctx.state.step if ctx.state.step > 0 else None

    def _save(self, ctx) -> None:
        path = save_training_checkpoint(ctx, ctx.callbacks)
        self.last_saved = ctx.state.step
        if path is not None:
            self.saved.append(path)

    def on_step_end(self, ctx) -> None:
        if ctx.done or (self.interval and ctx.state.step % self.interval == 0):
            self._save(ctx)

    def on_error(self, ctx, error: BaseException) -> None:
        if ctx.in_update or ctx.state.step == 0 or ctx.state.step == self.last_saved:
            return
        self._save(ctx)

    def on_train_end(self, ctx) -> None:
        if ctx.completed and self.last_saved != ctx.state.step:
            self._save(ctx)
