"""`astrai serve`: bad flags fail in one line with exit 2 before anything loads (the
running server is driven as a subprocess in tests/serve)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai_cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(("args", "words"), [
    (["/no/such/dir"], "not a checkpoint directory"),
    (["/no/such/dir", "--max-running", "0"], "--max-running"),
    (["/no/such/dir", "--port", "70000"], "--port"),
    (["/no/such/dir", "--api-key", ""], "--api-key"),
    (["/no/such/dir", "--quantize", "int3"], "--quantize 'int3': use none or int8, int4"),
    (["/no/such/dir", "--kv-cache-dtype", "fp8"], "'fp8': use auto, float32, bfloat16 or float16"),
    (["/no/such/dir", "--lora", "sql"], "--lora 'sql': expected NAME=DIR"),
    (["/no/such/dir", "--lora", "a=/x", "--lora", "a=/y"], "--lora a: given twice"),
    (["/no/such/dir", "--max-loras", "0"], "--max-loras 0: must be >= 1"),
    (["/no/such/dir", "--response-store-max", "-1"], "--response-store-max -1: must be >= 0"),
    (["/no/such/dir", "--response-store-bytes", "-5"], "--response-store-bytes -5"),
    (["/no/such/dir", "--response-store-ttl", "0"], "--response-store-ttl 0.0: must be > 0"),
    (["/no/such/dir", "--response-store-ttl", "nan"], "--response-store-ttl nan"),
])
def test_bad_input_exits_2_in_one_line(args, words):
    r = runner.invoke(app, ["serve", *args])
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


def test_chat_template_file_must_exist(tmp_path):
    missing = tmp_path / "x"
    r = runner.invoke(app, ["serve", str(tmp_path), "--chat-template", str(missing)])
    assert r.exit_code == 2, r.output
    # the check's own line, before the (empty) checkpoint directory is even looked at
    assert f"--chat-template {missing}: no such file" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "config.json" not in r.output


def test_a_bad_api_key_is_refused_before_loading():
    for key, words in [(" sk", "spaces"), ("sk\n", "control"), ("\udcff", "UTF-8")]:
        r = runner.invoke(app, ["serve", "/no/such/dir", "--api-key", key])
        assert r.exit_code == 2 and words in r.output, r.output


def test_a_non_loopback_host_without_a_key_warns(tmp_path):
    r = runner.invoke(app, ["serve", str(tmp_path / "none"), "--host", "0.0.0.0",
                            "--port", "0"])
    assert r.exit_code == 2 and "warning: --host 0.0.0.0 without --api-key" in r.output
    r = runner.invoke(app, ["serve", str(tmp_path / "none"), "--port", "0"])
    assert r.exit_code == 2 and "warning" not in r.output
    r = runner.invoke(app, ["serve", str(tmp_path / "none"), "--host", "0.0.0.0",
                            "--port", "0", "--api-key", "k"])
    assert r.exit_code == 2 and "warning" not in r.output


def _serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`astrai serve` as a process: these refusals must come before it loads or listens (a
    server that starts instead would run until the timeout)."""
    return subprocess.run([sys.executable, "-m", "astrai_cli.main", "serve", *args,
                           "--device", "cpu", "--threads", "1"], check=False,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_an_empty_api_key_variable_is_refused_like_an_empty_flag(tmp_path):
    ckpt = _ckpt(tmp_path)
    for args, env in [(["--port", "0"], {"ASTRAI_API_KEY": ""}),
                      (["--port", "0", "--api-key", ""], {})]:
        r = _serve([str(ckpt), *args], env)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "ASTRAI_API_KEY" in r.stderr, r.stderr


def test_a_port_in_use_is_one_line_before_the_model_loads(tmp_path):
    ckpt = _ckpt(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _serve([str(ckpt), "--port", str(port)], {})
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip()
    assert "\n" not in err and "already in use" in err and "--port 0" in err, err


def _ckpt(root: Path) -> Path:
    from astrai.data.testing import tiny_tokenizer
    from astrai.model import ModelConfig, build_model
    from astrai.model.checkpoint import save_checkpoint

    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=32, max_seq_len=64)
    return save_checkpoint(root / "ckpt", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)


def test_a_missing_lora_directory_is_one_line_before_the_model_loads(tmp_path):
    r = runner.invoke(app, ["serve", str(tmp_path), "--lora", f"sql={tmp_path / 'nope'}"])
    assert r.exit_code == 2, r.output
    assert "--lora sql=" in r.output and "not a directory" in r.output


def test_serve_takes_its_log_handler_back_when_it_returns(tmp_path, monkeypatch):
    """In one process that runs several commands (tests, a notebook), a finished `serve`
    must not leave a handler on the library's loggers writing to its (closed) stderr: a
    later command's INFO line would print "--- Logging error ---" into that command's
    output (it broke `serve-bench --json` run after it)."""
    import logging

    import astrai.serve

    loggers = [logging.getLogger(n) for n in ("astrai.serve", "astrai.infer", "astrai.kernels")]
    before = [(list(lg.handlers), lg.level) for lg in loggers]
    seen = []
    monkeypatch.setattr(astrai.serve, "serve", lambda config, on_ready=None: seen.append(
        [lg.level for lg in loggers]))
    r = runner.invoke(app, ["serve", str(_ckpt(tmp_path))])
    assert r.exit_code == 0, r.output
    assert seen == [[logging.INFO] * 3]  # INFO while it served
    assert [(list(lg.handlers), lg.level) for lg in loggers] == before
