"""TensorBoard event files beside metrics.jsonl, holding exactly its scalars (`--tensorboard`).

An observer of the metrics callback: it writes each record the metrics callback logged,
every scalar under its metrics.jsonl key (loss, lr, val_bpb, ...) at the record's step, so
`tensorboard --logdir RUN_DIR` shows the same numbers (as TensorBoard's float32). It reads
the records that callback kept, so where it sits in the callback list does not matter: what
it has not written at a step end it writes at the next one, or when training ends.

On resume the event files are written afresh from metrics.jsonl (already cut back to the
checkpoint's step), so the steps of an interrupted attempt never linger and a run that
turns --tensorboard on late still gets its whole history. Wall times of replayed records
follow elapsed_s, the training time the run has spent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from astrai.errors import MissingExtraError
from astrai.train.callbacks.base import Callback
from astrai.train.callbacks.metrics import MetricsCallback

TB_INSTALL = "pip install 'astrai[tensorboard]'"
EVENTS_GLOB = "events.out.tfevents.*"


def require_tensorboard() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        raise MissingExtraError(f"--tensorboard needs the tensorboard package, which is "
                          f"not installed: {TB_INSTALL}")


def record_scalars(rec: dict[str, Any]) -> dict[str, float]:
    """Every scalar of a metrics.jsonl record but its step (booleans as 0/1, 'nan'/'inf'
    strings as floats)."""
    from astrai.viz.metrics import scalar

    out = {}
    for k, v in rec.items():
        x = scalar(v)
        if k != "step" and x is not None:
            out[k] = x
    return out


class TensorBoardCallback(Callback):
    name = "tensorboard"

    def __init__(self, metrics: MetricsCallback) -> None:
        self.metrics = metrics
        self.writer = None
        self._done = 0  # metrics.records already written

    def on_train_begin(self, ctx) -> None:
        if not ctx.is_main:
            return
        from torch.utils.tensorboard import SummaryWriter

        from astrai.viz.metrics import read_metrics

        run_dir: Path = ctx.paths.run_dir
        old = sorted(run_dir.glob(EVENTS_GLOB))
        # The metrics callback may not have cut metrics.jsonl back yet: cut here too.
        history = [r for r in (read_metrics(run_dir) if ctx.paths.metrics.is_file() else [])
                   if r["step"] <= ctx.state.step]
        self.writer = SummaryWriter(log_dir=str(run_dir), flush_secs=30)
        if history:
            now, last = time.time(), float(history[-1].get("elapsed_s", 0.0))
            for rec in history:
                wall = now - (last - float(rec.get("elapsed_s", last)))
                self._add(rec, wall)
            self.writer.flush()
        for f in old:  # only now: a crash above leaves the old files, never none
            f.unlink(missing_ok=True)
        self._done = len(self.metrics.records)

    def _add(self, rec: dict[str, Any], walltime: float | None = None) -> None:
        for key, value in record_scalars(rec).items():
            self.writer.add_scalar(key, value, rec["step"], walltime=walltime)

    def _drain(self) -> None:
        if self.writer is None:
            return
        for rec in self.metrics.records[self._done:]:
            self._add(rec)
        if len(self.metrics.records) > self._done:
            self._done = len(self.metrics.records)
            self.writer.flush()

    def on_step_end(self, ctx, report, control) -> None:
        self._drain()

    def _close(self) -> None:
        self._drain()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def on_error(self, ctx, error: BaseException) -> None:
        self._close()

    def on_train_end(self, ctx) -> None:
        self._close()
