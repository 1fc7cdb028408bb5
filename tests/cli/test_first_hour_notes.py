"""Small messages a first session meets: chat --prompt says why a reply was cut, counts are
in words ("1 process"), and `info` shows when a checkpoint was saved as local ISO time."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import torch
from typer.testing import CliRunner

from astrai.data.testing import tiny_dataset, tiny_tokenizer
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Stop-token logits 0: greedy replies run until a limit stops them."""
    root = tmp_path_factory.mktemp("notes")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=256)
    model = build_model(cfg, seed=0)
    with torch.no_grad():
        model.lm_head.weight[tok.stop_ids] = 0
    return save_checkpoint(root / "ck", model, cfg, tokenizer_dir=tok.path,
                           meta={"step": 3, "timestamp": 1_700_000_000.25})


def chat(ckpt, *args):
    return runner.invoke(app, ["chat", str(ckpt), "--temperature", "0", "--device", "cpu",
                               "--threads", "1", "--prompt", "Hello there", *args])


def test_prompt_reply_cut_at_max_tokens_says_so_on_stderr(ckpt):
    r = chat(ckpt, "--max-tokens", "5")
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == "(reply cut at --max-tokens 5)"
    assert "cut" not in r.stdout  # stdout stays the reply alone


def test_prompt_reply_cut_at_the_context_says_so(ckpt):
    r = chat(ckpt, "--max-tokens", "200", "--max-context", "48")
    assert r.exit_code == 0, r.output
    assert "(reply cut at the context length: prompt and reply filled all 48 tokens)" in \
        r.stderr


def test_info_shows_the_save_time_as_local_iso(ckpt):
    r = runner.invoke(app, ["info", str(ckpt)])
    assert r.exit_code == 0, r.output
    want = datetime.fromtimestamp(1_700_000_000.25).astimezone().isoformat(timespec="seconds")
    assert "meta.timestamp" in r.stdout and want in r.stdout
    assert "1700000000.25" not in r.stdout
    info = json.loads(runner.invoke(app, ["info", str(ckpt), "--json"]).stdout)
    assert info["source"]["meta"]["timestamp"] == 1_700_000_000.25  # JSON: the number


def test_single_process_plan_says_1_process(tmp_path):
    data = tiny_dataset(tmp_path, max_seq_len=32, n=16, n_val=4)
    r = runner.invoke(app, ["train", "--strategy", "seq", "--data", str(data), "--model",
                            "tiny", "--model-overrides", "n_layers=1", "--dry-run",
                            "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "1 process x" in r.stdout and "1 processes" not in r.stdout
    assert "1 node x" in r.stdout and "node(s)" not in r.stdout
    r = runner.invoke(app, ["train", "--strategy", "seq", "--data", str(data), "--model",
                            "tiny", "--model-overrides", "n_layers=1", "--grad-accum-steps", "1000",
                            "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "x 1 process)" in r.stderr, r.output
