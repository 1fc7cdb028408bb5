"""The training loop. `Trainer.step` is one optimizer step, written out in one place as
nanoGPT's train.py writes it:

    micro-batches of the window (no_sync on all but the last) -> clip -> finite check
    -> optimizer step -> schedule -> zero grads -> commit -> eval and checkpoint at their
    intervals

Two precisions:

* The loss of every micro-batch is normalised by the number of loss units (tokens) in the
  whole accumulation window, not by grad_accum_steps, so a window of micro-batches gives the
  gradient of one big batch even when micro-batches carry different numbers of loss tokens.
  The trainer therefore reads a window ahead: it fetches the window's micro-batches, counts
  their units, then runs forward/backward on each.
* An epoch holds `windows_per_epoch` = (this rank's batches // grad_accum_steps) windows;
  the leftover micro-batches of an epoch are never read into a window, so nothing of them
  reaches a gradient.

Callbacks only observe (astrai.train.callbacks.base lists when each hook runs); the trainer
decides everything a step computes and when validation and checkpoints happen, so the order
in which callbacks are registered does not matter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import BatchSampler, DataLoader

from astrai.errors import AstraiError
from astrai.train.callbacks.base import Callback, CallbackList
from astrai.train.checkpointing import save_training_checkpoint
from astrai.train.context import TrainContext, rng_state
from astrai.train.evaluate import evaluate

Batch = dict[str, torch.Tensor]


class NonFiniteError(AstraiError):
    """The loss or a gradient became NaN/inf; the message names the step and parameter."""


class Trainer:
    def __init__(self, ctx: TrainContext, callbacks: list[Callback]) -> None:
        self.ctx = ctx
        self.callbacks = CallbackList(callbacks)
        self.last_saved: int | None = ctx.state.step if ctx.state.step > 0 else None
        """Step of the newest checkpoint this run has (a resumed run starts from one)."""
        self.saved: list[Path] = []
        self._updating = False  # inside optimizer.step(): the weights may be half-updated

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
            if ctx.completed and self.last_saved != ctx.state.step:
                self.save()
        except BaseException as e:
            cbs.on_error(ctx, e)
            self._save_last_good(e)
            raise
        finally:
            cbs.call("on_train_end", ctx)
        return ctx

    def _run_epoch(self) -> None:
        ctx, s = self.ctx, self.ctx.state
        accum = ctx.config.grad_accum_steps
        if s.epoch_batches // accum < ctx.windows_per_epoch:
            ctx.sampler.set_epoch(s.epoch)
            self.callbacks.call("on_epoch_begin", ctx)
            for window in self._windows():
                self.step(window)
                if ctx.done or ctx.stop_reason is not None:
                    break
        if s.epoch_batches // accum >= ctx.windows_per_epoch:
            self.callbacks.call("on_epoch_end", ctx)
            s.epoch += 1
            s.epoch_batches = 0

    # -- one optimizer step --------------------------------------------------------------------
    def step(self, window: list[Batch]) -> None:
        ctx, cbs, ex, strategy, cfg = (self.ctx, self.callbacks, self.ctx.executor,
                                       self.ctx.strategy, self.ctx.config)
        units = [strategy.loss_units(b) for b in window]
        normalizer = ex.window_normalizer(sum(units))
        ctx.window_units, ctx.window_batches, ctx.window_tokens = sum(units), 0, 0
        samples, loss_sum, metric_sums = 0, 0.0, {}
        for i, (batch, n) in enumerate(zip(window, units)):
            ctx.batch = batch = strategy.to_device(batch)
            cbs.call("on_batch_begin", ctx)
            with ex.grad_sync(ctx.model, sync=i == len(window) - 1):
                with ex.autocast():
                    out = strategy(batch, normalizer)
                ex.backward(out["loss"])
            ctx.loss, ctx.metrics = float(out["loss"].detach()), out["metrics"]
            ctx.window_batches += 1
            samples += strategy.batch_samples(batch) * ex.world_size
            ctx.window_tokens += strategy.batch_tokens(batch) * ex.world_size
            loss_sum += ctx.loss
            for k, v in ctx.metrics.items():
                metric_sums[k] = metric_sums.get(k, 0.0) + v * n
            cbs.call("on_batch_end", ctx)
        ctx.step_loss = ex.all_reduce_sum(loss_sum) / ex.world_size
        ctx.step_metrics = {k: v / max(1, ctx.window_units) for k, v in metric_sums.items()}
        ctx.lr = float(ctx.scheduler.get_last_lr()[0])
        ctx.grad_norm = float(ex.clip_grad_norm(cfg.optimizer.max_grad_norm))
        cbs.call("on_optimizer_step", ctx)
        ctx.skip_step = self._nonfinite_skip()
        if not ctx.skip_step:
            self._updating = True
            ctx.optimizer.step()
            self._updating = False
            strategy.on_optimizer_step()
        ctx.optimizer.zero_grad(set_to_none=True)
        ctx.scheduler.step()
        self._commit(samples)
        ctx.evaluated = ctx.eval_data is not None and self._due(cfg.eval.interval)
        if ctx.evaluated:
            ctx.last_eval = evaluate(ctx, cfg.eval.max_batches)
        cbs.call("on_step_end", ctx)
        due = self._due(cfg.checkpoint.interval) or ctx.stop_reason is not None
        if due and self.last_saved != ctx.state.step:
            self.save()

    def _due(self, interval: int) -> bool:
        """At the last step, and every `interval` steps (0 = only at the last)."""
        step = self.ctx.state.step
        return self.ctx.done or (interval > 0 and step % interval == 0)

    def _commit(self, samples: int) -> None:
        """Advance the committed state: what a checkpoint of this step stores."""
        ctx, s = self.ctx, self.ctx.state
        ctx.step_time = time.perf_counter() - ctx.window_start
        s.step += 1
        s.epoch_batches += ctx.window_batches
        s.consumed_samples += samples
        s.consumed_tokens += ctx.window_tokens
        s.skipped_steps += int(ctx.skip_step)
        ctx.boundary_rng = rng_state()
        ctx.boundary_sampler = sampler_state(ctx)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self) -> None:
        """checkpoints/step_N of the committed state (collective: every rank calls it)."""
        path = save_training_checkpoint(self.ctx, list(self.callbacks))
        self.last_saved = self.ctx.state.step
        if path is not None:
            self.saved.append(path)

    def _save_last_good(self, error: BaseException) -> None:
        """After an error: save the committed state unless the weights may be half-updated
        (an error inside optimizer.step()) or it is saved already."""
        ctx = self.ctx
        if self._updating or ctx.state.step == 0 or ctx.state.step == self.last_saved:
            return
        try:
            self.save()
        except Exception as e:  # noqa: BLE001 - reported; the original error propagates
            ctx.errors.append(f"checkpoint after {type(error).__name__}: {e}")

    # -- data -------------------------------------------------------------------------------------
    def _loader(self) -> DataLoader:
        """This epoch's micro-batches, drawn lazily from the sampler, which resumes at its own
        position (RDSampler: exactly the next sample after the last committed step)."""
        ctx = self.ctx
        # A dedicated generator: creating the iterator never draws from the global RNG.
        gen = torch.Generator().manual_seed(ctx.config.seed + ctx.state.epoch)
        return DataLoader(
            ctx.train_data, batch_sampler=BatchSampler(ctx.sampler, ctx.config.batch_size, False),
            collate_fn=ctx.collate_fn, num_workers=ctx.config.runtime.num_workers, generator=gen,
            pin_memory=ctx.executor.device.type == "cuda",
        )

    def _windows(self) -> Iterator[list[Batch]]:
        ctx = self.ctx
        accum = ctx.config.grad_accum_steps
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

    # -- the finite check -----------------------------------------------------------------------
    def _nonfinite_skip(self) -> bool:
        """False when loss and gradient norm are finite; True to skip this step (allowed by
        --skip-nonfinite); otherwise NonFiniteError. Runs before optimizer.step(), so
        nothing non-finite reaches the weights or a checkpoint."""
        ctx = self.ctx
        if math.isfinite(ctx.step_loss) and math.isfinite(ctx.grad_norm):
            return False
        step = ctx.state.step + 1
        bad = first_nonfinite_grad(ctx.executor.unwrap(ctx.model))
        what = f"first non-finite gradient in `{bad}`" if bad else "all gradients finite"
        msg = f"step {step}: non-finite loss {ctx.step_loss} / grad norm {ctx.grad_norm} ({what})"
        if ctx.state.skipped_steps < ctx.config.optimizer.skip_nonfinite:
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
