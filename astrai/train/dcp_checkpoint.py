"""DCP training checkpoints: every rank writes its own shards, nothing is gathered.

    RUN/checkpoints/step_N/            as a full checkpoint, but with dcp/ for the weights
        config.json meta.json tokenizer*   and optimizer state (rank 0 writes these small
        scheduler.pt trainer_state.pt      files; astrai.model.dcp_format describes dcp/)
        .astrai-checkpoint
        dcp/.metadata dcp/__R_0.distcp

The state is `torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)`:
under FSDP2 each rank's DTensor shards, under DDP the replicas (DCP's planner writes each
replicated tensor once, spread over the ranks), keyed by parameter name whatever the
wrapper. Loading asks each rank's own model and optimizer for the same structure
(`get_state_dict`) and lets `dcp.load` fill it from whichever files hold each piece, so a
checkpoint written by N processes under one executor loads into M processes under another
(the resharding torchtitan relies on).

Atomic like a full checkpoint: every rank writes into the sibling `.step_N.tmp-dcp`, and
rank 0 renames it to `step_N` only once DCP's save has completed — DCP's coordinator
writes `.metadata` only after every rank reported its data written, so when rank 0's save
returns, all shards are on disk. A kill at any moment leaves the older `step_N` directories
as they were and a `.step_N.tmp-dcp` that the next save (or resume) deletes.

Asynchronous saves (`--async-checkpoint`) use `dcp.async_save`: the state is first copied
to host memory (so the next optimizer steps cannot change what is written), then written
by a background thread over a separate gloo group (the training collectives keep the
default group to themselves). The run waits for the previous save before the next one and
at the end; rank 0 renames a finished save into place as soon as it sees it done.
"""

from __future__ import annotations

import shutil
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from astrai.atomic import replace_dir
from astrai.errors import CheckpointError
from astrai.model.checkpoint import write_checkpoint_files
from astrai.model.dcp_format import DCP_DIR, SafeReader, alone
from astrai.train.bf16_update import rounding_states
from astrai.train.checkpoint_errors import (
    damaged_hint,
    disk_full_message,
    is_disk_full,
    load_failure,
)
from astrai.train.checkpointing import (
    MARKER,
    checkpoint_meta,
    list_checkpoints,
    older_checkpoint,
    prune,
    refuse_users_dir,
    step_dir_name,
    trainer_state_payload,
    write_pointer,
)

if TYPE_CHECKING:
    from astrai.train.context import TrainContext


@dataclass
class PendingSave:
    """A DCP save in flight on this rank."""

    future: Future | None
    """async_save's future (None: a blocking save that has returned)."""
    tmp: Path
    final: Path
    committed: bool = False


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """{"model": ..., "optimizer": ...}: this rank's part, keyed by parameter name (no
    gather: DTensors stay sharded)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def tmp_dir(final: Path) -> Path:
    """Where every rank writes step_N before it is renamed (clean_leftovers' pattern)."""
    return final.with_name(f".{final.name}.tmp-dcp")


def start_save(ctx: TrainContext, final: Path, checkpoint_group: Any,
               asynchronous: bool) -> PendingSave:
    """Every rank: write this rank's shards into tmp_dir(final)/dcp (rank 0 has created
    it). Blocking, or handed to a background thread when `asynchronous`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    tmp = tmp_dir(final)
    state = training_state(ctx.model, ctx.optimizer)
    writer = FileSystemWriter(str(tmp / DCP_DIR))
    single = not _distributed()
    if asynchronous and single:
        # DCP warns from its background thread that it saves without a process group,
        # which is what a one-process run means; a filter scoped by catch_warnings would
        # be gone by then (and is not thread-safe), so this one stays for the process.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    with alone():
        if asynchronous:
            future = dcp.async_save(state, storage_writer=writer,
                                    process_group=checkpoint_group, no_dist=single)
            return PendingSave(future, tmp, final)
        dcp.save(state, storage_writer=writer, no_dist=single)
    return PendingSave(None, tmp, final)


def done(pending: PendingSave) -> bool:
    return pending.future is None or pending.future.done()


def wait(pending: PendingSave) -> None:
    """Block until this rank's part of the save is written (re-raises its error)."""
    if pending.future is not None:
        pending.future.result()


def load_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        ckpt: Path) -> None:
    """Every rank: fill this rank's model and optimizer (whatever executor and number of
    processes) from the DCP checkpoint `ckpt`, reading only the pieces this rank holds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = training_state(model, optimizer)
    try:
        with alone():
            dcp.load(state, storage_reader=SafeReader(str(ckpt / DCP_DIR)),
                     no_dist=not _distributed())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - any reader failure
        raise CheckpointError(f"{ckpt / DCP_DIR}: unreadable shards ({reason(e)}); "
                              f"{damaged_hint(ckpt, older_checkpoint(ckpt))}") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def failures(e: BaseException) -> list[BaseException]:
    """The exceptions a DCP CheckpointException carries (one per failed rank), or [e]."""
    found = [f[0] if isinstance(f, tuple) else f
             for f in getattr(e, "failures", {}).values()]
    return [f for f in found if isinstance(f, BaseException)] or [e]


def reason(e: BaseException) -> str:
    """One short line for a failed DCP save or load: the first failed rank's reason."""
    return load_failure(failures(e)[0])[:300]


