"""`astrai quickstart` end to end (slow): every artifact, the reported bits per byte against
an independent count, and every printed command run as printed; Ctrl-C then resume.

A small model and a fixed step count keep it to about a minute on 2 loaded CPU cores; the
full recipe's time and bits per byte are measured by docs/quickstart.md's run, not here.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from astrai.quickstart import QuickstartConfig
from astrai_cli.main import app

pytestmark = pytest.mark.slow

SMALL = ["--model-overrides", "dim=64", "--model-overrides", "n_layers=2",
         "--model-overrides", "n_heads=2", "--model-overrides", "n_kv_heads=1",
         "--model-overrides", "head_dim=32", "--model-overrides", "ffn_dim=128"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def astrai(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from astrai_cli.main import main; main()",
                           *args], check=False, capture_output=True, text=True, env=ENV,
                          timeout=timeout, **kw)


def printed_commands(stdout: str) -> dict[str, list[str]]:
    """The `astrai ...` lines after "Next:", by subcommand."""
    tail = stdout.split("Next:", 1)[1]
    cmds = [shlex.split(line.strip()) for line in tail.splitlines()
            if line.strip().startswith("astrai ")]
    return {c[1]: c for c in cmds}


def independent_bpb(ckpt: Path, data_dir: Path) -> tuple[float, int]:
    """Bits per byte of the checkpoint on the val split, counted here without the trainer:
    summed NLL (float64, nats) / ln 2 / UTF-8 bytes of every predicted token. The held-out
    text is ASCII, so each token's own decoding has exactly its bytes."""
    from astrai.data.dataset import open_dataset
    from astrai.data.tokenizer import Tokenizer
    from astrai.model.checkpoint import load_checkpoint

    model, _, _ = load_checkpoint(ckpt)
    tok = Tokenizer.load(ckpt)
    special = set(tok.special_ids)
    lengths = {}
    val = open_dataset(data_dir, "val")
    nll, n_bytes = 0.0, 0
    with torch.no_grad():
        for i in range(len(val)):
            row = val[i]
            logits = model(row["input_ids"][None]).logits[0].double()  # (T, V)
            t = row["target_ids"]
            keep = t >= 0
            nll += float(torch.nn.functional.cross_entropy(logits[keep], t[keep],
                                                           reduction="sum"))
            for j in t[keep].tolist():
                if j not in lengths:
                    lengths[j] = 0 if j in special else len(tok.decode([j]).encode("utf-8"))
                n_bytes += lengths[j]
    return nll / math.log(2) / n_bytes, n_bytes


def test_quickstart_end_to_end(tmp_path):
    out = tmp_path / "qs"
    r = astrai("quickstart", "--out", str(out), "--steps", "8", *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    # progress: one start and one done line per stage, on stderr only
    for n, stage in enumerate(["train tokenizer", "preprocess", "size the run", "train",
                               "validate", "sample"], 1):
        assert f"[{n}/6] {stage} ..." in r.stderr and f"[{n}/6] {stage}: done" in r.stderr
    assert "[1/6]" not in r.stdout

    # artifacts
    summary = json.loads((out / "summary.json").read_text())
    ckpt = Path(summary["checkpoint"])
    assert ckpt == out / "run" / "checkpoints" / "step_8"
    for f in ("config.json", "model.safetensors", "tokenizer.json", "meta.json",
              "optimizer.pt", "trainer_state.pt"):
        assert (ckpt / f).is_file(), f
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert (out / "data" / "manifest.json").is_file()
    assert (out / "run" / "metrics.jsonl").is_file()
    if summary["loss_plot"] is not None:  # matplotlib installed (the plot extra)
        assert summary["loss_plot"] == str(out / "loss.png") and (out / "loss.png").is_file()
        assert str(out / "loss.png") in r.stdout
    batch = QuickstartConfig().batch_size  # the default recipe's rows per step
    assert summary["steps"] == 8 and summary["consumed_tokens"] == 8 * batch * 256
    assert summary["vocab_size"] == 2048
    assert summary["sample"].startswith("MACBETH.\n") and len(summary["sample"]) > 12
    assert f"{summary['val_bpb']:.3f} bits per byte" in r.stdout

    # the reported bits per byte is the real one
    bpb, n_bytes = independent_bpb(ckpt, out / "data")
    assert summary["val_bpb"] == pytest.approx(bpb, rel=1e-5)
    # nearly all held-out text is scored (each row's first token is context, not a target)
    assert 0.97 * summary["val_bytes"] <= n_bytes <= summary["val_bytes"]
    metrics = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["val_bpb"] == pytest.approx(summary["val_bpb"])

    # every printed command works as printed
    cmds = printed_commands(r.stdout)
    assert set(cmds) == {"chat", "resume", "inspect-weights", "serve-bench", "preprocess",
                         "train"}
    runner = CliRunner()
    chat = runner.invoke(app, [*cmds["chat"][1:], "--prompt", "hi", "--max-tokens", "8"])
    assert chat.exit_code == 0, chat.output
    resumed = runner.invoke(app, [*cmds["resume"][1:], "--json"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.output)["steps"] == 8
    inspect = runner.invoke(app, cmds["inspect-weights"][1:])
    assert inspect.exit_code == 0, inspect.output  # a healthy fp32 checkpoint
    bench = runner.invoke(app, [*cmds["serve-bench"][1:], "--json"])
    assert bench.exit_code == 0, bench.output
    assert json.loads(bench.output)["runs"][0]["completed"] == 16
    # fine-tuning on the bundled chat data: its tokenizer rebuilds the data, then SFT trains
    pre = runner.invoke(app, cmds["preprocess"][1:])
    assert pre.exit_code == 0, pre.output
    sft = runner.invoke(app, [*cmds["train"][1:], "--max-steps", "1", "--json"])
    assert sft.exit_code == 0, sft.output

    # a second quickstart into the same directory needs --overwrite
    again = astrai("quickstart", "--out", str(out), "--steps", "2", *SMALL)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_ctrl_c_then_resume(tmp_path):
    """Ctrl-C during training saves that step and prints `astrai resume RUN`, which then
    finishes the run (exactness of resume itself is tests/train's business)."""
    out = tmp_path / "qs"
    p = subprocess.Popen([sys.executable, "-c", "from astrai_cli.main import main; main()",
                          "quickstart", "--out", str(out), "--steps", "400", "--seq-len", "64",
                          "--batch-size", "8", *SMALL],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    metrics = out / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):  # step 10 logged
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-2000:]
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 75, stderr[-2000:]  # EX_TEMPFAIL: try again
    assert "stopped during training" in stdout
    resume = next(shlex.split(line) for line in stdout.splitlines() if "astrai resume" in line)
    assert resume[-1] == str(out / "run")
    stopped = sorted((out / "run" / "checkpoints").glob("step_*"))
    assert len(stopped) == 1 and 10 <= int(stopped[0].name.split("_")[1]) < 400
    assert not (out / "summary.json").exists() or \
        json.loads((out / "summary.json").read_text())["preempted"]

    r = astrai(*resume[resume.index("resume"):], "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["steps"] == 400 and "val_bpb" in s["validation"]
