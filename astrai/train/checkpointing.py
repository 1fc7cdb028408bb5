"""Training checkpoints inside a run directory.

    RUN_DIR/train_config.json          resolved TrainConfig of the run
    RUN_DIR/metrics.jsonl              one JSON record per logged step
    RUN_DIR/checkpoints/step_N/        astrai checkpoint (model.safetensors, tokenizer, meta.json
                                       with the train config, optimizer.pt, scheduler.pt,
                                       trainer_state.pt)
    RUN_DIR/latest                     name of the newest complete checkpoint

A checkpoint directory appears only by an atomic rename (astrai.model.checkpoint), so every
`step_N` directory is complete; `latest` is a convenience written after it, and resume
trusts the directories, not the pointer (a kill between the two loses nothing).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astrai.atomic import write_text_atomic
from astrai.errors import CheckpointError
from astrai.model.checkpoint import CONFIG, META, WEIGHTS, load_extra, read_meta, save_checkpoint

if TYPE_CHECKING:
    from astrai.train.context import TrainContext

STEP_DIR = re.compile(r"^step_(\d+)$")
REQUIRED = (CONFIG, WEIGHTS, META, "optimizer.pt", "scheduler.pt", "trainer_state.pt")


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete training checkpoint, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    out = []
    for p in ckpt_dir.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and all((p / f).is_file() for f in REQUIRED):
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
    `.step_N.del-*`), and incomplete `step_N` directories older than the newest complete
    checkpoint (half deleted by a kill). Only the run's own trainer writes here."""
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
            if m and p.is_dir() and not p.is_symlink() and p not in done \
                    and int(m.group(1)) < newest:
                removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (0 = keep all), and the
    leftovers of interrupted writes and deletions."""
    clean_leftovers(ckpt_dir)
    if keep_last <= 0:
        return
    for _, p in list_checkpoints(ckpt_dir)[:-keep_last]:
        remove_checkpoint(p)


def trainer_state_payload(ctx: TrainContext, callbacks: list[Any]) -> dict[str, Any]:
    return {
        "state": ctx.state.to_dict(),
        "rng": ctx.boundary_rng,
        "sampler": ctx.boundary_sampler,
        "strategy": ctx.strategy.state_dict(),
        "callbacks": {cb.name: cb.state_dict() for cb in callbacks},
    }


def save_training_checkpoint(ctx: TrainContext, callbacks: list[Any]) -> Path | None:
    """Write checkpoints/step_N for the committed state. Every rank calls it (gathering a
    sharded state is collective); rank 0 writes."""
    weights = ctx.executor.model_state_dict()
    optimizer = ctx.executor.optimizer_state_dict(ctx.optimizer)
    path = None
    if ctx.is_main:
        s = ctx.state
        meta = {
            "step": s.step, "epoch": s.epoch, "consumed_samples": s.consumed_samples,
            "consumed_tokens": s.consumed_tokens, "total_steps": ctx.total_steps,
            "strategy": ctx.config.strategy, **ctx.meta, "train_config": ctx.config.to_dict(),
        }
        path = ctx.paths.ckpt_dir / step_dir_name(s.step)
        save_checkpoint(
            path, weights, ctx.model_config, tokenizer_dir=ctx.tokenizer_dir, meta=meta,
            extras={"optimizer": optimizer, "scheduler": ctx.scheduler.state_dict(),
                    "trainer_state": trainer_state_payload(ctx, callbacks)},
        )
        write_pointer(ctx.paths.run_dir, path)
        prune(ctx.paths.ckpt_dir, ctx.config.keep_last)
    ctx.executor.barrier()
    return path


def latest_checkpoint(ckpt_dir: Path, run_dir: Path) -> Path:
    """The newest complete checkpoint of a run, or CheckpointError saying what to do."""
    found = list_checkpoints(ckpt_dir)
    if not found:
        raise CheckpointError(
            f"{run_dir}: no complete checkpoint under {ckpt_dir}; nothing to resume "
            "(start the run again with `astrai train`)"
        )
    return found[-1][1]


def load_failure(e: Exception) -> str:
    """One short line for a failed torch.load: PyTorch's weights_only refusal is many lines
    of advice about unpickling untrusted files; its reason is the line after the marker."""
    text = str(e)
    marker = "WeightsUnpickler error:"
    if marker in text:
        rest = [x.strip() for x in text.split(marker, 1)[1].splitlines() if x.strip()]
        return f"not a file torch.save wrote with plain tensors ({rest[0] if rest else 'refused'})"
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[0] if lines else type(e).__name__


def load_training_state(path: Path) -> tuple[dict, dict, dict, dict]:
    """(meta, optimizer state, scheduler state, trainer state) of a checkpoint."""
    extras = {}
    for name in ("optimizer", "scheduler", "trainer_state"):
        try:
            extras[name] = load_extra(path, name)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
            raise CheckpointError(
                f"{path / (name + '.pt')}: unreadable ({load_failure(e)}); the checkpoint is "
                f"damaged: move {path} away to resume from the one before it") from None
        if extras[name] is None:
            raise CheckpointError(f"{path}: missing {name}.pt; not a training checkpoint")
    return read_meta(path), extras["optimizer"], extras["scheduler"], extras["trainer_state"]
