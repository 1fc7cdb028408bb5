"""The training loop (seeds/internals.md "Training Loop Internals"), with two precisions:

* The loss of every micro-batch is normalised by the number of loss units (tokens) in the
  whole accumulation window, not by grad_accum_steps, so a window of micro-batches gives the
  gradient of one big batch even when micro-batches carry different numbers of loss tokens.
  The trainer therefore reads a window ahead: it fetches the window's micro-batches, counts
  their units, then runs forward/backward on each.
* An epoch holds `windows_per_epoch` = (this rank's batches // grad_accum_steps) windows
  (seeds' total-steps formula); the leftover micro-batches of an epoch are never run, and
  the window state is reset at every epoch end, so nothing leaks into the next epoch.

Per micro-batch: on_batch_begin → strategy → backward → on_batch_end. Per window, after its
last micro-batch: on_optimizer_step (clipping) → finiteness check → optimizer.step() →
strategy.on_optimizer_step() → zero_grad → scheduler.step() → commit the step → on_step_end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader

from astrai.errors import AstraiError
from astrai.train.callbacks.base import Callback, CallbackList
from astrai.train.context import TrainContext, rng_state


class NonFiniteError(AstraiError):
    """The loss or a gradient became NaN/inf; the message names the step and parameter."""


class Trainer:
    def __init__(self, ctx: TrainContext, callbacks: list[Callback]) -> None:
        self.ctx = ctx
        ctx.callbacks = list(callbacks)
        self.callbacks = CallbackList(ctx.callbacks)

    # -- the run ------------------------------------------------------------------------------
    def train(self) -> TrainContext:
        ctx, cbs = self.ctx, self.callbacks
        if ctx.boundary_rng is None:
            ctx.boundary_rng = rng_state()
        cbs.call("on_train_begin", ctx)
        try:
            ctx.model.train()
            while not ctx.done and ctx.stop_reason is None:
                self._run_epoch()
            ctx.completed = ctx.stop_reason is None
        except BaseException as e:
            cbs.on_error(ctx, e)
            raise
        finally:
            cbs.call("on_train_end", ctx)
        return ctx

    def _run_epoch(self) -> None:
        ctx, cbs, s = self.ctx, self.callbacks, self.ctx.state
        accum = ctx.executor.grad_accum_steps
        if s.epoch_batches // accum < ctx.windows_per_epoch:
            ctx.sampler.set_epoch(s.epoch)
            cbs.call("on_epoch_begin", ctx)
            for window in self._windows():
                self._run_window(window)
                if ctx.done or ctx.stop_reason is not None:
                    break
        if s.epoch_batches // accum >= ctx.windows_per_epoch:
            # Epoch end: drop any partial window so it never leaks into the next epoch.
            ctx.executor.gradient_state.reset()
            ctx.optimizer.force_zero_grad()
            cbs.call("on_epoch_end", ctx)
            s.epoch += 1
            s.epoch_batches = 0

    # -- data -------------------------------------------------------------------------------------
    def _loader(self) -> DataLoader:
        """This epoch's micro-batches, drawn lazily from the sampler, which resumes at its own
        position (RDSampler: exactly the next sample after the last committed step)."""
        ctx = self.ctx
        # A dedicated generator: creating the iterator never draws from the global RNG.
        gen = torch.Generator().manual_seed(ctx.config.seed + ctx.state.epoch)
        return DataLoader(
            ctx.train_data, batch_sampler=BatchSampler(ctx.sampler, ctx.config.batch_size, False),
            collate_fn=ctx.collate_fn, num_workers=ctx.config.num_workers, generator=gen,
            pin_memory=ctx.executor.device.type == "cuda",
        )

    def _windows(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        ctx = self.ctx
        accum = ctx.executor.grad_accum_steps
        remaining = ctx.windows_per_epoch - ctx.state.epoch_batches // accum
        it = iter(self._loader())
        for _ in range(remaining):
            ctx.window_start = time.perf_counter()
            window = []
            for _ in range(accum):
                batch = next(it, None)
                if batch is None:
                    return
                window.append(batch)
            yield window

    # -- one optimizer step ------------------------------------------------------------------------
    def _run_window(self, window: list[dict[str, torch.Tensor]]) -> None:
        ctx, cbs, ex, strategy = self.ctx, self.callbacks, self.ctx.executor, self.ctx.strategy
        units = [strategy.loss_units(b) for b in window]
        ctx.window_units = sum(units)
        ctx.normalizer = ex.window_normalizer(ctx.window_units)
        ctx.window_batches = ctx.window_samples = ctx.window_tokens = 0
        loss_sum, metric_sums = 0.0, {}
        for batch, n in zip(window, units):
            batch = strategy.to_device(batch)
            ctx.batch = batch
            with ex.accumulate(ctx.model):
                cbs.call("on_batch_begin", ctx)
                with ex.autocast():
                    out = strategy(batch, ctx.normalizer)
                ctx.loss = float(out["loss"].detach())
                ctx.metrics = out["metrics"]
                ex.backward(out["loss"])
                B = strategy.batch_samples(batch)
                ctx.window_batches += 1
                ctx.window_samples += B * ex.world_size
                ctx.window_tokens += strategy.batch_tokens(batch) * ex.world_size
                loss_sum += ctx.loss
                for k, v in ctx.metrics.items():
                    metric_sums[k] = metric_sums.get(k, 0.0) + v * n
                cbs.call("on_batch_end", ctx)
                if ex.sync_gradients:
                    ctx.step_loss = ex.all_reduce_sum(loss_sum) / ex.world_size
                    ctx.step_metrics = {k: v / max(1, ctx.window_units)
                                        for k, v in metric_sums.items()}
                    self._optimizer_step()

    def _optimizer_step(self) -> None:
        ctx, cbs, s = self.ctx, self.callbacks, self.ctx.state
        ctx.lr = float(ctx.scheduler.get_last_lr()[0])
        cbs.call("on_optimizer_step", ctx)
        ctx.skip_step = self._nonfinite_skip()
        ctx.in_update = True
        if not ctx.skip_step:
            ctx.optimizer.step()
            ctx.strategy.on_optimizer_step()
        ctx.optimizer.zero_grad()
        ctx.scheduler.step()
        ctx.in_update = False
        # Commit: the state a checkpoint of this step stores.
        s.step += 1
        s.epoch_batches += ctx.window_batches
        s.consumed_samples += ctx.window_samples
        s.consumed_tokens += ctx.window_tokens
        s.skipped_steps += int(ctx.skip_step)
        ctx.window_samples = 0
        ctx.boundary_rng = rng_state()
        ctx.boundary_sampler = sampler_state(ctx)
        cbs.call("on_step_end", ctx)

    def _nonfinite_skip(self) -> bool:
        """False when loss and gradient norm are finite; True to skip this step (allowed by
        --skip-nonfinite); otherwise NonFiniteError. Runs before optimizer.step(), so
        nothing non-finite reaches the weights or a checkpoint."""
        ctx = self.ctx
        norm_ok = ctx.grad_norm is None or math.isfinite(ctx.grad_norm)
        if math.isfinite(ctx.step_loss) and norm_ok:
            return False
        step = ctx.state.step + 1
        bad = first_nonfinite_grad(ctx.executor.unwrap(ctx.model))
        what = f"first non-finite gradient in `{bad}`" if bad else "all gradients finite"
        msg = f"step {step}: non-finite loss {ctx.step_loss} / grad norm {ctx.grad_norm} ({what})"
        if ctx.state.skipped_steps < ctx.config.skip_nonfinite:
            ctx.errors.append(f"skipped {msg}")
            return True
        raise NonFiniteError(
            f"{msg}; nothing was saved from this step. Lower --max-lr, check the data, or "
            "pass --skip-nonfinite N to skip such steps"
        )


def sampler_state(ctx: TrainContext) -> dict | None:
    """The sampler's position at the committed boundary: this rank has used
    epoch_batches * batch_size samples of epoch `state.epoch` (a prefetching loader may have
    drawn more indices; those are not consumed)."""
    if not hasattr(ctx.sampler, "state_dict"):
        return None
    state = ctx.sampler.state_dict(consumed=ctx.state.epoch_batches * ctx.config.batch_size)
    state["epoch"] = ctx.state.epoch
    return state


def first_nonfinite_grad(model: torch.nn.Module) -> str | None:
    for name, p in model.named_parameters():
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return None
