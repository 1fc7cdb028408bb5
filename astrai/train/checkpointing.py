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


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (0 = keep all), and the
    temporary directories of interrupted writes."""
    for p in ckpt_dir.glob(".step_*.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    if keep_last <= 0:
        return
    for _, p in list_checkpoints(ckpt_dir)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


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


def load_training_state(path: Path) -> tuple[dict, dict, dict, dict]:
    """(meta, optimizer state, scheduler state, trainer state) of a checkpoint."""
    extras = {}
    for name in ("optimizer", "scheduler", "trainer_state"):
        try:
            extras[name] = load_extra(path, name)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
            raise CheckpointError(f"{path / (name + '.pt')}: unreadable ({e})") from None
        if extras[name] is None:
            raise CheckpointError(f"{path}: missing {name}.pt; not a training checkpoint")
    return read_meta(path), extras["optimizer"], extras["scheduler"], extras["trainer_state"]
