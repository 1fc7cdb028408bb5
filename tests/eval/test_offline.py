"""`astrai eval --tasks` with no network: the shipped local task (examples/eval/tiny_task)
runs, a Hub task fails in one line at once (not after half a
minute of retries and a traceback), and lm-eval's `git describe` prints nothing."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai.eval.hub import hub_reachable, offline_chosen, probe_address
from astrai_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
TINY_TASK = ROOT / "examples" / "eval" / "tiny_task"


def test_probe_address_follows_the_endpoint_and_the_proxy():
    assert probe_address({}) == ("huggingface.co", 443)
    assert probe_address({"HF_ENDPOINT": "http://mirror.local:8080"}) == ("mirror.local", 8080)
    assert probe_address({"HF_ENDPOINT": "https://hf-mirror.com",
                          "HTTPS_PROXY": "proxy.corp:3128"}) == ("proxy.corp", 3128)
    assert offline_chosen({"HF_DATASETS_OFFLINE": "1"}) and not offline_chosen({})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hub_reachable_opens_a_connection_or_says_no():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert hub_reachable(5.0, {"HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert not hub_reachable(5.0, {"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"})


def test_the_local_example_task_runs_outside_a_git_repository(ckpt, tmp_path, monkeypatch,
                                                              capfd):
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)  # no repository here: `git describe` would print `fatal:`
    out = tmp_path / "res.json"
    r = CliRunner().invoke(app, ["eval", str(ckpt), "--tasks", "tiny_task", "--include-path",
                                 str(TINY_TASK), "--device", "cpu", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "not a git repository" not in capfd.readouterr().err
    got = json.loads(out.read_text())
    assert {row["metric"] for row in got["rows"]} == {"acc", "acc_norm"}
    assert len((TINY_TASK / "tiny_task.jsonl").read_text().splitlines()) == 10
    acc = got["results"]["tiny_task"]["acc,none"]
    assert acc * 10 == pytest.approx(round(acc * 10))  # a share of the ten questions


def test_a_hub_task_without_network_is_one_line(ckpt, tmp_path):
    """The Hub endpoint is a closed local port (as good as no network); nothing is cached."""
    pytest.importorskip("lm_eval")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HF_") and "proxy" not in k.lower()}
    env.update({"HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",
                "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)})
    r = subprocess.run(
        [sys.executable, "-c", "from astrai_cli.main import main; main()", "eval", str(ckpt),
         "--tasks", "arc_easy", "--limit", "2", "--device", "cpu", "--threads", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240, check=False)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert "lm-eval could not fetch a task's dataset from the Hugging Face Hub" in lines[0]
    assert "--include-path examples/eval/tiny_task --tasks tiny_task" in lines[0]
