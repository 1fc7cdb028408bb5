"""`astrai preprocess spec.json`: raw JSONL / Parquet -> a dataset directory of packed
shards; `astrai preprocess merge DIR... --out DIR` joins the datasets of `--shard I/N` runs."""

from __future__ import annotations

import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from typer.core import TyperCommand

from astrai_cli.options import log_console

PLAIN_EVERY_S = 10.0  # a progress line at most this often when stderr is not a terminal


class OnError(str, Enum):
    fail = "fail"
    skip = "skip"


def _summary(res: dict, console: Console) -> None:
    t = Table(title=f"dataset {res['output']} ({res['kind']}, {res['format']})",
              title_justify="left")
    t.add_column("")
    names = list(res["splits"])
    for n in names:
        t.add_column(n, justify="right")
    rows = [("records read", "records_read"), ("kept", "records_kept"),
            ("filtered (short)", "filtered_short"), ("filtered (long)", "filtered_long"),
            ("malformed (skipped)", "malformed"), ("samples", "samples"),
            ("tokens", "tokens"), ("dropped by truncation", "dropped_tokens")]
    for label, key in rows:
        t.add_row(label, *(f"{res['splits'][n][key]:,}" for n in names))
    t.add_row("shards", *(str(len(res["splits"][n]["shards"])) for n in names))
    eff = [res["splits"][n]["packing_efficiency"] for n in names]
    if any(e is not None for e in eff):
        t.add_row("packing efficiency", *("-" if e is None else f"{e:.1%}" for e in eff))
    console.print(t)
    console.print(f"{res['tokens']:,} tokens in {res['elapsed_s']:.2f} s "
                  f"({res['tokens_per_s']:,.0f} tokens/s)")


def _eta(ev: dict) -> str:
    done, total = ev["bytes_done"], ev["bytes_total"]
    if not done or not total or done >= total:
        return "-"
    s = int(ev["elapsed"] * (total - done) / done)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _PlainProgress:
    """Progress as plain lines on stderr (logs, Slurm output files): one line every
    PLAIN_EVERY_S seconds at most, none for a run shorter than that."""

    def __init__(self, kind: str) -> None:
        self.kind, self.last = kind, time.monotonic()

    def __call__(self, ev: dict) -> None:
        now = time.monotonic()
        if now - self.last < PLAIN_EVERY_S:
            return
        self.last = now
        pct = 100 * ev["bytes_done"] / ev["bytes_total"] if ev["bytes_total"] else 0.0
        print(f"preprocess {self.kind} [{ev['split']}] {pct:5.1f}% {ev['records']:,} records "
              f"{ev['tokens']:,} tokens {ev['tokens'] / max(ev['elapsed'], 1e-9):,.0f} tok/s "
              f"eta {_eta(ev)}", file=sys.stderr, flush=True)


def _run_with_bar(cfg, run, err: Console):
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.fields[records]:>10,} records"),
                  TextColumn("{task.fields[tokens]:>13,} tokens"),
                  TextColumn("{task.fields[rate]:>10,.0f} tok/s"),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                  console=err, transient=False) as bar:
        task = bar.add_task(f"preprocess {cfg.kind}", total=None, records=0, tokens=0,
                            rate=0.0)

        def progress(ev: dict) -> None:
            bar.update(task, description=f"{cfg.kind} [{ev['split']}]",
                       total=ev["bytes_total"] or None, completed=ev["bytes_done"],
                       records=ev["records"], tokens=ev["tokens"],
                       rate=ev["tokens"] / max(ev["elapsed"], 1e-9))

        return run(progress)


