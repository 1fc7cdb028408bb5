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

Callbacks only observe (astrai.train.callbacks.base lists when each hook runs): they get the
run's parts, the micro-batch, and a frozen StepReport of each committed step, and may only
ask for a stop, a log read, or add figures (astrai.train.report.StepControl). The trainer
decides everything a step computes and when validation and checkpoints happen, so the order
in which callbacks are registered does not matter.

The step's figures stay on the device (astrai.train.step_sums) and are read on the host
only on logged steps; other steps read one boolean, the fused finite check.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import torch
from torch.utils.data import BatchSampler, DataLoader

from astrai.errors import AstraiError
from astrai.train import dcp_checkpoint
from astrai.train.callbacks.base import Callback, CallbackList
from astrai.train.checkpointing import save_training_checkpoint
from astrai.train.context import TrainContext, rng_state
from astrai.train.evaluate import evaluate
from astrai.train.report import MicroBatch, StepControl, StepReport
from astrai.train.step_sums import HostFigures, StepFigures, StepSums, read_figures

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
        self.pending: dcp_checkpoint.PendingSave | None = None
        """A DCP save still being written in the background (--async-checkpoint)."""
        self.format = ctx.config.checkpoint.resolved_format(ctx.config.runtime.parallel)
        self._updating = False  # inside optimizer.step(): the weights may be half-updated
        self._window_start = 0.0  # perf_counter() when the current window began
        self._samples = self._tokens = self._batches = 0  # the current window's counts

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
            self.wait_for_save()
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
        """One optimizer step. Its figures stay on the device; the host reads them once, on
        logged steps, and otherwise reads only the fused finite check (docs/train.md "Host
        reads")."""
        ctx, cbs, ex, cfg = self.ctx, self.callbacks, self.ctx.executor, self.ctx.config
        step = ctx.state.step + 1
        sums = self._run_window(window, step)
        figures = sums.reduce(ex)  # one all-reduce of the stacked sums
        lr = float(ctx.scheduler.get_last_lr()[0])
        grad_norm = ex.clip_grad_norm(cfg.optimizer.max_grad_norm)
        control = StepControl()
        cbs.call("on_optimizer_step", ctx, control)
        logged = control.log_requested or self._log_due(step)
        host = read_figures(figures, grad_norm) if logged else None
        finite = host.finite if host is not None else figures.finite(grad_norm)
        skip = not finite and self._nonfinite_skip(figures, grad_norm)
        if not skip:
            self._updating = True
            ctx.optimizer.step()
            self._updating = False
            ctx.strategy.on_optimizer_step()
        ctx.optimizer.zero_grad(set_to_none=True)
        ctx.scheduler.step()
        step_time = self._commit(skip)
        evaluated = ctx.eval_data is not None and self._due(cfg.eval.interval)
        if evaluated:
            ctx.last_eval = evaluate(ctx, cfg.eval.max_batches)
        report = self._report(lr, step_time, skip, host, evaluated, control)
        ctx.last_report = report
        cbs.step_end(ctx, report, control)
        if control.stop_reason is not None:
            ctx.stop_reason = control.stop_reason
        due = self._due(cfg.checkpoint.interval) or ctx.stop_reason is not None
        if due and self.last_saved != ctx.state.step:
            self.save()
        elif self.pending is not None:
            self._saved(dcp_checkpoint.poll(ctx, self.pending))

    def _run_window(self, window: list[Batch], step: int) -> StepSums:
        """Forward and backward of every micro-batch; the window's sums, on the device."""
        ctx, cbs, ex, strategy = self.ctx, self.callbacks, self.ctx.executor, self.ctx.strategy
        # Counted on the host-side batches (shapes, or tensors never read), before any copy.
        sums = StepSums([strategy.loss_units(b) for b in window], ex.device)
        normalizer = ex.window_normalizer(sums.total_units)  # global over ranks
        self._samples = sum(strategy.batch_samples(b) for b in window) * ex.dp_size
        self._tokens = sum(strategy.batch_tokens(b) for b in window) * ex.dp_size
        for i, batch in enumerate(window):
            micro = MicroBatch(step=step, index=i, batch=strategy.to_device(batch))
            cbs.call("on_batch_begin", ctx, micro)
            with ex.grad_sync(ctx.model, sync=i == len(window) - 1):
                with ex.autocast():
                    out = strategy(micro.batch, normalizer)
                ex.backward(out["loss"])
            sums.add(i, out["loss"], out["metrics"])
            cbs.call("on_batch_end", ctx, micro)
        self._batches = len(window)
        return sums

    def _report(self, lr: float, step_time: float, skip: bool, host: HostFigures | None,
                evaluated: bool, control: StepControl) -> StepReport:
        s = self.ctx.state
        report = StepReport(
            step=s.step, epoch=s.epoch, lr=lr, step_time=step_time, tokens=self._tokens,
            samples=self._samples, skipped=skip, done=self.ctx.done, logged=host is not None,
            evaluated=evaluated, eval=MappingProxyType(dict(self.ctx.last_eval)))
        if host is not None:
            self.ctx.last_loss = host.loss
            report = replace(report, loss=host.loss, grad_norm=host.grad_norm,
                             loss_units=host.units, metrics=MappingProxyType(host.metrics))
        return report.with_metrics(control.added)

    def _log_due(self, step: int) -> bool:
        """Whether step `step` (not yet committed) reads its figures: every log_interval
        steps, at the last step, and when it validates."""
        cfg = self.ctx.config
        evaluates = self.ctx.eval_data is not None and self._due(cfg.eval.interval, step)
        return step % cfg.logging.log_interval == 0 or step >= self.ctx.total_steps or evaluates

    def _due(self, interval: int, step: int | None = None) -> bool:
        """At the last step, and every `interval` steps (0 = only at the last)."""
        step = self.ctx.state.step if step is None else step
        return step >= self.ctx.total_steps or (interval > 0 and step % interval == 0)

    def _commit(self, skip: bool) -> float:
        """Advance the committed state: what a checkpoint of this step stores. Returns the
        step's time."""
        ctx, s = self.ctx, self.ctx.state
        step_time = time.perf_counter() - self._window_start
        s.step += 1
        s.epoch_batches += self._batches
        s.consumed_samples += self._samples
        s.consumed_tokens += self._tokens
        s.skipped_steps += int(skip)
        ctx.boundary_rng = rng_state()
        ctx.boundary_sampler = sampler_state(ctx)
        return step_time

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self) -> None:
        """checkpoints/step_N of the committed state (collective: every rank calls it). A
        DCP save first waits for the previous one; an async one returns while it writes."""
        if self.format == "dcp":
            self.wait_for_save()
            self.pending = dcp_checkpoint.begin(self.ctx, list(self.callbacks),
                                                self.ctx.config.checkpoint.async_save)
            if self.pending.committed:
                self._saved(self.pending.final)
        else:
            self._saved(save_training_checkpoint(self.ctx, list(self.callbacks)))
        self.last_saved = self.ctx.state.step

    def wait_for_save(self) -> None:
        """Block until the DCP save in flight is written and (rank 0) renamed into place."""
        pending, self.pending = self.pending, None
        if pending is not None:
            committed = pending.committed
            path = dcp_checkpoint.finish(self.ctx, pending)
            if not committed:
                self._saved(path)

    def _saved(self, path: Path | None) -> None:
        if path is not None and path not in self.saved:
            self.saved.append(path)

    def _save_last_good(self, error: BaseException) -> None:
        """After an error: save the committed state unless the weights may be half-updated
        (an error inside optimizer.step()) or it is saved already."""
        ctx = self.ctx
        try:  # the save in flight is complete state: let it finish and appear
            self.wait_for_save()
        except Exception as e:  # noqa: BLE001 - reported; the original error propagates
            ctx.errors.append(f"checkpoint in flight after {type(error).__name__}: {e}")
        if self._updating or ctx.state.step == 0 or ctx.state.step == self.last_saved:
            return
        try:
            self.save()
            self.wait_for_save()
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
            self._window_start = time.perf_counter()
            window = []
            for _ in range(accum):
                batch = next(it, None)
                if batch is None:
                    return
                window.append(batch)
            yield window

    # -- the finite check -----------------------------------------------------------------------
    def _nonfinite_skip(self, figures: StepFigures, grad_norm: torch.Tensor) -> bool:
        """The loss or gradient norm is not finite: True to skip this step (allowed by
        --skip-nonfinite); otherwise NonFiniteError. Runs before optimizer.step(), so
        nothing non-finite reaches the weights or a checkpoint."""
        ctx = self.ctx
        step = ctx.state.step + 1
        bad = first_nonfinite_grad(ctx.executor.unwrap(ctx.model))
        what = f"first non-finite gradient in `{bad}`" if bad else "all gradients finite"
        msg = (f"step {step}: non-finite loss {float(figures.loss)} / grad norm "
               f"{float(grad_norm)} ({what})")
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
