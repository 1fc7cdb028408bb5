"""The `astrai` command: a thin dispatch table onto library functions.

Each command lives in its own module under `astrai_cli/commands/` and exposes
`register(app)`. Only commands that work are registered here.
"""

from __future__ import annotations

import typer

from astrai import __version__
from astrai_cli.commands import (
    chat_cmd,
    eval_cmd,
    export_cmd,
    info_cmd,
    inspect_cmd,
    kernels_cmd,
    plot_cmd,
    preprocess_cmd,
    quickstart_cmd,
    resume_cmd,
    serve_bench_cmd,
    serve_cmd,
    tokenizer_cmd,
    train_cmd,
)
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


# Each command module exposes register(app); add one line per working command.
COMMANDS: list = [quickstart_cmd,
                  info_cmd, export_cmd, kernels_cmd, tokenizer_cmd, preprocess_cmd, inspect_cmd,
                  chat_cmd, eval_cmd, serve_cmd, serve_bench_cmd, train_cmd, resume_cmd,
                  plot_cmd]
for _module in COMMANDS:
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
