"""Assemble a TrainContext from a TrainConfig, in two stages:

    prepare(config, data) -> Prepared      validate; resolve strategy, device, precision
                                            and the plan once; build and write nothing
    build_context(prepared) -> TrainContext create executor, model, optimizer, scheduler,
                                            strategy from what `Prepared` resolved

Order matters: validate everything (data kind, vocabulary, lengths, steps) before any file
is written; weights are loaded before the model is wrapped; the executor creates and wraps
the model, then the optimizer and scheduler over the wrapped parameters; on resume the
optimizer, scheduler, counters, RNG and strategy states come back from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from astrai.config.train import TrainConfig
from astrai.device import resolve_device
from astrai.errors import ConfigError, DataError
from astrai.train.bf16_update import restore_rounding, rounding_seed
from astrai.train.compile import (
    apply_activation_checkpointing,
    apply_compile,
    checkpoint_module_types,
)
from astrai.train.context import RunPaths, TrainContext, TrainerState
from astrai.train.data import TrainData
from astrai.train.executors import EXECUTORS
from astrai.train.executors.process_group import (
    check_parallel,
    check_tensor_parallel,
    expected_world_size,
)
from astrai.train.model_source import ModelSource, resolve_model
from astrai.train.optim import build_optimizer, planned_groups
from astrai.train.plan import TrainPlan, make_plan
from astrai.train.precision import Precision, resolve_precision
from astrai.train.schedule import SCHEDULERS
from astrai.train.strategies import STRATEGIES, Strategy, StrategyInputs


@dataclass
class Prepared:
    """Everything validated and resolved once; nothing built or written yet."""

    config: TrainConfig
    data: TrainData
    source: ModelSource
    """Where the weights come from (preset, checkpoint, HF directory)."""
    plan: TrainPlan
    """World size, windows per epoch, total and warmup steps (what --dry-run prints)."""
    device: torch.device
    precision: Precision
    strategy_cls: type[Strategy]
    checkpoint_types: tuple[type[torch.nn.Module], ...]
    """Module classes whose activations are recomputed (empty: no checkpointing)."""
    adapter: Path | None = None
    """A PEFT adapter directory whose LoRA weights the run continues (--adapter, or the
    checkpoint's adapter/ on resume); None with --lora-rank: fresh adapters."""


def run_paths(config: TrainConfig) -> RunPaths:
    run_dir = Path(config.out)
    ckpt = Path(config.checkpoint.dir) if config.checkpoint.dir else run_dir / "checkpoints"
    return RunPaths(run_dir, ckpt)


def sampler_for(data: TrainData, config: TrainConfig, rank: int, world_size: int):
    """The seeded, rank-sharded sampler of the training set (shuffled per epoch)."""
    if data.sampler_fn is not None:
        return data.sampler_fn(len(data.dataset), config.seed, rank, world_size)
    from astrai.data.rdsampler import RDSampler

    return RDSampler(len(data.dataset), seed=config.seed, rank=rank, world_size=world_size,
                     shuffle=True)


def prepare(config: TrainConfig, data: TrainData, *, world_size: int | None = None,
            source: ModelSource | None = None, adapter: Path | None = None) -> Prepared:
    """Check the run makes sense; raise a one-line AstraiError if not. `world_size`:
    None = the launcher's WORLD_SIZE, or nnodes x nprocs before launching."""
    if world_size is None:
        world_size = expected_world_size(config)
    strategy_cls = STRATEGIES.get(config.strategy)
    if strategy_cls.dataset_kinds and data.kind not in strategy_cls.dataset_kinds:
        raise DataError(
            f"data: {data.path} is a '{data.kind}' dataset but strategy '{config.strategy}' "
            f"trains on {' or '.join(strategy_cls.dataset_kinds)} data; preprocess with "
            f"kind: {strategy_cls.dataset_kinds[0]} or choose another --strategy"
        )
    device = resolve_device(config.runtime.device)
    precision = resolve_precision(config.precision.mode, device,
                                  config.precision.optimizer_state_dtype,
                                  config.precision.update_mode)
    types = checkpoint_module_types(config.runtime.gradient_checkpointing_modules)
    check_parallel(config, world_size, device)
    if source is None:
        config.require("model")
        source = resolve_model(config.model, vocab_size=data.vocab_size, seq_len=data.seq_len,
                               seed=config.seed, overrides=config.model_overrides,
                               tokenizer_fingerprint=data.fingerprint, dataset=data.path)
    check_tensor_parallel(config, world_size, source.config)
    n = len(data.dataset)
    groups = None if config.lora.enabled else planned_groups(source.config, config,
                                                     strategy_cls.prepare_model)
    plan = make_plan(config=config, model_config=source.config, model_desc=source.desc,
                     dataset_kind=data.kind, dataset_len=n, seq_len=data.seq_len,
                     world_size=world_size, device=str(device), precision=precision.name,
                     param_groups=groups)
    if plan.windows_per_epoch == 0:
        raise DataError(
            f"data: {data.path} has {n} samples, fewer than one optimizer step needs "
            f"(batch_size {config.batch_size} x grad_accum_steps {config.grad_accum_steps} x "
            f"{world_size} process{'es' if world_size != 1 else ''}); lower them or add data"
        )
    adapter = adapter or (Path(config.lora.adapter) if config.lora.adapter else None)
    if adapter is not None:
        from astrai.model.adapter import read_adapter_spec

        read_adapter_spec(adapter)  # a bad adapter directory fails before anything is written
    return Prepared(config, data, source, plan, device, precision, strategy_cls,
                    types if config.runtime.gradient_checkpointing else (), adapter)


def with_adapters(model: torch.nn.Module, config: TrainConfig, adapter: Path | None
                  ) -> torch.nn.Module:
    """LoRA runs: freeze the model and add adapters (fresh, or `adapter`'s weights). The
    optimizer then sees only the trainable parameters (astrai.train.optim), so this is the
    one place a run chooses what it trains. A reward model's new score head stays trainable."""
    keep = ("score_head.",)
    if adapter is not None:
        from astrai.model.adapter import load_adapter

        load_adapter(model, adapter, seed=config.seed, train_also=keep)
    elif config.lora.spec is not None:
        from astrai.model.lora import apply_lora

        apply_lora(model, config.lora.spec, seed=config.seed, train_also=keep)
    return model


def schedule_options(config: TrainConfig) -> dict[str, Any]:
    """The options of the chosen schedule that the config sets (each takes only its own)."""
    return {"sgdr": {"cycle_steps": config.schedule.sgdr_cycle_steps},
            "wsd": {"decay_ratio": config.schedule.wsd_decay_ratio}}.get(config.schedule.name, {})


def build_context(p: Prepared, *, resume: dict[str, Any] | None = None
                  ) -> tuple[TrainContext, dict[str, Any]]:
    """Create executor, model, optimizer, scheduler, strategy; restore `resume` state
    ({"optimizer", "scheduler", "trainer_state"}) when given. Returns the context and the
    saved callback states (by callback name) to hand to the run's callbacks."""
    config, data, plan = p.config, p.data, p.plan
    torch.manual_seed(config.seed)
    tp = {"tp": config.runtime.tp} if config.runtime.tp > 1 else {}
    executor = EXECUTORS.get(config.runtime.parallel)(device=p.device, precision=p.precision,
                                              **tp, **config.runtime.executor_kwargs)
    if executor.world_size != plan.world_size:
        raise ConfigError(f"parallel: {executor.world_size} processes joined but the run was "
                          f"planned for {plan.world_size}; launch it with nnodes x nprocs "
                          "processes")

    def model_fn():
        # compiled in place before the executor wraps it (compile, then shard); the strategy
        # may first change the module (reward: a scalar head on the hidden states)
        model = p.strategy_cls.prepare_model(p.source.model_fn(), config)
        model = with_adapters(model, config, p.adapter)
        return apply_compile(model, config.runtime.compile, backend=config.runtime.compile_backend)

    def optimizer_fn(model):
        seed = rounding_seed(config.seed, executor.rank, config.runtime.parallel)
        return build_optimizer(model, config, p.precision.state_dtype, rounding_seed=seed)

    def scheduler_fn(optimizer):
        return SCHEDULERS.get(config.schedule.name)(
            optimizer, total_steps=plan.total_steps, warmup_steps=plan.warmup_steps,
            min_rate=config.optimizer.min_lr_value / config.optimizer.max_lr,
            **schedule_options(config))

    model, optimizer, scheduler = executor.prepare(model_fn, optimizer_fn, scheduler_fn)
    if resume is not None and resume.get("dcp") is not None:
        # every rank reads its own pieces of the weights and optimizer state, before the
        # strategy copies anything from the model (a reference, an old policy)
        from astrai.train.dcp_checkpoint import load_training_state

        load_training_state(model, optimizer, resume["dcp"])
    if p.checkpoint_types:
        apply_activation_checkpointing(model, p.checkpoint_types)
    coef = config.moe_aux_loss_coef
    if coef is None:
        coef = p.source.config.moe_aux_loss_coef
    inputs = StrategyInputs(config=config, data=data, device=p.device)
    strategy = p.strategy_cls(
        model, device=p.device, label_smoothing=config.label_smoothing, moe_aux_loss_coef=coef,
        **{**p.strategy_cls.setup_kwargs(inputs), **config.strategy_kwargs},
    )
    byte_lengths = None
    if data.eval_dataset is not None and data.tokenizer_dir is not None:
        from astrai.data.bpb import token_byte_lengths

        byte_lengths = token_byte_lengths(data.tokenizer_dir)
    ctx = TrainContext(
        config=config, model=model, model_config=p.source.config, optimizer=optimizer,
        scheduler=scheduler, strategy=strategy, executor=executor, train_data=data.dataset,
        sampler=sampler_for(data, config, executor.dp_rank, executor.dp_size),
        collate_fn=data.collate_fn, total_steps=plan.total_steps,
        windows_per_epoch=plan.windows_per_epoch, paths=run_paths(config),
        seq_len=data.seq_len, tokenizer_dir=data.tokenizer_dir, eval_data=data.eval_dataset,
        byte_lengths=byte_lengths,
        meta={"dataset": data.path, "dataset_kind": data.kind, "model_source": p.source.desc,
              "seq_len": data.seq_len, "tokenizer_fingerprint": data.fingerprint},
    )
    callback_states = restore(ctx, resume) if resume is not None else {}
    return ctx, callback_states


def restore(ctx: TrainContext, resume: dict[str, Any]) -> dict[str, Any]:
    from astrai.train.context import set_rng_state

    ts = resume["trainer_state"]
    if resume["optimizer"] is not None:  # None: a DCP checkpoint, loaded with the weights
        ctx.executor.load_optimizer_state_dict(ctx.optimizer, resume["optimizer"])
    restore_rounding(ctx.optimizer, ts.get("bf16_rounding"), ctx.executor.rank)
    ctx.scheduler.load_state_dict(resume["scheduler"])
    state = TrainerState(**ts["state"])
    state.epoch_batches = epoch_batches(state, ts.get("sampler"), ctx)
    if state.step > ctx.total_steps:
        raise ConfigError(f"checkpoint step {state.step} is past the run's {ctx.total_steps} "
                          "total steps")
    ctx.state = state
    ctx.strategy.load_state_dict(ts.get("strategy", {}))
    if ts.get("sampler") is not None:
        ctx.sampler.load_state_dict(ts["sampler"])
        ctx.boundary_sampler = ts["sampler"]
    if ts.get("rng") is not None:
        set_rng_state(ts["rng"])
        ctx.boundary_rng = ts["rng"]
    return ts.get("callbacks", {})


def epoch_batches(state: Any, sampler: dict | None, ctx: TrainContext) -> int:
    """This rank's micro-batches of the current epoch, from the sampler's global position
    when it has one (RDSampler: samples of the epoch consumed by all ranks together): the
    same count as saved on the same layout, and the right one when a resume changed the
    number of processes or the batch size (keeping the global batch)."""
    if not sampler or "world_size" not in sampler or sampler.get("epoch") != state.epoch:
        return state.epoch_batches  # another sampler, or saved at an epoch's end
    per_batch = ctx.config.batch_size * ctx.executor.dp_size
    return int(sampler["consumed"]) // per_batch
