"""`astrai resume RUN_DIR`: continue a run exactly from its newest complete checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from astrai_cli.commands.train_cmd import emit, render_summary


def register(app: typer.Typer) -> None:
    @app.command("resume")
    def resume_cmd(
        run_dir: Annotated[Path, typer.Argument(help="Run directory written by `astrai train`.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")
                           ] = False,
    ) -> None:
        """Continue a run from its newest complete checkpoint: weights, optimizer, scheduler,
        data position, RNG states and counters come back, so the result equals an
        uninterrupted run. Needs no other argument: the resolved config is in the checkpoint."""
        from astrai.train.run import resume

        err = Console(stderr=True)
        summary = resume(run_dir, progress=err.is_terminal, console=err)
        if getattr(summary, "rank", 0) == 0:
            emit(summary.to_dict(), as_json, render_summary)
