"""Training checkpoints inside a run directory.

    RUN_DIR/train_config.json          resolved TrainConfig of the run
    RUN_DIR/metrics.jsonl              one JSON record per logged step
    RUN_DIR/checkpoints/step_N/        astrai checkpoint (model.safetensors, tokenizer, meta.json
                                       with the train config, optimizer.pt, scheduler.pt,
                                       trainer_state.pt)
    RUN_DIR/checkpoints/step_N/adapter/  LoRA runs: adapter_config.json + adapter_model.safetensors
                                       (PEFT's format); model.safetensors holds the frozen base
    RUN_DIR/checkpoints/step_N/dcp/    DCP checkpoints (--checkpoint-format dcp): every rank's
                                       shards of weights and optimizer state, instead of
                                       model.safetensors + optimizer.pt (astrai.train.dcp_checkpoint)
    RUN_DIR/latest                     name of the newest complete checkpoint

A checkpoint directory appears only by an atomic rename (astrai.model.checkpoint), so every
`step_N` directory is complete; `latest` is a convenience written after it, and resume
trusts the directories, not the pointer (a kill between the two loses nothing).

Every checkpoint the trainer writes holds an empty `.astrai-checkpoint` marker. The
checkpoint directory may be one the user already had (`--ckpt-dir`), so pruning and the
clean-up of interrupted deletions touch only `step_N` directories carrying the marker: a
user's own `step_N` is never removed, whatever it holds.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError, safe_open

from astrai.atomic import write_text_atomic
from astrai.diskfull import DiskFullError
from astrai.errors import CheckpointError
from astrai.inspect.names import clean_name
from astrai.model.checkpoint import CONFIG, META, WEIGHTS, load_extra, read_meta, save_checkpoint
from astrai.model.dcp_format import DCP_DIR, METADATA, is_dcp, read_metadata
from astrai.train.bf16_update import rounding_states
from astrai.train.checkpoint_errors import (
    damaged_hint,
    disk_full_message,
    is_disk_full,
    load_failure,
)

if TYPE_CHECKING:
    from astrai.train.context import TrainContext

ADAPTER_DIR = "adapter"
"""Inside a LoRA run's checkpoint: the PEFT adapter directory."""
STEP_DIR = re.compile(r"^step_(\d+)$")
REQUIRED = (CONFIG, WEIGHTS, META, "optimizer.pt", "scheduler.pt", "trainer_state.pt")
REQUIRED_DCP = (CONFIG, META, f"{DCP_DIR}/{METADATA}", "scheduler.pt", "trainer_state.pt")
"""A DCP checkpoint's files (its shards are checked when it is read: read_metadata)."""
MARKER = ".astrai-checkpoint"
"""Written into every training checkpoint: only directories holding it are ever deleted."""


def ours(path: Path) -> bool:
    """Whether a `step_N` directory was written by astrai's trainer (and may be deleted)."""
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete training checkpoint, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    out = []
    for p in ckpt_dir.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and any(all((p / f).is_file() for f in files)
                                    for files in (REQUIRED, REQUIRED_DCP)):
            out.append((int(m.group(1)), p))
    return sorted(out)


