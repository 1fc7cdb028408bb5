"""`astrai plot RUN_DIR...`: training curves of one or more runs as a PNG or SVG."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from astrai.viz.metrics import X_AXES  # light: no matplotlib

XAxis = Enum("XAxis", {k: k for k in X_AXES}, type=str)  # step | tokens | time


def register(app: typer.Typer) -> None:
    @app.command("plot")
    def plot_cmd(
        runs: Annotated[list[Path], typer.Argument(
            metavar="RUN_DIR...", help="Run directories (their metrics.jsonl); several are "
            "overlaid, a resumed run is one curve.")],
        metrics: Annotated[str | None, typer.Option(
            "--metrics", help="Comma-separated metrics.jsonl keys, one panel each "
            "\\[default: loss,val_bpb,lr,grad_norm,tokens_per_s, those present].")] = None,
        x: Annotated[XAxis, typer.Option(
            "--x", help="x axis: step | tokens (consumed_tokens) | time (elapsed_s).")
        ] = XAxis["step"],
        out: Annotated[Path, typer.Option(
            "--out", help="Picture to write: .png or .svg.")] = Path("plot.png"),
        smooth: Annotated[bool, typer.Option(
            "--smooth", help="Draw a TensorBoard-style EMA over each faint raw curve.")
        ] = False,
        smooth_weight: Annotated[float, typer.Option(
            "--smooth-weight", min=0.0, max=0.999,
            help="EMA weight of --smooth (TensorBoard's default).")] = 0.6,
        size: Annotated[str, typer.Option(
            "--size", help="WIDTHxHEIGHT in pixels.")] = "1200x800",
    ) -> None:
        """Plot training curves (loss, validation bits per byte, lr, ...) from metrics.jsonl."""
        from astrai.viz.curves import plot_runs
        from astrai.viz.figure import check_out, parse_size, require_matplotlib, save_figure

        wh = parse_size(size)
        check_out(out)
        require_matplotlib("astrai plot")
        names = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
        fig = plot_runs(runs, metrics=names, x=x.value, smooth=smooth_weight if smooth else 0.0,
                        size=wh)
        # The path goes to stderr, as inspect-weights --plot says it (its stdout is the report).
        typer.echo(f"wrote {save_figure(fig, out)}", err=True)
