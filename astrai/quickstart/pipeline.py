"""`run_quickstart(config)`: corpus -> tokenizer -> dataset -> sized training run ->
validation bits per byte -> a generated sample -> the next commands to try.

Each stage calls the same library function its own command does (`astrai tokenizer train`,
`astrai preprocess`, `astrai train`), so what the quickstart makes is what those commands
make: the run directory resumes with `astrai resume`, the checkpoint chats, benchmarks and
inspects like any other. Validation is the trainer's own (val_bpb of the strategy's
eval_summary: summed token NLL / ln 2 / UTF-8 bytes of the predicted tokens) on the
held-out split. Progress goes to `on_event`; the library prints nothing.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from astrai.errors import ConfigError
from astrai.quickstart.config import QuickstartConfig
from astrai.quickstart.corpus import find_corpus, text_bytes
from astrai.quickstart.sizing import (
    StepPlan,
    eval_seconds,
    fastest_threads,
    measure_step_seconds,
    size_steps,
)
from astrai.train.callbacks.base import Callback

STAGES = ("tokenizer", "preprocess", "size", "train", "validate", "sample")
"""The stages, in order; every one reports start and end (train also reports each step)."""

LOSS_PLOT = "loss.png"
"""The run's loss curve, written into OUT when matplotlib is installed."""

TAIL_S = 6.0
"""Seconds kept for what follows validation (checkpoint, engine start, the sample)."""


@dataclass
class StageEvent:
    stage: str
    """One of STAGES."""
    kind: Literal["start", "update", "end"]
    completed: float | None = None
    total: float | None = None
    info: str = ""
    """A short human-readable status: counts, loss, rate, result."""


EventFn = Callable[[StageEvent], None]


@dataclass
class QuickstartResult:
    """Everything the quickstart made and measured (also written to OUT/summary.json)."""

    out: str
    tokenizer: str
    dataset: str
    run_dir: str
    checkpoint: str | None
    vocab_size: int
    params: int
    train_rows: int
    val_rows: int
    steps: int
    step_s: float | None
    """Measured seconds per training step used to size the run (None with --steps)."""
    threads: int
    """CPU threads the run used."""
    full_steps: int | None
    """The recipe's full step count; more than `steps` when the time budget cut the run."""
    full_budget_s: float | None
    """--time-budget that would have fit the full recipe at the measured speed, when the
    budget cut more than a quarter of its steps (else None)."""
    fallback_from_steps: int | None
    """Steps the budget gave the recipe's model when too few for it, so the smaller fallback
    model (QuickstartConfig.fallback_overrides) was trained instead; None = the recipe's."""
    consumed_tokens: int
    val_loss: float | None
    val_ppl: float | None
    val_bpb: float | None
    """Bits per UTF-8 byte on the held-out plays (the trainer's validation metric)."""
    val_bytes: int
    """UTF-8 bytes of held-out text."""
    sample_prompt: str
    sample: str | None
    stage_s: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0
    preempted: bool = False
    """Stopped by Ctrl-C/SIGTERM during training (a checkpoint of that step was saved)."""
    commands: list[dict[str, str]] = field(default_factory=list)
    """The next commands to try on what was made: [{"what", "command"}]."""
    loss_plot: str | None = None
    """OUT/loss.png, the run's loss curve (None when matplotlib is not installed)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _TrainEvents(Callback):
    """Relays the trainer's steps (and the validation at the last step) as stage events."""

    name = "quickstart_events"

    def __init__(self, emit: EventFn) -> None:
        self.emit = emit

    def on_train_begin(self, ctx) -> None:
        self.emit(StageEvent("train", "update", ctx.state.step, ctx.total_steps))

    def on_optimizer_step(self, ctx, control) -> None:
        # The trainer validates after the last step's update and before its on_step_end,
        # so the last step's optimizer hook is where training ends and validation begins.
        if ctx.state.step + 1 >= ctx.total_steps:
            loss = ctx.last_loss
            self.emit(StageEvent("train", "end", ctx.total_steps, ctx.total_steps,
                                 "" if loss is None else f"loss {loss:.3f}"))
            self.emit(StageEvent("validate", "start"))

    def on_step_end(self, ctx, report, control) -> None:
        if report.done:
            bpb = report.eval.get("val_bpb")
            self.emit(StageEvent("validate", "end", info="" if bpb is None
                                 else f"{bpb:.3f} bits/byte"))
            return
        tps = report.tokens / max(1e-9, report.step_time)
        loss = "" if report.loss is None else f"loss {report.loss:.3f} · "
        self.emit(StageEvent("train", "update", report.step, ctx.total_steps,
                             f"{loss}{tps:,.0f} tok/s"))


