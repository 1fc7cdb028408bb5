"""`astrai train`: a thin layer over astrai.train.run.

Every TrainConfig field is a long option named by its flat name (`batch_size` ->
`--batch-size`, `optimizer.max_lr` -> `--max-lr`: astrai.config.section) whose help is the
field's one-line doc, and each section of the config is one --help panel, so the CLI, the
YAML/JSON config keys and the config class never drift apart. Precedence: field defaults <
`--config FILE` < flags given on the command line.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from astrai_cli.options import checkpoint_path, log_console, threads_option, use_threads

# Extra spellings, as some training launchers name these options.
ALIASES = {
    "strategy": ["--train-type"], "data": ["--data-root-path"], "model": ["--param-path"],
    "batch_size": ["--batch-per-device"], "seed": ["--random-seed"],
    "parallel": ["--parallel-mode"], "nprocs": ["--nproc-per-node"],
}
RUN_PANEL = "Run"
"""--help panel of the top-level fields and of the command's own options."""
# TAB after --strategy / --parallel: the registries' names, listed here so completion
# imports neither torch nor astrai.train (tests/cli/test_completion.py compares them).
STRATEGY_NAMES = ("seq", "sft", "dpo", "grpo", "reward", "online-grpo", "online-dpo")
EXECUTOR_NAMES = ("none", "ddp", "fsdp")


def _kind(annotation: Any) -> tuple[str, Any]:
    """(scalar | bool | list | dict, click type) of a field annotation."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _kind(args[0])
    if annotation is bool:
        return "bool", bool
    if origin is typing.Literal:
        return "scalar", str
    if origin is dict or annotation is dict:
        return "dict", str
    if origin is list:
        inner = args[0] if args else str
        return "list", inner if inner in (int, float, str) else str
    if annotation in (int, float, str):
        return "scalar", annotation
    return "scalar", str


def value_completer(name: str, annotation: Any) -> Any:
    """Shell completion of an option's values (TAB after `--strategy `): strategy and
    executor names from their registries, a Literal field's choices; None for free values."""
    lit = choices(annotation)
    if name not in ("strategy", "parallel") and lit is None:
        return None

    def complete(incomplete: str) -> list[str]:
        if name == "strategy":
            names = STRATEGY_NAMES
        elif name == "parallel":
            names = EXECUTOR_NAMES
        else:
            names = lit.split("|")
        return [n for n in names if n.startswith(incomplete)]

    return complete


def train_fields() -> dict[str, Any]:
    """TrainConfig's fields by flat name (astrai.config.section.FlatField), class order."""
    from astrai.config.section import flat_fields
    from astrai.config.train import TrainConfig

    return flat_fields(TrainConfig)


def panels() -> dict[str, str]:
    """Flat name -> --help panel: the title of the field's section (Run at the top)."""
    return {name: f.panel or RUN_PANEL for name, f in train_fields().items()}


def _option(name: str, field: Any, panel: str) -> tuple[inspect.Parameter, str]:
    kind, typ = _kind(field.annotation)
    flag = "--" + name.replace("_", "-")
    help_text = " ".join((field.description or "").split())
    default = field.get_default(call_default_factory=True)
    if kind == "bool":
        decls = [f"{flag}/--no-{flag[2:]}"]
        annotation: Any = bool | None
    elif kind in ("list", "dict"):
        decls = [flag]
        annotation = list[typ] | None
        help_text += " Repeatable" + (" (key=value)." if kind == "dict" else ".")
    else:
        decls = [flag, *ALIASES.get(name, [])]
        annotation = typ | None
    if default not in (None, [], {}, "") and kind != "bool":
        help_text += f" (default {default})"
    elif kind == "bool":
        help_text += f" (default {'on' if default else 'off'})"
    param = inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
        default=typer.Option(None, *decls, help=help_text, show_default=False,
                             rich_help_panel=panel, metavar=choices(field.annotation),
                             autocompletion=value_completer(name, field.annotation)),
    )
    return param, kind


def config_options() -> tuple[list[inspect.Parameter], dict[str, str]]:
    """One keyword parameter (typer.Option, default None = not given) per TrainConfig field,
    by flat name; sections' fields follow in class order, so each panel is contiguous."""
    params, kinds = [], {}
    where = panels()
    for name, f in train_fields().items():
        param, kinds[name] = _option(name, f.field, where[name])
        params.append(param)
    return params, kinds


def choices(annotation: Any) -> str | None:
    """`a|b|c` for a Literal field (its --help metavar), else None."""
    lit = next((a for a in (annotation, *typing.get_args(annotation))
                if typing.get_origin(a) is typing.Literal), None)
    return "|".join(str(v) for v in typing.get_args(lit)) if lit is not None else None


def overrides_from(values: dict[str, Any], kinds: dict[str, str]) -> dict[str, Any]:
    """Flag values given on the command line -> TrainConfig overrides."""
    out = {}
    for name, value in values.items():
        if value is None or (kinds[name] in ("list", "dict") and not value):
            continue
        if kinds[name] == "dict":
            from astrai.config.pairs import parse_pairs

            value = parse_pairs(value, "--" + name.replace("_", "-"), "n_layers=2")
        out[name] = value
    return out