def write_pointer(run_dir: Path, target: Path) -> None:
    write_text_atomic(run_dir / "latest", os.path.relpath(target, run_dir) + "\n")


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint directory so that a kill midway leaves no `step_N`: it is first
    renamed to a hidden name (atomic), which `clean_leftovers` removes if a kill stops the
    deletion."""
    trash = path.with_name(f".{path.name}.del-{os.getpid()}")
    try:
        os.replace(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def clean_leftovers(ckpt_dir: Path) -> list[Path]:
    """Remove what interrupted writes and deletions left: temporary directories of saves
    (`.step_N.tmp-*`), renamed-away old or deleted checkpoints (`.step_N.old-*`,
    `.step_N.del-*`: names only astrai's writers make), and incomplete `step_N` directories
    older than the newest complete checkpoint (half deleted by a kill) that carry the
    trainer's marker; a `step_N` without it is the user's and stays."""
    if not ckpt_dir.is_dir():
        return []
    removed = [p for pat in (".step_*.tmp-*", ".step_*.old-*", ".step_*.del-*")
               for p in ckpt_dir.glob(pat) if p.is_dir() and not p.is_symlink()]
    complete = list_checkpoints(ckpt_dir)
    if complete:
        newest = complete[-1][0]
        done = {p for _, p in complete}
        for p in ckpt_dir.iterdir():
            m = STEP_DIR.match(p.name)
            if m and ours(p) and p not in done and int(m.group(1)) < newest:
                removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints this trainer wrote (0 =
    keep all; a `step_N` without the marker is never counted or deleted), and the leftovers
    of interrupted writes and deletions."""
    clean_leftovers(ckpt_dir)
    if keep_last <= 0:
        return
    for _, p in [c for c in list_checkpoints(ckpt_dir) if ours(c[1])][:-keep_last]:
        remove_checkpoint(p)


def refuse_users_dir(path: Path) -> None:
    """A save never replaces a `step_N` directory the trainer did not write."""
    if (path.exists() or path.is_symlink()) and not ours(path):
        raise CheckpointError(
            f"{path}: exists and was not written by astrai's trainer (no {MARKER}), so the "
            "checkpoint of this step would replace it; move it away or choose another "
            "--ckpt-dir")


def marked(write_more: Callable[[Path], None] | None) -> Callable[[Path], None]:
    """`write_more` for save_checkpoint that also writes the trainer's marker."""
    def write(tmp: Path) -> None:
        (tmp / MARKER).touch()
        if write_more is not None:
            write_more(tmp)
    return write


def trainer_state_payload(ctx: TrainContext, callbacks: list[Any],
                          rounding: list[Any] | None = None) -> dict[str, Any]:
    """`rounding`: every rank's stochastic-rounding generator state (rounding_states)."""
    return {
        "state": ctx.state.to_dict(),
        "bf16_rounding": rounding,
        "rng": ctx.boundary_rng,
        "sampler": ctx.boundary_sampler,
        "strategy": ctx.strategy.state_dict(),
        "callbacks": {cb.name: cb.state_dict() for cb in callbacks},
    }


def split_adapter(ctx: TrainContext, weights: dict[str, Any]
                  ) -> tuple[dict[str, Any], Callable[[Path], None] | None]:
    """A LoRA run's checkpoint: the frozen base (and a reward head) in model.safetensors, as
    any checkpoint, and the adapter in PEFT's format in `adapter/` (what PeftModel loads,
    and what resume puts back on the base)."""
    from astrai.model.lora import is_lora_key

    spec = getattr(ctx.executor.unwrap(), "lora_spec", None)
    if spec is None:
        return weights, None
    from astrai.model.adapter import write_adapter

    adapter = {k: v for k, v in weights.items() if is_lora_key(k)}
    base = {k: v for k, v in weights.items() if not is_lora_key(k)}
    return base, lambda tmp: write_adapter(tmp / ADAPTER_DIR, None, spec, ctx.config.model,
                                           state=adapter)


def optimizer_param_names(ctx: TrainContext) -> list[str]:
    """The stored name of each optimizer parameter, in the optimizer's index order."""
    names = {id(p): clean_name(n) for n, p in ctx.model.named_parameters()}
    return [names.get(id(p), "") for g in ctx.optimizer.param_groups for p in g["params"]]


def checkpoint_meta(ctx: TrainContext) -> dict[str, Any]:
    """meta.json of a training checkpoint of the committed state."""
    s = ctx.state
    return {
        "step": s.step, "epoch": s.epoch, "consumed_samples": s.consumed_samples,
        "consumed_tokens": s.consumed_tokens, "total_steps": ctx.total_steps,
        "strategy": ctx.config.strategy, **ctx.meta, "train_config": ctx.config.to_dict(),
        "world_size": ctx.executor.world_size,
    }


def save_training_checkpoint(ctx: TrainContext, callbacks: list[Any]) -> Path | None:
    """Write checkpoints/step_N (full format) for the committed state. Every rank calls it
    (gathering a sharded state is collective); rank 0 writes."""
    weights = ctx.executor.model_state_dict()
    optimizer = ctx.executor.optimizer_state_dict(ctx.optimizer)
    rounding = rounding_states(ctx.optimizer)
    path = None
    if ctx.is_main:
        if optimizer:  # names let inspect-weights pair each state with its weight
            optimizer = {**optimizer, "param_names": optimizer_param_names(ctx)}
        s = ctx.state
        meta = checkpoint_meta(ctx)
        path = ctx.paths.ckpt_dir / step_dir_name(s.step)
        refuse_users_dir(path)
        weights, write_adapter = split_adapter(ctx, weights)
        write_adapter = marked(write_adapter)
        extras = {"optimizer": optimizer, "scheduler": ctx.scheduler.state_dict(),
                  "trainer_state": trainer_state_payload(ctx, callbacks, rounding)}
        try:
            save_checkpoint(path, weights, ctx.model_config, tokenizer_dir=ctx.tokenizer_dir,
                            meta=meta, extras=extras, write_more=write_adapter)
            write_pointer(ctx.paths.run_dir, path)
        except (OSError, RuntimeError, SafetensorError, DiskFullError) as e:
            if not is_disk_full(e):
                raise
            # the temporary directory of the save is gone (atomic_dir); the older
            # checkpoints are untouched, since pruning comes only after a save succeeds
            done = list_checkpoints(ctx.paths.ckpt_dir)
            raise CheckpointError(disk_full_message(
                ctx.paths.ckpt_dir, s.step, done[-1][1] if done else None,
                ctx.paths.run_dir)) from None
        prune(ctx.paths.ckpt_dir, ctx.config.checkpoint.keep_last)
    ctx.executor.barrier()
    return path


def latest_checkpoint(ckpt_dir: Path, run_dir: Path) -> Path:
    """The newest complete checkpoint of a run, or CheckpointError saying what to do."""
    found = list_checkpoints(ckpt_dir)
    if found:
        return found[-1][1]
    if (run_dir / "train_config.json").is_file():  # a run stopped before its first save
        raise CheckpointError(
            f"{run_dir}: no complete checkpoint yet under {ckpt_dir} (the run stopped before "
            "its first save): run the same `astrai train` command again; it starts afresh "
            "in this directory")
    raise CheckpointError(f"{run_dir}: no complete checkpoint under {ckpt_dir}; nothing to "
                          "resume (start a run with `astrai train --out DIR`)")


def older_checkpoint(path: Path) -> Path | None:
    """The newest complete checkpoint before `path` in its directory, if any."""
    m = STEP_DIR.match(path.name)
    step = int(m.group(1)) if m else None
    older = [p for s, p in list_checkpoints(path.parent) if step is None or s < step]
    return older[-1] if older else None


def check_weight_files(path: Path) -> None:
    """Open the safetensors files of checkpoint `path` (their header against the file's
    size, not the data), or a DCP checkpoint's metadata and the presence and length of
    every shard it names: a truncated or missing one is a CheckpointError naming the
    checkpoint to resume from instead."""
    if is_dcp(path):
        try:
            read_metadata(path)
        except CheckpointError as e:
            what = str(e).split("; ")[0]
            raise CheckpointError(f"{what}; {damaged_hint(path, older_checkpoint(path))}"
                                  ) from None
        return
    for f in (path / WEIGHTS, path / ADAPTER_DIR / "adapter_model.safetensors"):
        if not f.is_file():
            continue
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            reason = next((x.strip() for x in str(e).splitlines() if x.strip()),
                          type(e).__name__)
            raise CheckpointError(f"{f}: truncated or damaged ({reason}); "
                                  f"{damaged_hint(path, older_checkpoint(path))}") from None


def load_training_state(path: Path) -> tuple[dict, dict | None, dict, dict]:
    """(meta, optimizer state, scheduler state, trainer state) of a checkpoint; the
    optimizer state is None for a DCP checkpoint (each rank reads its own shards of it:
    astrai.train.dcp_checkpoint.load_training_state)."""
    extras: dict[str, Any] = {"optimizer": None}
    names = ("scheduler", "trainer_state") if is_dcp(path) else (
        "optimizer", "scheduler", "trainer_state")
    for name in names:
        try:
            extras[name] = load_extra(path, name)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
            raise CheckpointError(
                f"{path / (name + '.pt')}: unreadable ({load_failure(e)}); "
                f"{damaged_hint(path, older_checkpoint(path))}") from None
        if extras[name] is None:
            raise CheckpointError(f"{path}: missing {name}.pt; not a training checkpoint")
    return read_meta(path), extras["optimizer"], extras["scheduler"], extras["trainer_state"]
