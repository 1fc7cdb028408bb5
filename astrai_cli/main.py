"""The `astrai` command: a thin dispatch table onto library functions.

Each command lives in its own module under `astrai_cli/commands/` and exposes
`register(app)`. Only commands that work are registered here.
"""

from __future__ import annotations

import typer

from astrai import __version__
from astrai_cli.errors import AstraiGroup

app = typer.Typer(
    name="astrai",
    cls=AstraiGroup,
    help="From raw text to a trained, aligned, inspected and chatting language model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"astrai {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    """astrai: tokenizer → preprocess → train → inspect → chat."""


# The commands are listed in astrai_cli/commands/__init__.py (COMMANDS) and each module is
# imported only when its command is used: TAB and `astrai --help` stay fast.


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
