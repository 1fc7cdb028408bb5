"""The CLI root: help, version, the one-line error convention and --debug tracebacks."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from astrai import __version__
from astrai_cli.main import app

runner = CliRunner()


def test_help_lists_the_registered_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "info" in result.stdout and "export" in result.stdout


def test_no_arguments_shows_help():
    result = runner.invoke(app, [])
    assert "Usage" in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"astrai {__version__}"


def test_user_mistake_is_one_line_and_exit_2():
    result = runner.invoke(app, ["info", "no-such-preset"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert "no-such-preset" in lines[0] and "tiny" in lines[0]
    assert "Traceback" not in result.output and result.stdout == ""


def test_debug_shows_the_traceback():
    result = runner.invoke(app, ["--debug", "info", "no-such-preset"])
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error:")


def test_unknown_command_is_a_usage_error():
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2 and "No such command" in result.output


@pytest.mark.skipif(shutil.which("astrai") is None, reason="console script not installed")
def test_console_script_entry_point():
    out = subprocess.run(["astrai", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"astrai {__version__}"


def test_a_mistyped_command_suggests_the_right_one():
    """Commands load lazily, so the suggestion comes from the command table, not from the
    commands loaded so far."""
    result = runner.invoke(app, ["trian"])
    assert result.exit_code == 2
    assert "No such command 'trian'. Did you mean 'train'?" in result.output
