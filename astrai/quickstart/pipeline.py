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

import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from astrai.errors import ConfigError
from astrai.quickstart.config import QuickstartConfig
from astrai.quickstart.corpus import find_corpus, text_bytes
from astrai.quickstart.plan import Measurements, Plan, plan
from astrai.quickstart.sizing import fastest_threads, measure_step_seconds
from astrai.train.callbacks.base import Callback

STAGES = ("tokenizer", "preprocess", "size", "train", "validate", "sample")
"""The stages, in order; every one reports start and end (train also reports each step)."""

LOSS_PLOT = "loss.png"
"""The run's loss curve, written into OUT when matplotlib is installed."""

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


SFT_SPEC, SFT_SPEC_MAX_LEN = "examples/specs/sft.json", 256
"""The bundled SFT spec the next commands fine-tune with, and its max_seq_len."""


def next_commands(checkpoint: str, run_dir: str,
                  seq_len: int = SFT_SPEC_MAX_LEN) -> list[dict[str, str]]:
    """The commands printed at the end, on what the quickstart made (`seq_len`: the
    model's context, which the fine-tuning rows must fit)."""
    import shlex

    ck, run = shlex.quote(checkpoint), shlex.quote(run_dir)
    # Fine-tuning data must be tokenized by the model's own tokenizer (the bundled spec
    # names another); beside OUT, not in it, so that --overwrite can replace OUT later.
    out = Path(run_dir).parent
    sft = out.with_name(f"{out.name}-sft")
    sft_data, sft_run = shlex.quote(str(sft / "data")), shlex.quote(str(sft / "run"))
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
        {"what": "fine-tune it on the bundled chat data (from the repository root): first "
                 "tokenize the data with the model's own tokenizer",
         "command": f"astrai preprocess {SFT_SPEC} --set tokenizer={ck} "
                    f"--set output={sft_data}"
                    + (f" --set max_seq_len={seq_len}" if seq_len < SFT_SPEC_MAX_LEN else "")},
        {"what": "then train it on that data (SFT)",
         "command": f"astrai train --strategy sft --data {sft_data} --model {ck} "
                    f"--out {sft_run}"},
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


class _Clock:
    """Stage events to the caller, and each stage's seconds for the summary (validation,
    which runs inside the trainer's last step, is timed apart from training)."""

    def __init__(self, on_event: EventFn | None) -> None:
        self.t0 = time.perf_counter()
        self.on_event = on_event
        self.stage_s: dict[str, float] = {}
        self._started: dict[str, float] = {}

    def __call__(self, ev: StageEvent) -> None:
        now = time.perf_counter()
        if ev.kind == "start":
            self._started[ev.stage] = now
        elif ev.kind == "end" and ev.stage in self._started:
            self.stage_s[ev.stage] = round(now - self._started[ev.stage], 2)
        if self.on_event is not None:
            self.on_event(ev)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _run(config: QuickstartConfig, on_event: EventFn | None) -> QuickstartResult:
    from astrai.device import resolve_device
    from astrai.train.data import open_train_data
    from astrai.train.run import train

    emit = _Clock(on_event)
    corpus = find_corpus(config.corpus)
    device = resolve_device(config.device)
    out = _prepare_out(config)
    tok_dir, data_dir, run_dir = out / "tokenizer", out / "data", out / "run"
    vocab_size = _tokenizer_stage(config, corpus, tok_dir, emit)
    splits = _preprocess_stage(config, corpus, tok_dir, data_dir, emit)
    data = open_train_data(str(data_dir))
    run_plan = _size_stage(config, data, int(splits["val"]["tokens"]), device, emit)
    emit(StageEvent("train", "start", 0, run_plan.steps.steps))
    summary = train(_train_config(config, run_plan, data_dir, run_dir), data=data,
                    callbacks=[_TrainEvents(emit)])
    sample = None
    if summary.checkpoint and not summary.preempted:
        emit(StageEvent("sample", "start", info=f"{config.sample_tokens} tokens"))
        sample = generate_sample(summary.checkpoint, config, device)
        emit(StageEvent("sample", "end"))
    result = _result(config, corpus, out, vocab_size, splits, run_plan, summary, sample,
                     _model_source(config, data, run_plan.overrides).config)
    result.stage_s = emit.stage_s
    result.loss_plot = plot_loss(run_dir, out / LOSS_PLOT)
    result.total_s = round(emit.elapsed(), 2)
    from astrai.atomic import write_json_atomic

    write_json_atomic(out / "summary.json", result.to_dict())
    return result


def _tokenizer_stage(config: QuickstartConfig, corpus: Any, tok_dir: Path,
                     emit: EventFn) -> int:
    from astrai.data.bpe import SpecialTokens, train_tokenizer
    from astrai.data.chat import CHAT_MARKERS

    emit(StageEvent("tokenizer", "start", info=f"byte-level BPE, {config.vocab_size} tokens"))
    tok = train_tokenizer([corpus.train], config.vocab_size, tok_dir, "text",
                          SpecialTokens(extra=list(CHAT_MARKERS)))
    emit(StageEvent("tokenizer", "end", info=f"{tok.vocab_size:,} tokens"))
    return tok.vocab_size