def full_disk(e: BaseException) -> bool:
    return any(is_disk_full(f) for f in failures(e))


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


# -- the save, as the trainer runs it ------------------------------------------------------
def begin(ctx: TrainContext, callbacks: list[Any], asynchronous: bool) -> PendingSave:
    """Collective: rank 0 writes the small files of step_N into its temporary directory,
    then every rank writes its shards there (blocking, or in the background). A blocking
    save is committed (renamed into place) before this returns."""
    final = ctx.paths.ckpt_dir / step_dir_name(ctx.state.step)
    rounding = rounding_states(ctx.optimizer)  # collective
    error: BaseException | None = None
    if ctx.is_main:
        try:
            refuse_users_dir(final)
            _write_small_files(ctx, callbacks, rounding, tmp_dir(final))
        except (OSError, CheckpointError) as e:
            error = e
    # every rank learns whether rank 0 could start, so none waits in DCP's collectives
    if ctx.executor.all_reduce_sum(float(error is not None)) > 0:
        if error is not None:
            discard(tmp_dir(final))
            raise error
        raise CheckpointError(f"{final}: rank 0 could not start this checkpoint (its error "
                              "is reported by rank 0)")
    group = ctx.executor.checkpoint_group() if asynchronous else None
    try:
        pending = start_save(ctx, final, group, asynchronous)
    except (Exception, CheckpointException) as e:
        if full_disk(e):
            raise _disk_full(ctx, final) from None
        raise
    if not asynchronous:
        finish(ctx, pending)
        ctx.executor.barrier()  # step_N exists for every rank before training goes on
    return pending


def _write_small_files(ctx: TrainContext, callbacks: list[Any], rounding: Any,
                       tmp: Path) -> None:
    discard(tmp)  # a kill during an earlier save of this step left it
    tmp.mkdir(parents=True)
    extras = {"scheduler": ctx.scheduler.state_dict(),
              "trainer_state": trainer_state_payload(ctx, callbacks, rounding)}
    write_checkpoint_files(tmp, ctx.model_config, tokenizer_dir=ctx.tokenizer_dir,
                           meta={**checkpoint_meta(ctx), "checkpoint_format": "dcp"},
                           extras=extras)
    (tmp / MARKER).touch()


def finish(ctx: TrainContext, pending: PendingSave) -> Path | None:
    """Wait for this rank's part; rank 0 then renames the finished directory to step_N,
    points `latest` at it and prunes. Returns step_N on rank 0 (None elsewhere). Local to
    each rank: no collective, so the ranks may finish at different steps."""
    try:
        wait(pending)
    except (Exception, CheckpointException) as e:
        if full_disk(e):
            raise _disk_full(ctx, pending.final) from None
        raise
    if not ctx.is_main:
        return None
    if not pending.committed:
        _commit(ctx, pending)
    return pending.final


def poll(ctx: TrainContext, pending: PendingSave | None) -> Path | None:
    """Rank 0, between steps: commit a background save that has completed (so step_N
    appears as soon as it is whole, not at the next save). The path when it did."""
    if pending is None or not ctx.is_main or pending.committed or not done(pending):
        return None
    return finish(ctx, pending)


def _disk_full(ctx: TrainContext, final: Path) -> CheckpointError:
    """The one line for a DCP save that ran out of space; its temporary directory is
    removed (rank 0), the older checkpoints are untouched (pruning follows a commit)."""
    if ctx.is_main:
        discard(tmp_dir(final))
    done = list_checkpoints(ctx.paths.ckpt_dir)
    step = int(final.name.removeprefix("step_"))
    return CheckpointError(disk_full_message(ctx.paths.ckpt_dir, step,
                                             done[-1][1] if done else None,
                                             ctx.paths.run_dir))


def _commit(ctx: TrainContext, pending: PendingSave) -> None:
    replace_dir(pending.tmp, pending.final)
    pending.committed = True
    write_pointer(ctx.paths.run_dir, pending.final)
    prune(ctx.paths.ckpt_dir, ctx.config.checkpoint.keep_last)