def _prepare_out(config: QuickstartConfig) -> Path:
    out = Path(config.out)
    ours = ("tokenizer", "data", "run", "summary.json", LOSS_PLOT)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} is a file; choose a directory")
    if out.is_dir() and any(out.iterdir()):
        if not config.overwrite:
            raise ConfigError(f"--out: {out} is not empty; pass --overwrite to replace a "
                              "previous quickstart there, or choose another --out")
        others = sorted(p.name for p in out.iterdir() if p.name not in ours)
        if others:
            raise ConfigError(f"--out: {out} holds files the quickstart did not make "
                              f"({', '.join(others[:3])}); --overwrite only replaces a "
                              "previous quickstart's directory")
        for name in ours:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def next_commands(checkpoint: str, run_dir: str) -> list[dict[str, str]]:
    """The commands printed at the end, on what the quickstart made."""
    import shlex

    ck, run = shlex.quote(checkpoint), shlex.quote(run_dir)
    return [
        {"what": "chat with the model (a base model: it continues your text)",
         "command": f"astrai chat {ck} --no-template"},
        {"what": "continue the run exactly after an interruption (Ctrl-C saves a checkpoint)",
         "command": f"astrai resume {run}"},
        {"what": "check the weights for BF16 lock-in, overflow and dead zones",
         "command": f"astrai inspect-weights {ck}"},
        {"what": "benchmark serving it (TTFT, TPOT, throughput)",
         "command": f"astrai serve-bench {ck} --num-prompts 16 --input-len 32:128 "
                    "--output-len 32:64"},
    ]


def run_quickstart(config: QuickstartConfig, on_event: EventFn | None = None
                   ) -> QuickstartResult:
    """Run every stage into config.out; see the module docstring. The CPU thread count
    chosen for the run is restored afterwards."""
    threads = torch.get_num_threads()
    try:
        return _run(config, on_event)
    finally:
        torch.set_num_threads(threads)