# -- rendering ------------------------------------------------------------------------------

def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _group_row(g: dict[str, Any]) -> str:
    """`8 tensors, 524,288 params, peak lr 0.0003 (match_rms_adamw), decay 0.1`."""
    scale = f" ({g['adjust_lr']})" if g.get("adjust_lr") else ""
    return (f"{g['tensors']} tensors, {g['params']:,} params, peak lr {g['lr']:g}{scale}, "
            f"decay {g['weight_decay']:g}")


def _update(plan: dict[str, Any]) -> str:
    """`, stochastic bf16 update` for bf16-true runs that do not round to nearest."""
    update = plan.get("bf16_update", "nearest")
    return f", {update} bf16 update" if update != "nearest" else ""


def _bytes_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """`bytes / parameter` rows: weights + gradients + optimizer state of each mode, the
    run's own marked."""
    table = plan.get("bytes_per_param")
    if not table:
        return []
    update = plan.get("bf16_update", "nearest")
    mine = plan["precision"] if plan["precision"] != "bf16-true" else f"bf16-true {update}"
    return [("bytes / parameter", "weights + gradients + optimizer state")] + [
        (f"  {mode}" + (" (this run)" if mode == mine else ""),
         f"{b['weights']:g} + {b['gradients']:g} + {b['optimizer']:g} = {b['total']:g}")
        for mode, b in table.items()]


def _count(n: int, one: str, many: str) -> str:
    """`1 process`, `2 processes`."""
    return f"{n} {one if n == 1 else many}"


def render_plan(plan: dict[str, Any], console: Console) -> None:
    t = Table(title="training plan (dry run: nothing trained)", title_justify="left",
              show_header=False)
    t.add_column(style="bold")
    t.add_column()
    rows = [
        ("strategy", plan["strategy"]),
        ("dataset", (f"{plan['dataset']} ({plan['dataset_kind']}, "
                     f"{plan['dataset_samples']:,} samples)")),
        ("model", f"{plan['model']} ({plan['params'] / 1e6:.2f}M params"
                  + (f", LoRA: {plan['trainable_params'] / 1e6:.3f}M trainable)"
                     if plan.get("trainable_params") else ")")),
        ("sequence length", f"{plan['seq_len']:,}"),
        ("effective batch", (f"{plan['effective_batch']} = "
                             f"{_count(plan['world_size'], 'process', 'processes')} x "
                             f"{plan['batch_size']} x {plan['grad_accum_steps']} accumulation")),
        ("tokens per step", f"{plan['tokens_per_step']:,}"),
        ("steps per epoch", f"{plan['windows_per_epoch']:,}"),
        ("total steps", (f"{plan['total_steps']:,} ({plan['epochs']} epochs, "
                         f"{plan['warmup_steps']} warmup)")),
        ("total tokens", f"{plan['total_tokens']:,}"),
        ("schedule", f"{plan['schedule']} {plan['max_lr']:g} -> {plan['min_lr']:g}"),
        ("optimizer", plan.get("optimizer", "adamw")),
        *[(f"  {g['name']}", _group_row(g)) for g in plan.get("param_groups") or []],
        ("device / precision", (f"{plan['device']} / {plan['precision']} (optimizer "
                                f"moments {plan.get('optimizer_state_dtype', 'fp32')}"
                                + _update(plan) + ")")),
        *_bytes_rows(plan),
        ("parallel", (f"{plan.get('parallel', 'none')}: "
                      f"{_count(plan['world_size'], 'process', 'processes')} "
                      f"({_count(plan.get('nnodes', 1), 'node', 'nodes')} x "
                      f"{plan.get('nprocs', 1)})"
                      + (f", tp {plan['tp']} x dp {plan['world_size'] // plan['tp']}"
                         if plan.get("tp", 1) > 1 else ""))),
        ("FLOPs per token", f"{plan['flops_per_token']:,}"),
        ("memory estimate", ", ".join(f"{k} {_gib(v)}" for k, v in plan["memory_bytes"].items())),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


def render_summary(s: dict[str, Any], console: Console) -> None:
    title = "training resumed and finished" if s.get("resumed_from") else "training finished"
    if s.get("preempted"):
        title = "training stopped (preempted)"
    elif s.get("resumed_from") and not s.get("steps_run"):
        console.print(f"nothing to resume: {s['run_dir']} already finished at step "
                      f"{s['steps']:,} / {s['total_steps']:,} (checkpoint {s['checkpoint']}). "
                      "To train further, start a new run from that checkpoint with "
                      "astrai train --model CHECKPOINT.", soft_wrap=True)
        return
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    loss = s["final_loss"]
    rows = [("run", s["run_dir"]), ("checkpoint", s["checkpoint"] or "-"),
            ("steps", f"{s['steps']:,} / {s['total_steps']:,}"),
            ("final loss", "-" if loss is None else f"{loss:.4f}")]
    for k, v in s.get("validation", {}).items():
        rows.append((k, f"{v:.4f}"))
    rows += [("tokens", f"{s['consumed_tokens']:,}"),
             ("time", f"{s['elapsed_s']:.1f} s ({s['tokens_per_s']:,.0f} tokens/s)")]
    if s.get("resumed_from"):
        rows.append(("resumed from", s["resumed_from"]))
    if s.get("skipped_steps"):
        rows.append(("skipped steps", str(s["skipped_steps"])))
    for k, v in rows:
        t.add_row(k, str(v))
    console.print(t)
    if s.get("preempted"):
        console.print(f"continue with: astrai resume {s['run_dir']}", soft_wrap=True)


def emit(result: dict[str, Any], as_json: bool, render) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        render(result, log_console())


# -- multi-process launch (docs/distributed.md) ---------------------------------------------

LAUNCH_HELP = {
    "rdzv_endpoint": "Multi-node: HOST:PORT of the rendezvous, the same on every node "
                     "(default: this host, a free port).",
    "rdzv_id": "Multi-node: job id shared by the nodes (default: from the run directory).",
    "shutdown_timeout": "Seconds the workers get after SIGTERM/SIGINT to save their "
                        "checkpoint before being killed (default 600).",
    "node_rank": "Multi-node: this node's index (0 hosts the rendezvous).",
    "max_restarts": "Restart the workers up to K times after a failure (from the newest "
                    "checkpoint).",
}
INT_LAUNCH_OPTIONS = ("shutdown_timeout", "node_rank", "max_restarts")


def launch_params() -> list[inspect.Parameter]:
    """Per-invocation options of the launcher (not saved with the run), in the panel of
    --parallel / --nprocs / --nnodes."""
    from astrai.config.train_sections import RuntimeOptions

    out = []
    for name, help_text in LAUNCH_HELP.items():
        typ = int | None if name in INT_LAUNCH_OPTIONS else str | None
        out.append(inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, annotation=typ,
            default=typer.Option(None, "--" + name.replace("_", "-"), help=help_text,
                                 show_default=False, rich_help_panel=RuntimeOptions.panel)))
    return out


