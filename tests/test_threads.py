"""--threads N|auto: validation, the measured choice, and the commands that take it."""

import os

import pytest
import torch
from typer.testing import CliRunner

from astrai.errors import ConfigError
from astrai.threads import apply_threads, fastest_threads, parse_threads, probe_seconds
from astrai_cli.main import app


@pytest.fixture
def restore_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_parse_threads():
    assert parse_threads(None) is None and parse_threads("auto") == "auto"
    assert parse_threads("3") == 3 and parse_threads(2) == 2
    for bad in ("0", "-1", "two", "1.5", True):
        with pytest.raises(ConfigError, match="--threads .*positive number of threads or 'auto'"):
            parse_threads(bad)


def test_fastest_threads_takes_the_faster_count_and_restores(restore_threads):
    torch.set_num_threads(2)
    seen = []

    def probe():  # pretend the machine is busy: one thread is faster
        seen.append(torch.get_num_threads())
        return 1.0 if torch.get_num_threads() == 1 else 5.0

    assert fastest_threads(probe) == (1, 1.0)
    assert seen == [2, 1] and torch.get_num_threads() == 2
    assert fastest_threads(lambda: 1.0 / torch.get_num_threads()) == (2, 0.5)


def test_apply_threads(restore_threads):
    torch.set_num_threads(2)
    assert apply_threads(None) == 2
    assert apply_threads(1) == 1 and os.environ["OMP_NUM_THREADS"] == "1"  # for workers too
    torch.set_num_threads(2)
    assert apply_threads("auto", lambda: 1.0 if torch.get_num_threads() == 1 else 2.0) == 1
    assert probe_seconds(repeats=1) > 0


def test_commands_take_threads(restore_threads, tmp_path):
    runner = CliRunner()
    for cmd in (["train", "--data", str(tmp_path), "--out", str(tmp_path / "r")],
                ["resume", str(tmp_path)], ["chat", str(tmp_path), "-p", "hi"],
                ["serve-bench", "tiny"]):
        r = runner.invoke(app, [*cmd, "--threads", "none"])
        assert r.exit_code == 2, (cmd, r.output)
        assert "--threads none:" in r.output, (cmd, r.output)
