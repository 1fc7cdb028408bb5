"""`astrai eval CHECKPOINT`: bits per byte / perplexity on held-out data (--data), or
benchmark tasks through lm-evaluation-harness (--tasks). The work is `astrai.eval`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from astrai_cli.engine_flags import LOADING, engine_flags
from astrai_cli.options import (
    checkpoint_path,
    log_console,
    threads_option,
    use_threads,
    warn_dtype,
)

if TYPE_CHECKING:
    from astrai.infer.build import EngineOptions

METRICS = ("bpb", "ppl")


def _split(value: str | None) -> list[str]:
    return [s.strip() for s in (value or "").split(",") if s.strip()]


def render_perplexity(res: dict, metrics: list[str], console: Console) -> None:
    table = Table(title=f"Held-out: {res['source']}", title_justify="left")
    for col in ("documents", "tokens", "bytes", *metrics):
        table.add_column(col, justify="right")
    table.add_row(str(res["documents"]), str(res["tokens"]), str(res["bytes"]),
                  *(f"{res[m]:.4f}" for m in metrics))
    console.print(table)


def render_tasks(rows: list[dict], console: Console) -> None:
    table = Table(title="lm-evaluation-harness", title_justify="left")
    for col in ("task", "n-shot", "metric", "filter", "value", "± stderr"):
        table.add_column(col, justify="right" if col in ("value", "± stderr", "n-shot")
                         else "left")
    for r in rows:
        err = "" if r["stderr"] is None else f"{r['stderr']:.4f}"
        table.add_row(r["task"], "" if r["n_shot"] is None else str(r["n_shot"]), r["metric"],
                      r["filter"], f"{r['value']:.4f}", err)
    console.print(table)


def _check_limit(limit: float | None, documents: bool) -> None:
    """--limit: a count of documents with --data; a count, or a fraction below 1, per task."""
    from astrai.errors import ConfigError

    if limit is None:
        return
    if documents and (limit < 1 or limit != int(limit)):
        raise ConfigError(f"--limit {limit:g}: with --data it counts documents; give a whole "
                          "number, 1 or more")
    if limit <= 0 or (limit > 1 and limit != int(limit)):
        raise ConfigError(f"--limit {limit:g}: give a count of examples per task (1 or more) "
                          "or a fraction between 0 and 1")


def _offline_unless_hub_reachable() -> None:
    """Without network, put `datasets` and `huggingface_hub` (not imported yet) in offline
    mode: cached and local datasets load at once instead of after half a minute of retries
    (astrai/eval/hub.py). A user's own HF_*_OFFLINE setting is left as it is."""
    import os

    from astrai.eval.hub import OFFLINE_VARS, hub_reachable, offline_chosen

    if not offline_chosen() and not hub_reachable():
        os.environ.update(dict.fromkeys(OFFLINE_VARS, "1"))


def register(app: typer.Typer) -> None:
    @app.command("eval")
    @engine_flags(LOADING)
    def eval_cmd(
        checkpoint: Annotated[Path, typer.Argument(
            help="An astrai checkpoint, a training run directory (its newest checkpoint) or "
            "a HF Llama/Qwen2/Mistral directory, with its tokenizer.")],
        data: Annotated[Path | None, typer.Option(
            "--data", help="Held-out text: a JSONL file (text or chat records) or a dataset "
            "directory of `astrai preprocess` (its validation split).")] = None,
        metric: Annotated[str, typer.Option(
            "--metric", help="With --data: comma-separated metrics, of bpb, ppl.")] = "bpb,ppl",
        field: Annotated[str, typer.Option(
            "--field", help="With a JSONL --data: the record field holding the text (chat "
            "records: a message list, rendered through the chat template).")] = "text",
        tasks: Annotated[str | None, typer.Option(
            "--tasks", help="lm-evaluation-harness tasks, comma-separated (e.g. "
            "hellaswag,arc_easy); needs `pip install 'astrai\\[eval]'`.")] = None,
        include_path: Annotated[Path | None, typer.Option(
            "--include-path", help="With --tasks: a folder of extra task YAMLs (a local "
            "task runs offline: examples/eval/tiny_task).")] = None,
        num_fewshot: Annotated[int | None, typer.Option(
            "--num-fewshot", help="With --tasks: few-shot examples per prompt.")] = None,
        limit: Annotated[float | None, typer.Option(
            "--limit", help="Documents (--data) or examples per task (--tasks; below 1: a "
            "fraction).")] = None,
        apply_chat_template: Annotated[bool, typer.Option(
            "--apply-chat-template", help="With --tasks: wrap prompts in the chat "
            "template.")] = False,
        seed: Annotated[int, typer.Option("--seed", help="Seed for few-shot sampling and "
                                          "sampled generation.")] = 0,
        batch_tokens: Annotated[int, typer.Option(
            "--batch-tokens", min=1, help="Tokens scored per forward pass.")] = 1024,
        as_json: Annotated[bool, typer.Option(
            "--json", help="Print the results as JSON instead of a table.")] = False,
        json_out: Annotated[Path | None, typer.Option(
            "--out", metavar="FILE", help="Also write the results as JSON to FILE.")] = None,
        threads: Annotated[str | None, threads_option()] = None,
        *, engine: EngineOptions,
    ) -> None:
        """Bits per byte / perplexity on held-out data, or lm-evaluation-harness tasks."""
        from astrai.atomic import write_json_atomic
        from astrai.errors import ConfigError

        if (data is None) == (tasks is None):
            raise ConfigError("give --data FILE.jsonl (bits per byte, perplexity) or --tasks "
                              "NAMES (lm-evaluation-harness), not both or neither")
        _check_limit(limit, data is not None)
        use_threads(threads)
        checkpoint = checkpoint_path(checkpoint)  # a run directory: its newest checkpoint
        warn_dtype(engine.device, engine.dtype)
        loading = {"device": engine.device, "dtype": engine.dtype, "adapter": engine.adapter,
                   "quantize": engine.quantize}
        console = log_console()
        if data is not None:
            from astrai.eval.perplexity import evaluate_perplexity

            metrics = _split(metric)
            bad = [m for m in metrics if m not in METRICS]
            if bad or not metrics:
                raise ConfigError(f"--metric {metric}: use a comma-separated subset of "
                                  f"{', '.join(METRICS)}")
            n = None if limit is None else int(limit)
            res = evaluate_perplexity(checkpoint, data, field=field,
                                      batch_tokens=batch_tokens, limit=n, **loading).to_dict()
            out: dict = res
        else:
            from astrai.eval.tasks import require_lm_eval, result_rows, run_tasks

            require_lm_eval()
            _offline_unless_hub_reachable()
            n = None if limit is None else (limit if limit < 1 else int(limit))
            results = run_tasks(checkpoint, _split(tasks), num_fewshot=num_fewshot, limit=n,
                                seed=seed, apply_chat_template=apply_chat_template,
                                include_path=include_path, batch_tokens=batch_tokens,
                                decode=engine.decode, **loading)
            rows = result_rows(results)
            out = {"rows": rows, "results": results.get("results", {}),
                   "n-shot": results.get("n-shot", {}), "versions": results.get("versions", {})}
        if json_out is not None:
            write_json_atomic(json_out, out)
        if as_json:
            typer.echo(json.dumps(out, indent=2))
        elif data is not None:
            render_perplexity(out, metrics, console)
        else:
            render_tasks(out["rows"], console)