def merge_command(
    dirs: Annotated[list[Path], typer.Argument(
        metavar="DIR...", help="Dataset directories to join (the N outputs of `--shard I/N` runs).")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR",
                                      help="The merged dataset directory.")],
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace --out when it is an astrai dataset.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")
                       ] = False,
) -> None:
    """Join shard datasets into one (token files hard-linked, not rewritten)."""
    from astrai.data.merge import merge_datasets

    res = merge_datasets(dirs, out, overwrite=overwrite).to_dict()
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    for name, s in res["splits"].items():
        eff = s["packing_efficiency"]
        typer.echo(f"{name}: {len(s['shards'])} shards, {s['samples']:,} samples, "
                   f"{s['tokens']:,} tokens" + ("" if eff is None else f", packing {eff:.1%}"))
    typer.echo(f"merged {len(res['inputs'])} datasets into {res['output']} "
               f"({res['linked_files']} files linked, {res['copied_files']} copied)")


class PreprocessCommand(TyperCommand):  # (main adds astrai's --help layout to it)
    """`astrai preprocess SPEC` and, when the first word is `merge`, the merge command (a
    spec file cannot be named merge without a path: `./merge`)."""

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[override]
        if args and args[0] == "merge":
            from astrai_cli.errors import AstraiCommand  # astrai's --help layout

            merge_app = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
            merge_app.command("merge", cls=AstraiCommand)(merge_command)
            cmd: click.Command = typer.main.get_command(merge_app)
            return cmd.make_context(f"{info_name} merge", list(args[1:]), parent=parent,
                                    **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


def register(app: typer.Typer) -> None:
    @app.command("preprocess", cls=PreprocessCommand)
    def preprocess_cmd(
        spec: Annotated[Path | None, typer.Argument(
            help="Spec file (JSON or YAML); see examples/specs/. `astrai preprocess merge "
                 "DIR... --out DIR` joins shard datasets.")] = None,
        overrides: Annotated[list[str] | None, typer.Option(
            "--set", help="Override a spec field: key=value, dotted for nested "
                          "(e.g. --set packing.mode=bfd). Repeatable.")] = None,
        workers: Annotated[int | None, typer.Option(
            "--workers", min=1, help="Tokenization processes (default: the cores; 1 = "
                                     "in-process, still parallel inside the tokenizer). "
                                     "The dataset is the same for any count.")] = None,
        shard: Annotated[str | None, typer.Option(
            "--shard", metavar="I/N", help="Build only shard I of N of the inputs (by file, "
            "or by Parquet row group when there are fewer files); join them with `astrai "
            "preprocess merge`.")] = None,
        on_error: Annotated[OnError, typer.Option(
            "--on-error", help="Bad record: fail (list the first 5) or skip.")
        ] = OnError.fail,
        chat_template: Annotated[str | None, typer.Option(
            "--chat-template", metavar="NAME|FILE", help="Chat template replacing the "
            "tokenizer's (spec field chat_template): chatml, llama3, qwen2.5, mistral, "
            "llama2, or a .jinja file.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")
                           ] = False,
        schema: Annotated[bool, typer.Option(
            "--schema", help="Print the spec's JSON Schema (for editors) and exit.")] = False,
    ) -> None:
        """Tokenize, mask, pack and shard JSONL or Parquet records as the spec says."""
        from astrai.config.preprocess import load_spec, spec_schema

        if schema:
            typer.echo(json.dumps(spec_schema(), indent=2))
            return
        from astrai.data.builder import build_dataset, parse_shard

        part = parse_shard(shard) if shard is not None else None
        extra = [f"chat_template={chat_template}"] if chat_template is not None else []
        cfg = load_spec(spec, [*(overrides or []), *extra])
        err = log_console(stderr=True)

        def run(progress=None):
            return build_dataset(cfg, workers=workers, on_error=on_error.value, progress=progress,
                                 shard=part, command={"spec": str(spec),
                                                      "set": [*(overrides or []), *extra]})

        if as_json:
            res = run()
        elif err.is_terminal:
            res = _run_with_bar(cfg, run, err)
        else:
            res = run(_PlainProgress(cfg.kind))
        out = res.to_dict()
        if as_json:
            typer.echo(json.dumps(out, indent=2))
            return
        _summary(out, log_console())
        if res.errors:
            err.print(f"[yellow]skipped {len(res.errors)} bad records[/], e.g. "
                      + "; ".join(res.errors[:3]), markup=True)
