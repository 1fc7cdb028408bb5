"""`astrai info CHECKPOINT_OR_PRESET`: config, parameters by component, FLOPs, weight memory."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from astrai_cli.options import checkpoint_path, log_console


def _num(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _config_value(key: str, value) -> str:
    if key == "rope_scaling" and isinstance(value, dict):
        if value.get("type") == "none":
            return "none"
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None)
    return str(value)


def _meta_value(key: str, value: Any) -> str:
    """A meta.json scalar for the table: the save time (Unix seconds) as ISO 8601 local
    time with its UTC offset; the JSON keeps the number."""
    if key == "timestamp" and isinstance(value, (int, float)) and not isinstance(value, bool):
        from datetime import datetime

        return datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")
    return str(value)


def render(info: dict, console: Console) -> None:
    src = info["source"]
    if src["kind"] == "preset":
        title = f"preset {src['name']}"
    else:
        kind = src["format"] + (f", {src['model_type']}" if "model_type" in src else "")
        title = f"{src['path']} ({kind})"
    cfg = Table(title=f"Model: {title}", show_header=False, title_justify="left")
    cfg.add_column("field", style="cyan")
    cfg.add_column("value")
    for key, value in info["config"].items():
        moe_field = key.startswith("moe_") or key == "n_shared_experts"
        if moe_field and not info["config"]["n_experts"]:
            continue
        cfg.add_row(key, _config_value(key, value))
    for key, value in (src.get("meta") or {}).items():
        cfg.add_row(f"meta.{key}", _meta_value(key, value))
    for key, value in (src.get("gguf") or {}).items():
        cfg.add_row(f"gguf {key}", str(value))
    for note in src.get("notes") or []:
        cfg.add_row("note", note)
    console.print(cfg)

    p = info["params"]
    params = Table(title="Parameters", title_justify="left")
    params.add_column("component", style="cyan")
    params.add_column("count", justify="right")
    params.add_column("share", justify="right")
    for key in ("embedding", "attention", "mlp", "router", "norms", "lm_head"):
        if key == "router" and not p[key]:
            continue
        params.add_row(key, f"{p[key]:,}", f"{100 * p[key] / p['total']:.1f}%")
    params.add_row("total", f"{p['total']:,} ({_num(p['total'])})", "100%", style="bold")
    if p["active"] != p["total"]:
        params.add_row("active per token", f"{p['active']:,} ({_num(p['active'])})",
                       f"{100 * p['active'] / p['total']:.1f}%")
    console.print(params)

    f, mem = info["flops_per_token"], info["weight_memory_bytes"]
    compute = Table(title="Compute and memory", title_justify="left", show_header=False)
    compute.add_column("quantity", style="cyan")
    compute.add_column("value", justify="right")
    ctx = f"T={f['seq_len']}" + (f", window {f['attention_context']}"
                                 if f["attention_context"] != f["seq_len"] else "")
    compute.add_row(f"FLOPs/token forward ({ctx})", _num(f["forward"]))
    compute.add_row(f"FLOPs/token training ({ctx})", _num(f["training"]))
    compute.add_row("N in 6N (matmul params)", f"{f['matmul_params']:,}")
    compute.add_row("weights fp32", _bytes(mem["fp32"]))
    compute.add_row("weights bf16", _bytes(mem["bf16"]))
    console.print(compute)


def register(app: typer.Typer) -> None:
    @app.command("info")
    def info_cmd(
        target: Annotated[str, typer.Argument(
            metavar="CHECKPOINT_OR_PRESET",
            help="A preset (tiny, small, 125m, 1.2b), a checkpoint directory (astrai or HF) or a "
            ".gguf file.")],
        seq_len: Annotated[int | None, typer.Option(
            "--seq-len", help="Context length of the FLOPs attention term [default: max_seq_len]."
        )] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help="Print JSON instead of tables.")] = False,
    ) -> None:
        """Show a model's config, parameters by component, FLOPs per token and weight memory."""
        from astrai.model.describe import describe  # lazily: `astrai --help` stays fast

        info = describe(str(checkpoint_path(target)), seq_len)
        if as_json:
            typer.echo(json.dumps(info, indent=2))
        else:
            render(info, log_console())
