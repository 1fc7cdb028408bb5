"""`astrai preprocess spec.json`: raw JSONL -> a dataset directory of packed shards."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table


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


def register(app: typer.Typer) -> None:
    @app.command("preprocess")
    def preprocess_cmd(
        spec: Annotated[Path | None, typer.Argument(
            help="Spec file (JSON or YAML); see examples/specs/.")] = None,
        overrides: Annotated[list[str] | None, typer.Option(
            "--set", help="Override a spec field: key=value, dotted for nested "
                          "(e.g. --set packing.mode=bfd). Repeatable.")] = None,
        workers: Annotated[int, typer.Option(
            "--workers", min=1, help="Tokenization processes (1 = in-process, still parallel "
                                     "inside the tokenizer).")] = 1,
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
        """Tokenize, mask, pack and shard JSONL records as the spec says."""
        from astrai.config.preprocess import load_spec, spec_schema

        if schema:
            typer.echo(json.dumps(spec_schema(), indent=2))
            return
        from astrai.data.builder import build_dataset

        extra = [f"chat_template={chat_template}"] if chat_template is not None else []
        cfg = load_spec(spec, [*(overrides or []), *extra])
        err = Console(stderr=True)
        if not err.is_terminal or as_json:
            res = build_dataset(cfg, workers=workers, on_error=on_error.value)
        else:
            with Progress(SpinnerColumn(), TextColumn("{task.description}"),
                          TextColumn("{task.fields[records]:>10,} records"),
                          TextColumn("{task.fields[tokens]:>13,} tokens"),
                          TextColumn("{task.fields[rate]:>10,.0f} tok/s"),
                          TimeElapsedColumn(), console=err, transient=False) as bar:
                task = bar.add_task(f"preprocess {cfg.kind}", total=None, records=0, tokens=0,
                                    rate=0.0)

                def progress(ev: dict) -> None:
                    bar.update(task, description=f"{cfg.kind} [{ev['split']}]",
                               records=ev["records"], tokens=ev["tokens"],
                               rate=ev["tokens"] / max(ev["elapsed"], 1e-9))

                res = build_dataset(cfg, workers=workers, on_error=on_error.value,
                                    progress=progress)
        out = res.to_dict()
        if as_json:
            typer.echo(json.dumps(out, indent=2))
            return
        _summary(out, Console(highlight=False))
        if res.errors:
            err.print(f"[yellow]skipped {len(res.errors)} bad records[/], e.g. "
                      + "; ".join(res.errors[:3]), markup=True)
