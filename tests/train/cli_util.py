"""Running `astrai` in-process for the train tests, and checking one-line errors."""

from __future__ import annotations

from typer.testing import CliRunner

from astrai_cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line(result, *needles) -> str:
    """Assert `result` is a one-line error (exit 2, no traceback) containing `needles`."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