def _preprocess_stage(config: QuickstartConfig, corpus: Any, tok_dir: Path, data_dir: Path,
                      emit: EventFn) -> dict[str, Any]:
    """The train and validation splits of the packed dataset (their manifest entries)."""
    from astrai.config.preprocess import load_spec
    from astrai.data.builder import build_dataset

    emit(StageEvent("preprocess", "start"))
    spec = load_spec(data={
        "kind": "pretrain", "inputs": [str(corpus.train)], "val_inputs": [str(corpus.val)],
        "tokenizer": str(tok_dir), "output": str(data_dir), "max_seq_len": config.seq_len,
        "packing": {"mode": "bfd_split"}, "position_ids": "doc_reset", "format": "h5",
    })

    def on_build(ev: dict) -> None:
        emit(StageEvent("preprocess", "update", ev["tokens"], None,
                        f"{ev['split']}: {ev['records']:,} records, {ev['tokens']:,} tokens"))

    splits = build_dataset(spec, progress=on_build).to_dict()["splits"]
    emit(StageEvent("preprocess", "end", info=(
        f"{splits['train']['samples']:,} train + {splits['val']['samples']:,} val rows of "
        f"{config.seq_len} tokens")))
    return splits


def _model_source(config: QuickstartConfig, data: Any, overrides: dict[str, Any]):
    from astrai.train.model_source import resolve_model

    return resolve_model(config.model, vocab_size=data.vocab_size, seq_len=data.seq_len,
                         seed=config.seed, overrides=overrides)


def _size_stage(config: QuickstartConfig, data: Any, val_tokens: int, device: Any,
                emit: _Clock) -> Plan:
    """Time the recipe's step (and the fallback's when the plan asks), then plan."""
    from astrai.train.plan import windows_per_epoch

    emit(StageEvent("size", "start", info="timing training steps"))
    base = {**config.model_overrides, "max_seq_len": data.seq_len}

    def measure(overrides: dict[str, Any]) -> float:
        return measure_step_seconds(_model_source(config, data, overrides).config,
                                    config.batch_size, data.seq_len, device=device,
                                    seed=config.seed, optimizer=config.optimizer)

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    step_s = None
    if config.steps is None and config.threads is None:
        threads, step_s = fastest_threads(
            _model_source(config, data, base).config, config.batch_size, data.seq_len,
            device=device, seed=config.seed, optimizer=config.optimizer)
        torch.set_num_threads(threads)
    elif config.steps is None:
        step_s = measure(base)
    m = Measurements(emit.elapsed(), torch.get_num_threads(),
                     windows_per_epoch(len(data.dataset), config.batch_size, 1), val_tokens,
                     config.batch_size * data.seq_len, step_s)
    run_plan = plan(config, m, base)
    if run_plan.wants_fallback:
        fallback = measure({**base, **config.fallback_overrides})
        run_plan = plan(config, replace(m, elapsed_s=emit.elapsed(), fallback_step_s=fallback),
                        base)
    emit(StageEvent("size", "end", info=run_plan.info))
    return run_plan


def _train_config(config: QuickstartConfig, run_plan: Plan, data_dir: Path, run_dir: Path):
    from astrai.config.train import TrainConfig

    steps = run_plan.steps.steps
    muon = ({"muon_lr": config.muon_lr, "muon_adjust_lr": config.muon_adjust_lr}
            if config.optimizer == "muon" else {})
    return TrainConfig.from_dict({
        "strategy": "seq", "data": str(data_dir.resolve()), "model": config.model,
        "model_overrides": run_plan.overrides, "out": str(run_dir.resolve()),
        "batch_size": config.batch_size, "max_steps": steps, "seed": config.seed,
        "optimizer": {"name": config.optimizer, "max_lr": config.max_lr,
                      "min_lr": min(config.min_lr, config.max_lr), **muon,
                      "weight_decay": config.weight_decay, "adam_beta1": 0.9,
                      "adam_beta2": 0.95, "max_grad_norm": 1.0},
        "schedule": {"name": "cosine", "warmup_steps": min(config.warmup_steps, steps // 4)},
        "checkpoint": {"interval": 0}, "logging": {"log_interval": 10},
        "runtime": {"device": config.device},
    }, source="quickstart train config")


def _result(config: QuickstartConfig, corpus: Any, out: Path, vocab_size: int,
            splits: dict[str, Any], run_plan: Plan, summary: Any, sample: str | None,
            model_config: Any) -> QuickstartResult:
    from astrai.model.stats import param_counts

    run_dir = out / "run"
    ckpt = None if summary.checkpoint is None else str(
        run_dir / "checkpoints" / Path(summary.checkpoint).name)
    val, p = summary.validation, run_plan.steps
    return QuickstartResult(
        out=str(out), tokenizer=str(out / "tokenizer"), dataset=str(out / "data"),
        run_dir=str(run_dir), checkpoint=ckpt, vocab_size=vocab_size,
        params=param_counts(model_config).total,
        train_rows=int(splits["train"]["samples"]), val_rows=int(splits["val"]["samples"]),
        steps=summary.steps, step_s=None if p.step_s is None else round(p.step_s, 4),
        threads=p.threads, full_steps=run_plan.recipe.full_steps,
        full_budget_s=run_plan.full_budget_s, fallback_from_steps=run_plan.fallback_from,
        consumed_tokens=summary.consumed_tokens,
        val_loss=val.get("val_loss"), val_ppl=val.get("val_ppl"), val_bpb=val.get("val_bpb"),
        val_bytes=text_bytes(corpus.val), sample_prompt=config.sample_prompt, sample=sample,
        preempted=summary.preempted,
        commands=next_commands(ckpt, str(run_dir), config.seq_len) if ckpt else [],
    )


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

