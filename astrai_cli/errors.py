"""How the CLI shows failures: one line and exit 2 for a user mistake, traceback with --debug."""

from __future__ import annotations

import traceback

import click
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from astrai.errors import AstraiError

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


class AstraiGroup(TyperGroup):
    """The root command group: renders `AstraiError` as one line and exits 2."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except AstraiError as e:
            if ctx.params.get("debug"):
                stderr.print(traceback.format_exc(), markup=False)
            stderr.print(f"[bold red]error:[/] {escape(str(e))}", markup=True)  # [eval] stays
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            stderr.print("interrupted")
            ctx.exit(130)