def launch_options(values: dict[str, Any]):
    """Pop the launcher options from the command's values -> LaunchOptions."""
    from astrai.train.launch import LaunchOptions

    got = {k: values.pop(k, None) for k in LAUNCH_HELP}
    opts = LaunchOptions(rdzv_endpoint=got["rdzv_endpoint"], rdzv_id=got["rdzv_id"],
                         node_rank=got["node_rank"])
    if got["shutdown_timeout"] is not None:
        opts.shutdown_timeout_s = got["shutdown_timeout"]
    if got["max_restarts"] is not None:
        opts.max_restarts = got["max_restarts"]
    return opts


def finish(summary, as_json: bool) -> None:
    """Rank 0 prints the summary; a preempted run exits EXIT_PREEMPTED on every rank (so
    a scheduler or torchrun sees it did not finish); other nodes' launchers print nothing."""
    from astrai.train.preemption import EXIT_PREEMPTED

    if summary is None:
        return
    if summary.rank == 0:
        emit(summary.to_dict(), as_json, render_summary)
    if summary.preempted:
        raise typer.Exit(EXIT_PREEMPTED)


# -- commands ---------------------------------------------------------------------------------

def register(app: typer.Typer) -> None:
    params, kinds = config_options()

    def train_cmd(config: Path | None = None, dry_run: bool = False, as_json: bool = False,
                  threads: str | None = None, **values: Any) -> None:
        """Train a model: a dataset directory + a preset/config/checkpoint -> a run directory
        with metrics.jsonl and checkpoints/step_N (each one a self-contained checkpoint)."""
        from astrai.config.train import load_train_config
        from astrai.train.launch import launch_train
        from astrai.train.run import plan_run

        launch = launch_options(values)
        cfg = load_train_config(config, overrides_from(values, kinds))
        # a run directory: its newest checkpoint; a GGUF file: a line that training starts
        # from it
        if cfg.model:
            cfg.model = str(checkpoint_path(cfg.model, training=True))
        if cfg.alignment.ref_model:
            cfg.alignment.ref_model = str(checkpoint_path(cfg.alignment.ref_model))
        if dry_run:
            emit(plan_run(cfg).to_dict(), as_json, render_plan)
            return
        use_threads(threads)
        err = log_console(stderr=True)
        summary = launch_train(cfg, launch=launch, progress=True, console=err)
        finish(summary, as_json)

    own = [
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--config", "-c", rich_help_panel=RUN_PANEL,
                                               help="YAML or JSON file of train options "
                                                    "(keys = option names with '_', or "
                                                    "nested sections).")),
        inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--dry-run", rich_help_panel=RUN_PANEL,
                                               help="Validate and print the plan (effective "
                                                    "batch, steps, tokens, memory); train "
                                                    "nothing.")),
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--json", rich_help_panel=RUN_PANEL,
                                               help="Print the summary (or plan) as JSON.")),
        inspect.Parameter("threads", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[str | None, threads_option("Run")]),
    ]
    train_cmd.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        own + params + launch_params())
    app.command("train", no_args_is_help=True)(train_cmd)
