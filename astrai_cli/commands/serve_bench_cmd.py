"""`astrai serve-bench CHECKPOINT_OR_PRESET`: serving metrics of the engine (vLLM/SGLang names).

Parses options into a BenchConfig, calls `astrai.infer.bench.serve_bench`, renders one
table with a column per backend (stdout), or JSON with `--json`; `--out FILE` also writes the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from astrai_cli.engine_flags import engine_flags
from astrai_cli.options import (
    Backend,
    KvCacheDtype,
    MaxContext,
    checkpoint_path,
    threads_option,
    use_threads,
    warn_dtype,
)

if TYPE_CHECKING:
    from astrai.infer.build import EngineOptions

# (label, key, format) rows of the table, in sections; a row whose value is None in every
# run (not measured there, e.g. the KV pool of a remote server) is left out.
SECTIONS: list[tuple[str, list[tuple[str, str, str]]]] = [
    ("Requests", [
        ("Successful requests", "completed", "{:d}"),
        ("Failed requests", "failed", "{:d}"),
        ("Benchmark duration (s)", "duration", "{:.2f}"),
        ("Total input tokens", "total_input_tokens", "{:d}"),
        ("Total generated tokens", "total_output_tokens", "{:d}"),
        ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
        ("Request goodput (req/s)", "request_goodput", "{:.2f}"),
        ("Input token throughput (tok/s)", "input_throughput", "{:.1f}"),
        ("Output token throughput (tok/s)", "output_throughput", "{:.1f}"),
        ("Total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
        # vLLM's two peaks count per 1-second bucket: a request counts in every second
        # it touches, so they exceed the exact in-flight count (docs/serve-bench.md).
        ("Busiest second: requests active (vLLM)", "max_concurrent_requests", "{:d}"),
        ("Busiest second: output tokens (vLLM)", "max_output_tokens_per_s", "{:.0f}"),
        ("Most requests in flight at once", "peak_concurrency", "{:d}"),
        ("Mean requests in flight", "mean_concurrency", "{:.2f}"),
    ]),
]
for _name, _key in (("Time to first token", "ttft"), ("Time per output token (excl. 1st)",
                                                       "tpot"),
                    ("Inter-token latency", "itl"), ("End-to-end latency", "e2el")):
    SECTIONS.append((f"{_name} (ms)", [(f"{s.capitalize()}", f"{s}_{_key}_ms", "{:.2f}")
                                       for s in ("mean", "median", "p90", "p99")]))
SECTIONS.append(("Engine", [
    ("Decode path", "decode_path", "{}"),
    ("Prefix cache hit rate (%)", "prefix_cache_hit_rate", "pct"),
    ("KV pool utilization, mean (%)", "kv_pool_utilization_mean", "pct"),
    ("KV pool utilization, peak (%)", "kv_pool_utilization_peak", "pct"),
    ("Preemptions", "num_preemptions", "{:d}"),
    ("Engine steps", "num_steps", "{:d}"),
    ("Speculative tokens proposed", "spec_draft_tokens", "{:d}"),
    ("Speculative tokens accepted", "spec_accepted_tokens", "{:d}"),
    ("Speculative acceptance rate (%)", "spec_acceptance_rate", "pct"),
]))


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    if fmt == "pct":
        return f"{100 * value:.1f}"
    return fmt.format(value)


def _model_title(m: dict) -> str:
    name = m.get("name") or m.get("path")
    if m.get("kind") == "server":
        return f"model '{name}' served at {m.get('base_url') or m.get('device')}"
    weights = m['dtype'] if not m.get("quantize") else f"{m['quantize']} weights, {m['dtype']}"
    return f"{name} ({m['kind']}, {weights} on {m['device']})"


def render(report: dict, console: Console) -> None:
    m, w, s = report["model"], report["workload"], report["settings"]
    conc = s["max_concurrency"] or "unlimited"
    rate = "all at once" if s["request_rate"] == "inf" else f"{s['request_rate']} req/s"
    title = (f"Serving benchmark: {_model_title(m)} · "
             f"{w['name']} workload · {w['num_prompts']} prompts (input {w['input_len'][0]}-"
             f"{w['input_len'][1]}, output {w['output_len'][0]}-{w['output_len'][1]}) · "
             f"arrivals {rate} · max concurrency {conc}")
    kv = (s.get("cache") or {}).get("dtype")
    title += f" · KV cache {kv}" if kv else ""
    # Above the table, not its title: a title wraps at the table's (narrow) width.
    console.print(escape(title))
    table = Table()
    table.add_column("metric", style="cyan")
    runs = report["runs"]
    for run in runs:
        table.add_column(run["backend"], justify="right")
    for section, rows in SECTIONS:
        shown = [(label, [r.get(key) for r in runs], fmt) for label, key, fmt in rows]
        shown = [row for row in shown if any(v is not None for v in row[1])]
        if shown:
            table.add_row(f"[bold]{section}[/]", *[""] * len(runs))
        for label, values, fmt in shown:
            table.add_row(f"  {label}", *[_fmt(v, fmt) for v in values])
    console.print(table)


def _backends(backend: str | None, compare: str | None) -> list[str | None]:
    from astrai.errors import ConfigError
    from astrai.infer.backends.registry import backend_status

    if backend and compare:
        raise ConfigError("--backend and --compare-backends exclude each other: give one")
    if not compare:
        return [backend]
    if compare.strip() == "all":
        return [n for n, why in backend_status().items() if why is None]
    return [b.strip() for b in compare.split(",") if b.strip()]


def register(app: typer.Typer) -> None:
    @app.command("serve-bench")
    @engine_flags()
    def serve_bench_cmd(
        target: Annotated[str, typer.Argument(
            metavar="CHECKPOINT_OR_PRESET",
            help="A checkpoint directory, or a preset (tiny, small, 125m, 1.2b) with random "
            "weights and a tiny trained tokenizer; with --base-url, the model directory the "
            "server serves.")],
        workload: Annotated[str, typer.Option(
            "--workload", "-w", help="random | shared-prefix | PATH to a JSONL file (one "
            "{\"prompt\" | \"prompt_ids\" | \"messages\", \"output_len\"} a line).")
        ] = "random",
        num_prompts: Annotated[int | None, typer.Option(
            "--num-prompts", "-n", help="Measured requests (default: 64; a file: all lines).")
        ] = None,
        input_len: Annotated[str | None, typer.Option(
            "--input-len", help="Prompt tokens, N or MIN:MAX (shared-prefix: the question "
            "after the prefix). Default 64:256, scaled down to fit the model's context.")
        ] = None,
        output_len: Annotated[str | None, typer.Option(
            "--output-len", help="Output tokens, N or MIN:MAX. Default 32:128, scaled down "
            "to fit the model's context.")] = None,
        prefix_len: Annotated[int | None, typer.Option(
            "--prefix-len", help="Shared system-prompt tokens per group (shared-prefix). "
            "Default 256, scaled down to fit the model's context.")] = None,
        prefix_groups: Annotated[int, typer.Option(
            "--prefix-groups", help="Groups sharing one prefix (shared-prefix).")] = 4,
        request_rate: Annotated[str, typer.Option(
            "--request-rate", help="Requests/s with Poisson (or gamma) arrivals; inf sends all "
            "at once.")] = "inf",
        burstiness: Annotated[float, typer.Option(
            "--burstiness", help="Gamma shape of arrival gaps: 1 = Poisson, <1 burstier.")
        ] = 1.0,
        max_concurrency: Annotated[int | None, typer.Option(
            "--max-concurrency", help="Most requests in flight at once (default: no limit).")
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="Workload/arrival/weights seed.")] = 0,
        warmup: Annotated[int, typer.Option(
            "--warmup", help="Unmeasured warm-up requests.")] = 2,
        temperature: Annotated[float, typer.Option(
            "--temperature", help="Sampling temperature; 0 = greedy.")] = 0.0,
        stop_at_eos: Annotated[bool, typer.Option(
            "--stop-at-eos", help="Let EOS end a request early (default: generate exactly "
            "the output length).")] = False,
        goodput: Annotated[str | None, typer.Option(
            "--goodput", help="SLOs for goodput, e.g. ttft:200,tpot:50,e2el:2000 (ms).")
        ] = None,
        backend: Backend = None,
        compare_backends: Annotated[str | None, typer.Option(
            "--compare-backends", help="Comma-separated backends (or 'all' available) run in "
            "turn: one column each.")] = None,
        threads: Annotated[str | None, threads_option()] = None,
        page_size: Annotated[int, typer.Option("--page-size", help="KV page size.")] = 16,
        max_kv_tokens: Annotated[int, typer.Option(
            "--max-kv-tokens", help="Token slots in the KV pool.")] = 32768,
        max_requests: Annotated[int, typer.Option(
            "--max-requests", help="Requests holding KV at once (batch size).")] = 64,
        no_radix: Annotated[bool, typer.Option(
            "--no-radix", help="Turn prefix sharing off (compare its effect).")] = False,
        max_step_tokens: Annotated[int, typer.Option(
            "--max-step-tokens", help="Token budget of one engine step (chunked prefill).")
        ] = 2048,
        max_context: MaxContext = None,
        kv_dtype: KvCacheDtype = "auto",
        base_url: Annotated[str | None, typer.Option(
            "--base-url", help="Measure this OpenAI-compatible server (http://HOST:PORT) over "
            "streaming HTTP; CHECKPOINT is then the model directory it serves (tokenizer).")
        ] = None,
        endpoint: Annotated[str, typer.Option(
            "--endpoint", help="With --base-url: /v1/completions (token-id prompts) or "
            "/v1/chat/completions.")] = "/v1/completions",
        model: Annotated[str | None, typer.Option(
            "--model", help="With --base-url: the model id to request (default: the first "
            "in /v1/models).")] = None,
        api_key: Annotated[str | None, typer.Option(
            "--api-key", envvar="OPENAI_API_KEY", help="With --base-url: the server's API key "
            "(env OPENAI_API_KEY).")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help="Print every metric as JSON instead of the table.")] = False,
        out: Annotated[Path | None, typer.Option(
            "--out", metavar="FILE", help="Also write every metric as JSON to FILE.")] = None,
        *, engine: EngineOptions,
    ) -> None:
        """Benchmark serving: TTFT, TPOT, ITL, latency, throughput, prefix hits, KV usage.

        In-process by default; --base-url measures any OpenAI-compatible server instead."""
        from astrai.infer.bench import BenchConfig, parse_range, parse_rate, parse_slos
        from astrai.infer.config import CacheConfig, SchedulerConfig

        config = BenchConfig(
            target=str(checkpoint_path(target)), workload=workload, num_prompts=num_prompts,
            input_len=None if input_len is None else parse_range(input_len, "--input-len"),
            output_len=None if output_len is None else parse_range(output_len, "--output-len"),
            prefix_len=prefix_len, prefix_groups=prefix_groups,
            request_rate=parse_rate(request_rate), burstiness=burstiness,
            max_concurrency=max_concurrency, warmup=warmup,
            temperature=temperature, ignore_eos=not stop_at_eos, slos=parse_slos(goodput),
            backends=_backends(backend, compare_backends),
            threads=None if threads is None else use_threads(threads),
            **engine.engine_fields(seed=seed),
            cache=CacheConfig.from_dict(dict(
                page_size=page_size, max_kv_tokens=max_kv_tokens, max_requests=max_requests,
                radix=not no_radix, max_context=max_context,
                dtype=kv_dtype)),
            scheduler=SchedulerConfig.from_dict(dict(max_step_tokens=max_step_tokens)),
            base_url=base_url, endpoint=endpoint, model=model, api_key=api_key,
        )
        if base_url is None:
            warn_dtype(engine.device, engine.dtype)
        report = _run(config).to_dict()
        if out is not None:
            from astrai.atomic import write_json_atomic

            write_json_atomic(out, report)
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            from astrai_cli.options import log_console

            render(report, log_console())


def _run(config: Any) -> Any:
    if config.base_url is not None:
        from astrai.serve.bench import http_serve_bench as serve_bench
    else:
        from astrai.infer.bench import serve_bench

    err = Console(stderr=True, highlight=False)
    if not err.is_terminal:
        return serve_bench(config)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done)

        return serve_bench(config, progress)