def _run(config: QuickstartConfig, on_event: EventFn | None) -> QuickstartResult:
    from astrai.atomic import write_json_atomic
    from astrai.config.preprocess import load_spec
    from astrai.config.train import TrainConfig
    from astrai.data.bpe import SpecialTokens, train_tokenizer
    from astrai.data.builder import build_dataset
    from astrai.data.chat import CHAT_MARKERS
    from astrai.device import resolve_device
    from astrai.model.stats import param_counts
    from astrai.train.data import open_train_data
    from astrai.train.model_source import resolve_model
    from astrai.train.plan import windows_per_epoch
    from astrai.train.run import train

    t0 = time.perf_counter()
    stage_s: dict[str, float] = {}
    started: dict[str, float] = {}

    def emit(ev: StageEvent) -> None:
        # Stage times for the summary come from the events, so validation (which runs
        # inside the trainer's last step) is timed apart from training.
        now = time.perf_counter()
        if ev.kind == "start":
            started[ev.stage] = now
        elif ev.kind == "end" and ev.stage in started:
            stage_s[ev.stage] = round(now - started[ev.stage], 2)
        if on_event is not None:
            on_event(ev)

    corpus = find_corpus(config.corpus)
    device = resolve_device(config.device)
    out = _prepare_out(config)
    tok_dir, data_dir, run_dir = out / "tokenizer", out / "data", out / "run"

    # -- tokenizer ------------------------------------------------------------------------
    emit(StageEvent("tokenizer", "start", info=f"byte-level BPE, {config.vocab_size} tokens"))
    tok = train_tokenizer([corpus.train], config.vocab_size, tok_dir, "text",
                          SpecialTokens(extra=list(CHAT_MARKERS)))
    emit(StageEvent("tokenizer", "end", info=f"{tok.vocab_size:,} tokens"))

    # -- preprocess -----------------------------------------------------------------------
    emit(StageEvent("preprocess", "start"))
    spec = load_spec(data={
        "kind": "pretrain", "inputs": [str(corpus.train)], "val_inputs": [str(corpus.val)],
        "tokenizer": str(tok_dir), "output": str(data_dir), "max_seq_len": config.seq_len,
        "packing": {"mode": "bfd_split"}, "position_ids": "doc_reset", "format": "h5",
    })

    def on_build(ev: dict) -> None:
        emit(StageEvent("preprocess", "update", ev["tokens"], None,
                        f"{ev['split']}: {ev['records']:,} records, {ev['tokens']:,} tokens"))

    built = build_dataset(spec, progress=on_build).to_dict()
    splits = built["splits"]
    emit(StageEvent("preprocess", "end", info=(
        f"{splits['train']['samples']:,} train + {splits['val']['samples']:,} val rows of "
        f"{config.seq_len} tokens")))

    # -- size the run ---------------------------------------------------------------------
    emit(StageEvent("size", "start", info="timing training steps"))
    data = open_train_data(str(data_dir))
    overrides = {**config.model_overrides, "max_seq_len": data.seq_len}
    per_epoch = windows_per_epoch(len(data.dataset), config.batch_size, 1)
    val_tokens = int(splits["val"]["tokens"])

    def model_source(changes: dict[str, Any]):
        return resolve_model(config.model, vocab_size=data.vocab_size, seq_len=data.seq_len,
                             seed=config.seed, overrides=changes)

    def size_for(step_s: float) -> StepPlan:
        left = (config.time_budget_s - (time.perf_counter() - t0)
                - eval_seconds(step_s, val_tokens, config.batch_size * data.seq_len) - TAIL_S)
        return size_steps(left, step_s, steps_per_epoch=per_epoch,
                          max_epochs=config.max_epochs, threads=torch.get_num_threads())

    def measure(model_config) -> float:
        return measure_step_seconds(model_config, config.batch_size, data.seq_len,
                                    device=device, seed=config.seed,
                                    optimizer=config.optimizer)

    train_overrides = overrides
    source = model_source(train_overrides)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    fallback_from: int | None = None
    if config.steps is not None:
        plan = recipe_plan = StepPlan(config.steps, None, torch.get_num_threads(), None, None)
    else:
        if config.threads is None:
            threads, step_s = fastest_threads(source.config, config.batch_size, data.seq_len,
                                              device=device, seed=config.seed,
                                              optimizer=config.optimizer)
            torch.set_num_threads(threads)
        else:
            step_s = measure(source.config)
        plan = recipe_plan = size_for(step_s)
        if (config.fallback_overrides and recipe_plan.budget_cut
                and recipe_plan.steps < config.fallback_below_steps):
            train_overrides = {**overrides, **config.fallback_overrides}
            source, fallback_from = model_source(train_overrides), recipe_plan.steps
            plan = size_for(measure(source.config))
    why = {"epochs": f" (capped at {config.max_epochs:g} epochs)",
           "minimum": " (the minimum: the budget is too short for this machine)"}
    if plan.budget_cut and plan.capped_by is None:
        why[""] = f" (cut by the time budget: the recipe is {plan.full_steps} steps)"
    full_budget_s = None
    if recipe_plan.cut_short and recipe_plan.step_s is not None:
        extra = (recipe_plan.full_steps - recipe_plan.steps) * recipe_plan.step_s
        full_budget_s = float(math.ceil((config.time_budget_s + extra) / 10) * 10)
    step_info = "" if plan.step_s is None else \
        f" at {plan.step_s:.2f} s/step, {plan.threads} thread{'s' * (plan.threads > 1)}"
    model_info = "" if fallback_from is None else (
        f" of the smaller fallback model (the recipe's would get {fallback_from})")
    emit(StageEvent("size", "end", info=f"{plan.steps} steps{model_info}{step_info}"
                    f"{why.get(plan.capped_by or '', '')}"))

    # -- train (+ validate at the last step) ------------------------------------------------
    tcfg = TrainConfig.from_dict({
        "strategy": "seq", "data": str(data_dir.resolve()), "model": config.model,
        "model_overrides": train_overrides, "out": str(run_dir.resolve()),
        "batch_size": config.batch_size, "max_steps": plan.steps,
        "max_lr": config.max_lr, "min_lr": min(config.min_lr, config.max_lr),
        "warmup_steps": min(config.warmup_steps, plan.steps // 4),
        "optimizer": config.optimizer,
        **({"muon_lr": config.muon_lr, "muon_adjust_lr": config.muon_adjust_lr}
           if config.optimizer == "muon" else {}),
        "weight_decay": config.weight_decay, "adam_beta1": 0.9, "adam_beta2": 0.95,
        "max_grad_norm": 1.0,
        "schedule": "cosine", "ckpt_interval": 0, "log_interval": 10,
        "seed": config.seed, "device": config.device,
    }, source="quickstart train config")
    emit(StageEvent("train", "start", 0, plan.steps))
    summary = train(tcfg, data=data, callbacks=[_TrainEvents(emit)])
    val = summary.validation

    # -- sample ---------------------------------------------------------------------------
    sample = None
    if summary.checkpoint and not summary.preempted:
        emit(StageEvent("sample", "start", info=f"{config.sample_tokens} tokens"))
        sample = generate_sample(summary.checkpoint, config, device)
        emit(StageEvent("sample", "end"))

    ckpt_shown = None if summary.checkpoint is None else str(
        run_dir / "checkpoints" / Path(summary.checkpoint).name)
    result = QuickstartResult(
        out=str(out), tokenizer=str(tok_dir), dataset=str(data_dir), run_dir=str(run_dir),
        checkpoint=ckpt_shown, vocab_size=tok.vocab_size,
        params=param_counts(source.config).total,
        train_rows=int(splits["train"]["samples"]), val_rows=int(splits["val"]["samples"]),
        steps=summary.steps, step_s=None if plan.step_s is None else round(plan.step_s, 4),
        threads=plan.threads, full_steps=recipe_plan.full_steps, full_budget_s=full_budget_s,
        fallback_from_steps=fallback_from,
        consumed_tokens=summary.consumed_tokens,
        val_loss=val.get("val_loss"), val_ppl=val.get("val_ppl"), val_bpb=val.get("val_bpb"),
        val_bytes=text_bytes(corpus.val), sample_prompt=config.sample_prompt, sample=sample,
        stage_s=stage_s, preempted=summary.preempted,
        commands=next_commands(ckpt_shown, str(run_dir)) if ckpt_shown else [],
    )
    result.loss_plot = plot_loss(run_dir, out / LOSS_PLOT)
    result.total_s = round(time.perf_counter() - t0, 2)
    write_json_atomic(out / "summary.json", result.to_dict())
    return result


def plot_loss(run_dir: Path, path: Path) -> str | None:
    """The run's training loss (and validation loss) as a PNG; None without matplotlib."""
    from astrai.viz import has_matplotlib

    if not has_matplotlib():
        return None
    from astrai.viz.curves import plot_runs
    from astrai.viz.figure import save_figure

    fig = plot_runs([run_dir], metrics=["loss"], size=(800, 450))
    return str(save_figure(fig, path))


def generate_sample(checkpoint: str | Path, config: QuickstartConfig, device: Any) -> str:
    """The prompt and its continuation by the finished checkpoint (the inference engine)."""
    from astrai.infer.engine import Engine
    from astrai.infer.params import SamplingParams

    engine = Engine.from_checkpoint(checkpoint, device=str(device), seed=config.seed)
    tok = engine.tokenizer
    ids = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(config.sample_prompt)
    room = engine.max_context - len(ids)
    params = SamplingParams(max_tokens=max(1, min(config.sample_tokens, room)),
                            temperature=config.temperature, top_k=40, top_p=0.95,
                            seed=config.seed)
    (res,) = engine.generate([ids], params)
    return config.sample_prompt + res.text

