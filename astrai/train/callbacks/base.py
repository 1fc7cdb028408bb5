"""Callbacks observe the training loop; the trainer (astrai.train.trainer) owns the step.

    on_train_begin
      on_epoch_begin
        on_batch_begin / on_batch_end           every micro-batch, around its forward and
                                                backward (ctx.batch, ctx.loss, ctx.metrics)
        on_optimizer_step                       every step: the window's gradients are
                                                complete and clipped (ctx.grad_norm is the
                                                pre-clip norm); before optimizer.step()
        on_step_end                             every step, after optimizer, scheduler and
                                                counters advanced and validation ran when
                                                due (ctx.evaluated); before the trainer
                                                writes a checkpoint of this step
      on_epoch_end
    on_error                                     an exception escaped the loop
    on_train_end                                 in `finally`, once on_train_begin completed

A callback reads the context and writes its own outputs (a file, a bar, a sink); it may add
figures to `ctx.step_metrics` and may set `ctx.stop_reason` to end the run at this step
boundary. Callbacks that write the step's record (`writes_record = True`: metrics JSONL and
other sinks) are called after all others at each hook, so they see every figure added to
that step, whatever the order of registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from astrai.train.context import TrainContext

HOOKS = (
    "on_train_begin", "on_epoch_begin", "on_batch_begin", "on_batch_end",
    "on_optimizer_step", "on_step_end", "on_epoch_end", "on_train_end",
)


class Callback:
    """Override the hooks you need; every hook receives the live TrainContext."""

    name = "callback"
    writes_record: ClassVar[bool] = False
    """True for record writers: called after the other callbacks at every hook."""

    def on_train_begin(self, ctx: TrainContext) -> None: ...
    def on_epoch_begin(self, ctx: TrainContext) -> None: ...
    def on_batch_begin(self, ctx: TrainContext) -> None: ...
    def on_batch_end(self, ctx: TrainContext) -> None: ...
    def on_optimizer_step(self, ctx: TrainContext) -> None: ...
    def on_step_end(self, ctx: TrainContext) -> None: ...
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

    def call(self, hook: str, ctx: TrainContext) -> None:
        # The writers run even when an observer raises: the step is committed (and will be
        # the checkpoint of the last good state), so its record must not go missing.
        try:
            for cb in self.observers:
                getattr(cb, hook)(ctx)
        finally:
            for cb in self.writers:
                getattr(cb, hook)(ctx)

    def on_error(self, ctx: TrainContext, error: BaseException) -> None:
        # Every callback gets its chance (flush metrics) even if an earlier one fails; the
        # original error is what propagates.
        for cb in self.callbacks:
            try:
                cb.on_error(ctx, error)
            except Exception as e:  # noqa: BLE001 - reported, then the original re-raised
                ctx.errors.append(f"{cb.name}.on_error: {e}")
