"""How the CLI shows failures: one line and exit 2 for a user mistake, traceback with --debug.

The root group also loads each command's module only when that command is used (see
astrai_cli/commands/__init__.py), so TAB and `astrai --help` import no heavy library.
"""

from __future__ import annotations

import importlib
import traceback
from difflib import get_close_matches

import click
import typer
from typer.core import TyperCommand, TyperGroup

from astrai.errors import AstraiError
from astrai_cli.commands import COMMANDS
from astrai_cli.help import HelpMixin

# Newer typer raises the usage errors of its own bundled click, older typer click's.
USAGE_ERRORS = tuple({click.UsageError, *(c for c in typer.BadParameter.__mro__
                                          if c.__name__ == "UsageError")})


def escape_text(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


class AstraiCommand(HelpMixin, TyperCommand):
    """A command whose --help keeps option names whole (astrai_cli/help.py)."""

    __slots__ = ()


class AstraiSubGroup(HelpMixin, TyperGroup):
    """A command group below the root (`astrai tokenizer`)."""

    __slots__ = ()


def adopt(app: typer.Typer) -> typer.Typer:
    """Build the commands (and groups) registered on `app` with astrai's --help layout."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = AstraiCommand
        elif isinstance(info.cls, type) and not issubclass(info.cls, HelpMixin):
            info.cls = type(info.cls.__name__, (HelpMixin, info.cls), {"__slots__": ()})
    for group in app.registered_groups:
        if not isinstance(group.cls, type) or group.cls is TyperGroup:  # unset or typer's
            group.cls = AstraiSubGroup
        if group.typer_instance is not None:
            adopt(group.typer_instance)
    return app


class AstraiGroup(HelpMixin, TyperGroup):
    """The root command group: loads commands lazily from `COMMANDS`; renders `AstraiError`
    and the option parser's usage errors as one line and exits 2."""

    _listing = False  # True while only names and summaries are needed (help, TAB)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.commands, *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx: click.Context | None, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            module, summary = COMMANDS[name]
            if self._listing:  # the summary is all a listing shows: import nothing
                return click.Command(name, help=summary, short_help=summary)
            sub = typer.Typer(rich_markup_mode=self.rich_markup_mode)
            importlib.import_module(f"astrai_cli.commands.{module}").register(sub)
            cmd = typer.main.get_group(adopt(sub)).commands[name]
            cmd.short_help = summary
            self.commands[name] = cmd
        return self.commands.get(name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def shell_complete(self, ctx: click.Context, incomplete: str):  # TAB after `astrai `
        self._listing = True
        try:
            return super().shell_complete(ctx, incomplete)
        finally:
            self._listing = False

    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except USAGE_ERRORS as e:  # typer suggests from loaded commands only
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches and "Did you mean" not in e.message:
                e.message = (f"{e.message.rstrip('.')}. Did you mean "
                             f"{', '.join(repr(m) for m in matches)}?")
            raise

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except AstraiError as e:
            from rich.markup import escape

            stderr = _stderr()
            if ctx.params.get("debug"):
                stderr.print(traceback.format_exc(), markup=False)
            stderr.print(f"[bold red]error:[/] {escape(str(e))}", markup=True)  # [x] is text
            ctx.exit(e.exit_code)
        except USAGE_ERRORS as e:  # the option parser's: one line too, not a boxed panel
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            _stderr().print(f"[bold red]error:[/] {e.format_message()} (see {where} --help)",
                            markup=True, highlight=False)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            _stderr().print("interrupted")
            ctx.exit(130)
        except Exception as e:  # a full disk, however the writer said it: one line too
            from astrai.diskfull import full_message, is_disk_full

            if not is_disk_full(e):
                raise
            if ctx.params.get("debug"):
                _stderr().print(traceback.format_exc(), markup=False)
            path = getattr(e, "filename", None) or "."
            _stderr().print(f"[bold red]error:[/] {escape_text(full_message(path))}",
                            markup=True)
            ctx.exit(2)
