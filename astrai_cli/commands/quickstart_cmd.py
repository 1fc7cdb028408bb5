"""`astrai quickstart`: the whole path on the bundled corpus, in minutes on a laptop CPU.

Progress (one row per stage) goes to stderr; the summary, the sample and the next commands
go to stdout (or JSON with --json). The work is `astrai.quickstart.run_quickstart`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

LABELS = {"tokenizer": "train tokenizer", "preprocess": "preprocess", "size": "size the run",
          "train": "train", "validate": "validate", "sample": "sample"}


class StageDisplay:
    """Renders StageEvents: live rows with bars on a terminal; elsewhere one line per stage's
    start and end, and a progress line every `interval_s` seconds in between (as `astrai
    train` prints), so a log of the minutes-long training stage is never silent."""

    def __init__(self, console: Console, interval_s: float = 30.0,
                 clock: Any = time.monotonic) -> None:
        self.console = console
        self.live = console.is_terminal
        self.interval_s = interval_s
        self.clock = clock
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.tasks: dict[str, Any] = {}
        self.progress: Progress | None = None
        if self.live:
            self.progress = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"),
                TextColumn("{task.description:<16}"), BarColumn(bar_width=24),
                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                console=console, transient=False,
            )

    def __enter__(self) -> StageDisplay:  # noqa: PYI034
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, ev: Any) -> None:
        from astrai.quickstart import STAGES

        label = LABELS.get(ev.stage, ev.stage)
        n = f"[{STAGES.index(ev.stage) + 1}/{len(STAGES)}]" if ev.stage in STAGES else ""
        if self.progress is None:
            self._line(ev, f"{n} {label}")
            return
        p = self.progress
        if ev.kind == "start":
            self.tasks[ev.stage] = p.add_task(f"{n} {label}", total=ev.total,
                                              completed=ev.completed or 0, info=ev.info)
            return
        task = self.tasks.get(ev.stage)
        if task is None:
            return
        fields: dict[str, Any] = {"info": ev.info} if ev.info else {}
        total = ev.total if ev.total is not None else p.tasks[task].total
        if ev.kind == "update":
            p.update(task, total=total, completed=ev.completed or 0, **fields)
        else:  # an open-ended stage (no total) shows as one finished unit
            total = total or 1
            p.update(task, total=total, completed=total, **fields)
            p.stop_task(task)


    def _line(self, ev: Any, name: str) -> None:
        now = self.clock()
        if ev.kind == "start":
            self._started[ev.stage] = self._last[ev.stage] = now
            self.console.print(f"{name} ...", highlight=False)
        elif ev.kind == "end":
            self.console.print(f"{name}: done {escape(ev.info)}", highlight=False)
        elif ev.completed and ev.total and now - self._last.get(ev.stage, now) >= \
                self.interval_s:
            self._last[ev.stage] = now
            per = (now - self._started[ev.stage]) / ev.completed
            eta = round(per * max(0, ev.total - ev.completed))
            info = f" · {escape(ev.info)}" if ev.info else ""
            self.console.print(f"{name}: {ev.completed}/{ev.total} "
                               f"({100 * ev.completed // ev.total}%){info} · ETA "
                               f"{eta // 60}m{eta % 60:02d}s", highlight=False)


def render(res: dict[str, Any], console: Console) -> None:
    from astrai.quickstart.pipeline import LOSS_PLOT
    from astrai.viz.figure import PLOT_INSTALL

    t = Table(title="quickstart finished" if not res["preempted"] else
              "quickstart stopped during training", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    bpb = res["val_bpb"]
    rows = [
        ("made", f"{res['out']}/ (tokenizer/, data/, run/, summary.json"
                 + (f", {LOSS_PLOT})" if res.get("loss_plot") else ")")),
        ("model", f"{res['params'] / 1e6:.2f}M parameters, vocabulary {res['vocab_size']:,}"),
        ("trained", (f"{res['steps']:,} steps, {res['consumed_tokens']:,} tokens, "
                    f"{res['threads']} CPU thread{'s' * (res['threads'] > 1)}")),
        ("validation", "-" if bpb is None else
         f"{bpb:.3f} bits per byte (loss {res['val_loss']:.3f} nats/token) on "
         f"{res['val_bytes']:,} bytes of held-out text"),
        ("checkpoint", res["checkpoint"] or "-"),
        ("loss curve", res.get("loss_plot") or
         f"{PLOT_INSTALL} to get {Path(res['out']) / LOSS_PLOT}"),
        ("time", f"{res['total_s']:.0f} s (" + ", ".join(
            f"{k} {v:.0f} s" for k, v in res["stage_s"].items()) + ")"),
    ]
    for k, v in rows:
        t.add_row(k, escape(str(v)))
    console.print(t)
    if res["sample"]:
        console.print(Panel(escape(res["sample"]), title="sample", title_align="left",
                            expand=False))
    if res["preempted"]:
        console.print(f"Continue with:  astrai resume {escape(res['run_dir'])}")
        return
    fit = None if res.get("full_budget_s") is None else (
        f"astrai quickstart --time-budget {res['full_budget_s']:.0f} (or --steps "
        f"{res['full_steps']}).")
    if res.get("fallback_from_steps") is not None:
        console.print(
            f"[yellow]note:[/] the time budget gave the recipe's model only "
            f"{res['fallback_from_steps']:,} steps on this machine now, so a smaller model "
            f"trained for {res['steps']:,} steps instead (measured better at such speeds; "
            "see docs/quickstart.md)."
            + ("" if fit is None else f" For the recipe's model at this speed: {fit}"))
    elif fit is not None:
        console.print(
            f"[yellow]note:[/] the time budget cut training to {res['steps']:,} of the "
            f"recipe's {res['full_steps']:,} steps ({res['step_s']:.2f} s/step on this "
            "machine now), so expect a higher bits per byte than the full recipe's (see "
            f"docs/quickstart.md). For the full recipe at this speed: {fit}")
    console.print("[bold]Next:[/]")
    for c in res["commands"]:
        console.print(f"  [dim]# {escape(c['what'])}[/]\n  {escape(c['command'])}")


def _pairs(items: list[str] | None) -> dict[str, Any]:
    from astrai.config.pairs import parse_pairs

    return parse_pairs(items, "--model-overrides", "n_layers=2")


def register(app: typer.Typer) -> None:
    @app.command("quickstart")
    def quickstart_cmd(
        out: Annotated[Path, typer.Option(
            "--out", help="Directory for everything made.")] = Path("runs/quickstart"),
        time_budget: Annotated[float, typer.Option(
            "--time-budget", help="Seconds the whole quickstart aims to take; the training "
            "steps are sized to fit from a measured step time.")] = 240.0,
        steps: Annotated[int | None, typer.Option(
            "--steps", help="Train exactly this many steps (no timing; reproducible "
            "anywhere).")] = None,
        device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")
                          ] = "auto",
        seed: Annotated[int, typer.Option("--seed", help="Seed of init, data order and the "
                                                         "sample.")] = 3407,
        threads: Annotated[int | None, typer.Option(
            "--threads", min=1, help="CPU threads \\[default: the faster of 1 and all cores, "
            "measured; all cores with --steps].")] = None,
        overwrite: Annotated[bool, typer.Option(
            "--overwrite", help="Replace a previous quickstart in --out.")] = False,
        corpus: Annotated[Path | None, typer.Option(
            "--corpus", help="Directory with shakespeare_train.jsonl and shakespeare_val.jsonl "
            "\\[default: the bundled examples/data/shakespeare].")] = None,
        vocab_size: Annotated[int, typer.Option(
            "--vocab-size", help="Tokenizer vocabulary size.", rich_help_panel="Recipe")
        ] = 2048,
        seq_len: Annotated[int, typer.Option(
            "--seq-len", help="Tokens per training row.", rich_help_panel="Recipe")] = 256,
        batch_size: Annotated[int, typer.Option(
            "--batch-size", help="Rows per step.", rich_help_panel="Recipe")] = 8,
        max_lr: Annotated[float, typer.Option(
            "--max-lr", help="Peak learning rate.", rich_help_panel="Recipe")] = 2e-3,
        max_epochs: Annotated[float, typer.Option(
            "--max-epochs", help="Most passes over the corpus a sized run makes (the "
            "recipe's length; a small --corpus may want more).", rich_help_panel="Recipe")
        ] = 1.0,
        weight_decay: Annotated[float, typer.Option(
            "--weight-decay", help="Decoupled weight decay of the weight matrices.",
            rich_help_panel="Recipe")] = 0.3,
        optimizer: Annotated[str, typer.Option(
            "--optimizer", help="muon (Muon on the hidden matrices, AdamW on the rest) or "
            "adamw.", rich_help_panel="Recipe")] = "muon",
        model_overrides: Annotated[list[str] | None, typer.Option(
            "--model-overrides", help="ModelConfig field of the tiny preset to change, "
            "key=value (e.g. n_layers=4), on top of n_layers=2, tie_embeddings=true and "
            "qk_norm=true. Repeatable.", rich_help_panel="Recipe")] = None,
        fallback: Annotated[bool, typer.Option(
            "--fallback/--no-fallback", help="On a machine too slow for the recipe's model "
            "(too few of its steps fit the budget), train a smaller model for longer.",
            rich_help_panel="Recipe")] = True,
        as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")
                           ] = False,
    ) -> None:
        """Start here: tokenizer, data, training, bits per byte and a sample in minutes.

        On the bundled Shakespeare corpus; then prints how to chat, resume, inspect, benchmark."""
        from astrai.quickstart import QuickstartConfig, run_quickstart
        from astrai.train.preemption import EXIT_PREEMPTED

        overrides = {**QuickstartConfig.model_fields["model_overrides"].default_factory(),
                     **_pairs(model_overrides)}
        cfg = QuickstartConfig.from_dict({
            "out": str(out), "corpus": None if corpus is None else str(corpus),
            "overwrite": overwrite, "vocab_size": vocab_size, "seq_len": seq_len,
            "batch_size": batch_size, "max_lr": max_lr, "model_overrides": overrides,
            "max_epochs": max_epochs,
            "steps": steps, "time_budget_s": time_budget, "seed": seed, "device": device,
            "threads": threads, "optimizer": optimizer, "weight_decay": weight_decay,
            **({} if fallback else {"fallback_overrides": None}),
        }, source="quickstart options")
        from astrai_cli.options import log_console

        err = log_console(stderr=True)
        with StageDisplay(err) as display:
            result = run_quickstart(cfg, on_event=display)
        res = result.to_dict()
        if as_json:
            typer.echo(json.dumps(res, indent=2))
        else:
            render(res, log_console())
        if result.preempted:
            raise typer.Exit(EXIT_PREEMPTED)
