"""Callbacks observe the training loop; the trainer (astrai.train.trainer) owns the step.

    on_train_begin(ctx)
      on_epoch_begin(ctx)
        on_batch_begin(ctx, micro)              every micro-batch, around its forward and
        on_batch_end(ctx, micro)                backward (micro: MicroBatch, its step, index
                                                in the window and the batch on its device)
        on_optimizer_step(ctx, control)         every step: the window's gradients are
                                                complete and clipped; before the step's
                                                figures are read and optimizer.step()
        on_step_end(ctx, report, control)       every step, after optimizer, scheduler and
                                                counters advanced and validation ran when
                                                due (report.evaluated); before the trainer
                                                writes a checkpoint of this step
      on_epoch_end(ctx)
    on_error(ctx, error)                         an exception escaped the loop
    on_train_end(ctx)                            in `finally`, once on_train_begin completed

`ctx` (TrainContext) is the run: its parts (model, executor, config, paths) and committed
counters (`ctx.state`), read-only to callbacks. `report` (StepReport, frozen) is the step as
host values; its device figures (loss, grad_norm, metrics, loss_units) are present only on
logged steps (`report.logged`), so a callback that only observes costs no device read.
`control` (StepControl) is all a callback may ask: `request_stop(reason)` (end the run at
this step boundary, with a checkpoint of it), `add_metric(name, value)` (a figure for this
step's record) and, in on_optimizer_step, `request_log()` (read this step's figures) or
`request_record()` (read them and write the step's record whatever the log interval).

Callbacks that write the step's record (`writes_record = True`: metrics JSONL and other
sinks) are called after all others at each hook, and their report holds every figure the
others added at that step, whatever the order of registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from astrai.train.context import TrainContext
    from astrai.train.report import MicroBatch, StepControl, StepReport

HOOKS = (
    "on_train_begin", "on_epoch_begin", "on_batch_begin", "on_batch_end",
    "on_optimizer_step", "on_step_end", "on_epoch_end", "on_train_end",
)


class Callback:
    """Override the hooks you need (signatures above)."""

    name = "callback"
    writes_record: ClassVar[bool] = False
    """True for record writers: called after the other callbacks at every hook."""

    def on_train_begin(self, ctx: TrainContext) -> None: ...
    def on_epoch_begin(self, ctx: TrainContext) -> None: ...
    def on_batch_begin(self, ctx: TrainContext, micro: MicroBatch) -> None: ...
    def on_batch_end(self, ctx: TrainContext, micro: MicroBatch) -> None: ...
    def on_optimizer_step(self, ctx: TrainContext, control: StepControl) -> None: ...
    def on_step_end(self, ctx: TrainContext, report: StepReport,
                    control: StepControl) -> None: ...
    def on_epoch_end(self, ctx: TrainContext) -> None: ...
    def on_error(self, ctx: TrainContext, error: BaseException) -> None: ...
    def on_train_end(self, ctx: TrainContext) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class CallbackList:
    """Calls a hook on every callback: observers first, then record writers."""

    def __init__(self, callbacks: list[Callback]) -> None:
        cbs = list(callbacks)
        self.observers = [c for c in cbs if not getattr(c, "writes_record", False)]
        self.writers = [c for c in cbs if getattr(c, "writes_record", False)]
        self.callbacks = self.observers + self.writers

    def __iter__(self):
        return iter(self.callbacks)

    def call(self, hook: str, ctx: TrainContext, *args: Any) -> None:
        # The writers run even when an observer raises: the step is committed (and will be
        # the checkpoint of the last good state), so its record must not go missing.
        try:
            for cb in self.observers:
                getattr(cb, hook)(ctx, *args)
        finally:
            for cb in self.writers:
                getattr(cb, hook)(ctx, *args)

    def step_end(self, ctx: TrainContext, report: StepReport, control: StepControl) -> None:
        """on_step_end: the writers' report holds the figures the observers added."""
        try:
            for cb in self.observers:
                cb.on_step_end(ctx, report, control)
        finally:
            full = report.with_metrics(control.added)
            for cb in self.writers:
                cb.on_step_end(ctx, full, control)

    def on_error(self, ctx: TrainContext, error: BaseException) -> None:
        # Every callback gets its chance (flush metrics) even if an earlier one fails; the
        # original error is what propagates.
        for cb in self.callbacks:
            try:
                cb.on_error(ctx, error)
            except Exception as e:  # noqa: BLE001 - reported, then the original re-raised
                ctx.errors.append(f"{cb.name}.on_error: {e}")
