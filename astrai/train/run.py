"""The library entry points behind `astrai train` and `astrai resume`.

    plan_run(config)                 -> TrainPlan     (--dry-run: validates, writes nothing)
    train(config)                    -> TrainSummary  (a new run directory)
    resume(run_dir)                  -> TrainSummary  (continue from its newest checkpoint)

One process owns a run directory while it trains (astrai.train.run_lock). A new run's
directory is created and locked first, but nothing is written into it before every input
has been validated, and a bad flag, dataset or model removes the directory it created.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from astrai.atomic import write_json_atomic
from astrai.config.train import TrainConfig
from astrai.errors import CheckpointError, ConfigError, DataError
from astrai.jsonfile import read_json_object
from astrai.model.checkpoint import load_checkpoint, model_class, weight_shapes
from astrai.model.config import ModelConfig
from astrai.model.dcp_format import is_dcp
from astrai.model.presets import PRESETS
from astrai.train.builder import Prepared, build_context, prepare, run_paths
from astrai.train.callbacks import Callback, default_callbacks
from astrai.train.callbacks.tensorboard import require_tensorboard
from astrai.train.checkpointing import (
    ADAPTER_DIR,
    check_weight_files,
    clean_leftovers,
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
)
from astrai.train.context import RunPaths, TrainContext
from astrai.train.data import TrainData, open_train_data
from astrai.train.executors.process_group import dist_env, expected_world_size
from astrai.train.model_source import ModelSource
from astrai.train.plan import TrainPlan
from astrai.train.rewards.trust import absolute_reward, confirm_rewards
from astrai.train.run_dir import Claim, claim_new_run_dir
from astrai.train.run_lock import hold_run
from astrai.train.trainer import Trainer


@dataclass
class TrainSummary:
    """What a finished (or resumed-and-finished) run reports."""

    run_dir: str
    checkpoint: str | None
    steps: int
    total_steps: int
    epoch: int
    consumed_samples: int
    consumed_tokens: int
    final_loss: float | None
    elapsed_s: float
    tokens_per_s: float
    resumed_from: str | None = None
    skipped_steps: int = 0
    validation: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    preempted: bool = False
    """Stopped by SIGTERM/SIGINT at a step boundary, with a checkpoint of that step."""
    rank: int = 0
    """The process that returned this summary (only rank 0's is shown)."""
    steps_run: int = 0
    """Optimizer steps this invocation ran (0: a resumed run that had already finished)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _data(config: TrainConfig, data: TrainData | None) -> TrainData:
    if data is not None:
        return data
    config.require("data")
    return open_train_data(config.data, window_size=config.window_size,
                           eval_path=config.eval.data, val_split=config.eval.val_split)


def _resolved(value: str | None) -> str | None:
    return str(Path(value).resolve()) if value else value


def absolute_paths(config: TrainConfig) -> TrainConfig:
    """The config with its filesystem paths made absolute, so the copy saved with the run
    (and `astrai resume`) works from any working directory."""
    update: dict[str, Any] = {"data": _resolved(config.data), "out": _resolved(config.out),
                              "eval": config.eval.model_copy(
                                  update={"data": _resolved(config.eval.data)}),
                              "checkpoint": config.checkpoint.model_copy(
                                  update={"dir": _resolved(config.checkpoint.dir)}),
                              "lora": config.lora.model_copy(
                                  update={"adapter": _resolved(config.lora.adapter)})}
    if config.alignment.reward:
        update["alignment"] = config.alignment.model_copy(
            update={"reward": [absolute_reward(r) for r in config.alignment.reward]})
    model = config.model
    if model and model not in PRESETS and not Path(model).is_absolute() and Path(model).exists():
        update["model"] = str(Path(model).resolve())
    return config.model_copy(update=update)


def plan_run(config: TrainConfig, *, data: TrainData | None = None) -> TrainPlan:
    """Validate the run and return its plan; builds no model weights, writes nothing."""
    return prepare(config, _data(config, data)).plan


def _execute(ctx: TrainContext, callbacks: list[Callback], states: dict[str, Any],
             resumed_from: str | None) -> TrainSummary:
    for cb in callbacks:
        if cb.name in states:
            cb.load_state_dict(states[cb.name])
    t0, start_tokens, start_step = time.perf_counter(), ctx.state.consumed_tokens, ctx.state.step
    Trainer(ctx, callbacks).train()
    steps_run = ctx.state.step - start_step
    elapsed = time.perf_counter() - t0
    ckpt = ctx.paths.ckpt_dir / f"step_{ctx.state.step}"
    return TrainSummary(
        run_dir=str(ctx.paths.run_dir), checkpoint=str(ckpt) if ckpt.is_dir() else None,
        steps=ctx.state.step, total_steps=ctx.total_steps, epoch=ctx.state.epoch,
        consumed_samples=ctx.state.consumed_samples, consumed_tokens=ctx.state.consumed_tokens,
        final_loss=ctx.last_loss if steps_run else None, elapsed_s=round(elapsed, 3),
        tokens_per_s=round((ctx.state.consumed_tokens - start_tokens) / max(elapsed, 1e-9), 1),
        resumed_from=resumed_from, skipped_steps=ctx.state.skipped_steps,
        validation=dict(ctx.last_eval), warnings=list(ctx.errors),
        preempted=ctx.stop_reason is not None, rank=ctx.executor.rank, steps_run=steps_run,
    )


def train(config: TrainConfig, *, data: TrainData | None = None,
          callbacks: Sequence[Callback] = (), progress: bool = False,
          console: Any = None) -> TrainSummary:
    """Train a new run into config.out (missing, empty, or a run stopped before its first
    checkpoint: astrai.train.run_dir). `callbacks` run after the default ones."""
    config.require("out")
    if config.logging.tensorboard:
        require_tensorboard()
    config = absolute_paths(config)
    paths = run_paths(config)
    if dist_env().rank != 0:  # the other ranks of a launched run write nothing
        return _train_new(config, paths, data, callbacks, progress, console, None)
    with claim_new_run_dir(paths) as claim:  # locked until the run ends
        try:
            return _train_new(config, paths, data, callbacks, progress, console, claim)
        except BaseException:
            # A run that fails before its first checkpoint made nothing to resume: leave no
            # run directory behind that it created (still locked: nobody else's yet).
            if claim.made and not list_checkpoints(paths.ckpt_dir):
                shutil.rmtree(paths.run_dir, ignore_errors=True)
            raise


def _train_new(config: TrainConfig, paths: RunPaths, data: TrainData | None,
               callbacks: Sequence[Callback], progress: bool, console: Any,
               claim: Claim | None) -> TrainSummary:
    prepared = prepare(config, _data(config, data))  # every user error before any write
    ctx, states = build_context(prepared)
    if ctx.is_main:
        if claim is not None:
            claim.clear_stale()  # a stopped run's config, metrics and torn saves
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(paths.config, config.to_dict())
    cbs = default_callbacks(config, progress=progress, console=console) + list(callbacks)
    return _execute(ctx, cbs, states, None)


def _run_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, CheckpointError, hint="the run directory is damaged")


def _names_key(d: Any, key: str) -> bool:
    """Whether a saved config (flat or nested by section) holds `key` at any level."""
    return isinstance(d, dict) and (key in d or any(_names_key(v, key) for v in d.values()))


LAYOUT_KEYS = ("parallel", "nprocs", "nnodes", "tp", "batch_size", "grad_accum_steps")
"""What `astrai resume` may change: the process layout, keeping the global batch."""


def relayout(config: TrainConfig, meta: dict[str, Any], layout: dict[str, Any] | None,
             source: str) -> TrainConfig:
    """The run's config on another process layout (`layout`: LAYOUT_KEYS given again).
    The global batch (processes x batch size x accumulation) must stay the run's: the data
    position is a global sample index and the schedule counts steps, so both continue
    only if one step still consumes the same samples."""
    given = {k: v for k, v in (layout or {}).items() if v is not None}
    if not given:
        return config
    bad = sorted(set(given) - set(LAYOUT_KEYS))
    if bad:
        raise ConfigError(f"resume: {bad[0]} cannot change on resume; only "
                          f"{', '.join(LAYOUT_KEYS)} can")
    saved = config.model_dump(mode="json")
    new = TrainConfig.from_dict({**saved, **given}, source=f"{source} (resume options)")
    new.out = config.out
    # data-parallel groups: a --tp group's processes share one batch
    world = int(meta.get("world_size") or config.runtime.nnodes * config.runtime.nprocs)
    world //= config.runtime.tp
    before = world * config.batch_size * config.grad_accum_steps
    after = (expected_world_size(new) // new.runtime.tp * new.batch_size
             * new.grad_accum_steps)
    if before != after:
        raise ConfigError(
            f"resume: the run's global batch is {world} data-parallel processes x batch "
            f"{config.batch_size}"
            f" x accumulation {config.grad_accum_steps} = {before} samples per step, the new "
            f"layout gives {after}; choose --batch-size / --grad-accum-steps so that "
            "processes x batch x accumulation stays the same")
    return new


def find_resume_point(run_dir: str | Path, reward: Sequence[str] | None = None,
                      layout: dict[str, Any] | None = None) -> tuple[TrainConfig, Path]:
    """(the run's resolved config, its newest complete checkpoint). `reward`: the --reward
    specs given again on the command line, required when the run's rewards are Python code
    (a run directory never names code that resume would run on its own). `layout`:
    another process layout to continue on (relayout)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: is a file, not a run directory; pass the directory "
                              "`astrai train --out` wrote")
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a run directory (no such directory)")
    cfg_file = run_dir / "train_config.json"
    ckpt_dir = run_dir / "checkpoints"
    if cfg_file.is_file():
        saved = TrainConfig.from_dict(_run_json(cfg_file), source=str(cfg_file))
        if saved.checkpoint.dir:
            ckpt_dir = Path(saved.checkpoint.dir)
    ckpt = latest_checkpoint(ckpt_dir, run_dir)
    meta = _run_json(ckpt / "meta.json")
    if not isinstance(meta.get("train_config"), dict):
        raise CheckpointError(f"{ckpt}: meta.json has no train_config; not a training checkpoint")
    config = TrainConfig.from_dict(meta["train_config"], source=f"{ckpt}/meta.json")
    config.out = str(run_dir)  # the run directory may have moved
    if not _names_key(meta["train_config"], "bf16_update"):
        # saved before --bf16-update existed: those runs rounded to nearest, and resume
        # keeps what the run did (auto is stochastic with bf16-true)
        config.precision.bf16_update = "nearest"
    confirm_rewards(config, reward, ckpt / "meta.json")
    return relayout(config, meta, layout, f"{ckpt}/meta.json"), ckpt


def resume(run_dir: str | Path, *, reward: Sequence[str] | None = None,
           data: TrainData | None = None, callbacks: Sequence[Callback] = (),
           progress: bool = False, console: Any = None,
           tensorboard: bool = False, layout: dict[str, Any] | None = None) -> TrainSummary:
    """Continue a run from its newest complete checkpoint: weights, optimizer, scheduler,
    sampler position, RNG states and counters; metrics.jsonl continues without duplicates.
    `reward`: the run's --reward specs, required again when they name Python code.
    `tensorboard` turns TensorBoard event files on from here (kept in later checkpoints).
    `layout`: continue on another process layout (relayout; a DCP checkpoint reshards).
    The run directory is locked while it trains (astrai.train.run_lock): a second resume
    of it, or a train into it, is refused naming this process."""
    kw = {"reward": reward, "data": data, "callbacks": callbacks, "progress": progress,
          "console": console, "tensorboard": tensorboard, "layout": layout}
    d = Path(run_dir)
    looks_like_run = (d / "train_config.json").is_file() or (d / "checkpoints").is_dir()
    if dist_env().rank != 0 or not looks_like_run:  # find_resume_point says what it is
        return _resume(d, **kw)
    with hold_run(d, "astrai resume"):
        return _resume(d, **kw)


def _resume(run_dir: Path, *, reward: Sequence[str] | None, data: TrainData | None,
            callbacks: Sequence[Callback], progress: bool, console: Any,
            tensorboard: bool, layout: dict[str, Any] | None) -> TrainSummary:
    config, ckpt = find_resume_point(run_dir, reward, layout)
    check_weight_files(ckpt)  # a truncated file: say so before anything is built
    if tensorboard:
        config.logging.tensorboard = True
    if config.logging.tensorboard:
        require_tensorboard()
    meta, opt_state, sched_state, trainer_state = load_training_state(ckpt)
    data = _data(config, data)
    if meta.get("tokenizer_fingerprint") not in (None, data.fingerprint):
        raise DataError(
            f"{ckpt}: the run was trained on data tokenized with another tokenizer than "
            f"{config.data} has now; resume needs the run's own dataset"
        )
    model_config = ModelConfig.load(ckpt / "config.json")
    sharded = is_dcp(ckpt)

    def model_fn():
        if sharded:  # the weights come from the shards once the executor has wrapped it
            return model_class(weight_shapes(ckpt) or {})(model_config).train()
        model, _, _ = load_checkpoint(ckpt)
        return model.train()

    source = ModelSource(model_config, model_fn, "checkpoint", f"checkpoint {ckpt}")
    adapter = ckpt / ADAPTER_DIR  # a LoRA run: its adapter goes back on the stored base
    prepared: Prepared = prepare(config, data, source=source,
                                 adapter=adapter if adapter.is_dir() else None)
    if meta.get("total_steps") not in (None, prepared.plan.total_steps):
        raise DataError(
            f"{ckpt}: the run had {meta['total_steps']} total steps but {config.data} now "
            f"gives {prepared.plan.total_steps}; the dataset changed, so the run cannot "
            "resume exactly (start a new run from this checkpoint with --model)"
        )
    ctx, states = build_context(prepared, resume={
        "optimizer": opt_state, "scheduler": sched_state, "trainer_state": trainer_state,
        "dcp": ckpt if sharded else None,
    })
    if ctx.is_main:
        clean_leftovers(ctx.paths.ckpt_dir)  # what a kill during a save or deletion left
    cbs = default_callbacks(config, progress=progress, console=console) + list(callbacks)
    return _execute(ctx, cbs, states, str(ckpt))
