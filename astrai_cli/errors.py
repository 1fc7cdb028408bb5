"""How the CLI shows failures: one line and exit 2 for a user mistake, traceback with --debug."""

from __future__ import annotations

import traceback

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from astrai.errors import AstraiError

stderr = Console(stderr=True, highlight=False, soft_wrap=True)
# Newer typer raises the usage errors of its own bundled click, older typer click's.
USAGE_ERRORS = tuple({click.UsageError, *(c for c in typer.BadParameter.__mro__
                                          if c.__name__ == "UsageError")})


class AstraiGroup(TyperGroup):
    """The root command group: renders `AstraiError` and the option parser's usage errors
    as one line and exits 2."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except AstraiError as e:
            if ctx.params.get("debug"):
                stderr.print(traceback.format_exc(), markup=False)
            stderr.print(f"[bold red]error:[/] {escape(str(e))}", markup=True)  # [x] is text
            ctx.exit(e.exit_code)
        except USAGE_ERRORS as e:  # the option parser's: one line too, not a boxed panel
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            stderr.print(f"[bold red]error:[/] {e.format_message()} (see {where} --help)",
                         markup=True, highlight=False)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            stderr.print("interrupted")
            ctx.exit(130)
