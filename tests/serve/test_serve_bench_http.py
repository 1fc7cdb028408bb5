"""`astrai serve-bench --base-url`: the same workload and metrics over HTTP, against a real
`astrai serve`, on both endpoints."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from astrai_cli.commands.serve_bench_cmd import render
from astrai_cli.main import app
from tests.serve.conftest import API_KEY

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
FAST = ["--num-prompts", "6", "--input-len", "4:20", "--output-len", "3:9", "--warmup", "1",
        "--max-concurrency", "3", "--request-rate", "200", "--json"]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_http_mode_measures_the_same_workload(server, ckpt, endpoint):
    r = CliRunner().invoke(app, ["serve-bench", str(ckpt), *FAST, "--base-url", server.url,
                                 "--endpoint", endpoint, "--api-key", API_KEY])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    (run,) = d["runs"]
    assert run["backend"] == server.url + endpoint and run["failed"] == 0, run.get("errors")
    assert run["completed"] == 6
    # ignore_eos: exactly the planned output lengths, as the in-process mode generates.
    local = CliRunner().invoke(app, ["serve-bench", str(ckpt), *FAST, "--device", "cpu"])
    assert local.exit_code == 0, local.output
    (lrun,) = json.loads(local.stdout)["runs"]
    assert run["total_output_tokens"] == lrun["total_output_tokens"]
    if endpoint == "/v1/completions":  # token-id prompts: the same input tokens too
        assert run["total_input_tokens"] == lrun["total_input_tokens"]
    assert run["peak_concurrency"] <= 3
    assert run["mean_ttft_ms"] > 0 and run["mean_itl_ms"] > 0
    assert d["model"] == {"kind": "server", "name": "tiny", "path": str(ckpt),
                          "base_url": server.url}
    assert d["settings"]["endpoint"] == endpoint
    out = io.StringIO()
    render(d, Console(file=out, width=200))  # the table renders the server's run too
    assert f"model 'tiny' served at {server.url}" in out.getvalue() and "Time to first token" in out.getvalue()


def test_http_mode_errors_are_one_line(ckpt):
    r = CliRunner().invoke(app, ["serve-bench", str(ckpt), "--base-url", "ftp://x"])
    assert r.exit_code == 2 and "--base-url" in r.output
    r = CliRunner().invoke(app, ["serve-bench", str(ckpt), "--base-url", "http://127.0.0.1:9",
                                 "--num-prompts", "1"])
    assert r.exit_code == 2 and "cannot connect" in r.output
