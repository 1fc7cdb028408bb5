"""`astrai serve`: bad flags fail in one line with exit 2 before anything loads (the
running server is driven as a subprocess in tests/serve)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from astrai_cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(("args", "words"), [
    (["/no/such/dir"], "not a checkpoint directory"),
    (["/no/such/dir", "--max-running", "0"], "--max-running"),
    (["/no/such/dir", "--port", "70000"], "--port"),
    (["/no/such/dir", "--api-key", ""], "--api-key"),
])
def test_bad_input_exits_2_in_one_line(args, words):
    r = runner.invoke(app, ["serve", *args])
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def test_chat_template_file_must_exist(tmp_path):
    r = runner.invoke(app, ["serve", str(tmp_path), "--chat-template", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--chat-template" in r.output
