"""Callback lifecycle (seeds/training.md "Callback Lifecycle"), plus `on_step_end`.

    on_train_begin
      on_epoch_begin
        on_batch_begin / on_batch_end           every micro-batch
        on_optimizer_step                        every window, before optimizer.step()
        on_step_end                              every window, after optimizer, scheduler
                                                 and the step counter advanced
      on_epoch_end
    on_error                                     an exception escaped the loop
    on_train_end                                 in `finally`, once on_train_begin completed

`on_step_end` is our addition: the seeds' loop only has hooks before the optimizer step, and
a checkpoint named step_N must hold the weights after step N (issue 4). Checkpoints and
metrics records are written there, so they see this step's weights, grad norm and lr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from astrai.train.context import TrainContext

HOOKS = (
    "on_train_begin", "on_epoch_begin", "on_batch_begin", "on_batch_end",
    "on_optimizer_step", "on_step_end", "on_epoch_end", "on_train_end",
)


class Callback:
    """Override the hooks you need; every hook receives the live TrainContext."""

    name = "callback"

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
    """Calls a hook on every callback, in registration order."""

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = list(callbacks)

    def __iter__(self):
        return iter(self.callbacks)

    def call(self, hook: str, ctx: TrainContext) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(ctx)

    def on_error(self, ctx: TrainContext, error: BaseException) -> None:
        # Every callback gets its chance (save the last good state, flush metrics) even if
        # an earlier one fails; the original error is what propagates.
        for cb in self.callbacks:
            try:
                cb.on_error(ctx, error)
            except Exception as e:  # noqa: BLE001 - reported, then the original re-raised
                ctx.errors.append(f"{cb.name}.on_error: {e}")
