"""`astrai train` / `astrai resume` through the CLI on real `astrai preprocess` datasets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai.data.testing import tiny_dataset
from astrai_cli.main import app

runner = CliRunner()
SMALL = ["--model", "tiny", "--model-overrides", "dim=64", "--model-overrides", "n_layers=2",
         "--model-overrides", "ffn_dim=128", "--window-size", "64", "--device", "cpu",
         "--peak-tflops", "1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return {"pretrain": tiny_dataset(root, "pretrain", n=24, n_val=4),
            "sft": tiny_dataset(root, "sft", n=48, n_val=8)}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("strategy", ["seq", "sft"])
def test_train_writes_run_dir_and_json_summary(datasets, tmp_path, strategy):
    kind = "pretrain" if strategy == "seq" else "sft"
    out = tmp_path / "run"
    r = invoke("train", "--strategy", strategy, "--data", datasets[kind], "--out", out,
               *SMALL, "--batch-size", 4, "--max-steps", 3, "--eval-interval", 3, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["steps"] == 3 and s["checkpoint"].endswith("step_3")
    assert "step 3/3 (100%) · loss" in r.stderr  # stderr is not a terminal: plain lines
    assert set(s["validation"]) == {"val_loss", "val_ppl", "val_bpb"}
    ckpt = out / "checkpoints" / "step_3"
    for f in ("model.safetensors", "config.json", "tokenizer.json", "meta.json",
              "optimizer.pt", "scheduler.pt", "trainer_state.pt"):
        assert (ckpt / f).is_file(), f
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["train_config"]["strategy"] == strategy and meta["step"] == 3
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in recs] == [1, 2, 3] and "val_bpb" in recs[-1]
    assert json.loads((out / "train_config.json").read_text())["batch_size"] == 4


def test_dry_run_prints_plan_and_writes_nothing(datasets, tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("batch_size: 2\ngrad_accum_steps: 3\nepochs: 2\n")
    out = tmp_path / "run"
    r = invoke("train", "--config", cfg, "--data", datasets["pretrain"], "--out", out, *SMALL,
               "--batch-size", 4, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    n = plan["dataset_samples"]
    assert plan["batch_size"] == 4 and plan["grad_accum_steps"] == 3  # flag > file > default
    assert plan["effective_batch"] == 12 and plan["seq_len"] == 64
    assert plan["total_steps"] == (-(-n // 4) // 3) * 2
    assert plan["memory_bytes"]["total"] > 0
    assert not out.exists()
    r = invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL, "--dry-run")
    assert r.exit_code == 0 and "effective batch" in r.stdout
    # a config file nested by section; a flag still beats its field
    cfg.write_text("grad_accum_steps: 3\noptimizer:\n  max_lr: 0.002\n  name: muon\n"
                   "schedule:\n  name: wsd\n")
    r = invoke("train", "--config", cfg, "--data", datasets["pretrain"], "--out", out, *SMALL,
               "--max-lr", "0.001", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert (plan["optimizer"], plan["schedule"], plan["max_lr"]) == ("muon", "wsd", 0.001)
    assert plan["grad_accum_steps"] == 3 and not out.exists()


def test_bad_inputs_one_line_exit_2_nothing_written(datasets, tmp_path):
    out = tmp_path / "run"
    # a dataset of the wrong kind for the strategy
    one_line_error(invoke("train", "--strategy", "sft", "--data", datasets["pretrain"],
                          "--out", out, *SMALL), "'pretrain' dataset", "sft")
    # a model whose vocabulary does not hold the dataset's tokenizer
    mcfg = tmp_path / "model.json"
    mcfg.write_text(json.dumps({"vocab_size": 300, "dim": 32, "n_layers": 1, "n_heads": 2,
                                "ffn_dim": 64, "max_seq_len": 128}))
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out,
                          "--model", mcfg), "vocab_size 300", "512")
    # an unknown key in the YAML config, with its line
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_size: 2\nlearning_rate: 0.1\n")
    one_line_error(invoke("train", "--config", bad, "--data", datasets["pretrain"], "--out",
                          out, *SMALL), "bad.yaml: line 2", "learning_rate")
    # missing required options, unknown strategy, bad values
    one_line_error(invoke("train", "--out", out, *SMALL), "`data` is required")
    one_line_error(invoke("train", "--strategy", "ppo", "--data", datasets["pretrain"],
                          "--out", out, *SMALL), "unknown 'ppo'")
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL,
                          "--grad-accum-steps", 1000), "fewer than one optimizer step")
    one_line_error(invoke("train", "--data", tmp_path / "nope", "--out", out, *SMALL),
                   "nope")
    # the option parser's errors are one line too
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--max-lr", "abc"),
                   "Invalid value for '--max-lr'", "astrai train --help")
    # a reference model: checked before the run directory exists, refused where unused
    one_line_error(invoke("train", "--strategy", "sft", "--data", datasets["sft"], "--out",
                          out, *SMALL, "--ref-model", "tiny"),
                   "ref_model: strategy 'sft' has no reference model")
    one_line_error(invoke("train", "--strategy", "dpo", "--data", datasets["sft"], "--out",
                          out, *SMALL, "--ref-model", tmp_path / "nope"),
                   "ref_model:", "neither a preset")
    # weights where a model is expected
    (tmp_path / "model.safetensors").write_bytes(b"\x98\x00\xff" * 10)
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out,
                          "--model", tmp_path / "model.safetensors"), "model.safetensors")
    assert not out.exists()
    # an existing run directory is never overwritten
    out.mkdir()
    (out / "x").write_text("keep")
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL),
                   "already exists", "astrai resume")
    # resume of a directory without a complete checkpoint
    (tmp_path / "empty").mkdir()
    one_line_error(invoke("resume", tmp_path / "empty"), "no complete checkpoint")


def _argv(data, out, steps, ckpt):
    return ["train", "--strategy", "sft", "--data", str(data), "--out", str(out), *SMALL,
            "--batch-size", "2", "--grad-accum-steps", "2", "--max-steps", str(steps),
            "--ckpt-interval", str(ckpt), "--max-lr", "3e-3"]


# `astrai train` as the console script runs it, plus one observer that holds the run inside
# step N + 1 (after checkpoint step_N was written) and says so: the test kills it there,
# whatever the machine's speed.
HOLD = """
import sys, threading
import astrai.train.run as run
from astrai.train.callbacks import Callback
n = int(sys.argv[1])

class Hold(Callback):
    name = "hold"
    def on_batch_begin(self, ctx, micro):
        if ctx.state.step == n:
            print("holding", flush=True)
            threading.Event().wait()

defaults = run.default_callbacks
run.default_callbacks = lambda *a, **k: [*defaults(*a, **k), Hold()]
sys.argv = ["astrai", *sys.argv[2:]]
from astrai_cli.main import main
main()
"""


def test_kill9_then_astrai_resume_is_bit_identical(datasets, tmp_path):
    """`astrai train` killed with SIGKILL after step N, then `astrai resume RUN_DIR`, ends
    with the same model.safetensors bytes as a straight run to 2N, and metrics.jsonl has
    each step exactly once."""
    N = 3
    straight = tmp_path / "straight"
    assert invoke(*_argv(datasets["sft"], straight, 2 * N, N)).exit_code == 0
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(N),
                             *map(str, _argv(datasets["sft"], out, 2 * N, N))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in proc.stdout:  # ends at EOF should the run die first
        if line.startswith("holding"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    step_n = out / "checkpoints" / f"step_{N}"
    assert proc.returncode == -signal.SIGKILL
    assert step_n.is_dir() and not (out / "checkpoints" / f"step_{2 * N}").exists()
    r = invoke("resume", out, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["steps"] == 2 * N and s["resumed_from"].endswith(f"step_{N}")
    final = Path("checkpoints") / f"step_{2 * N}" / "model.safetensors"
    assert (out / final).read_bytes() == (straight / final).read_bytes()

    def losses(d):
        return [(x["step"], x["loss"]) for x in
                map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]

    assert losses(out) == losses(straight)
    # a finished run: resume says so instead of reporting a zero-step "training"
    r = invoke("resume", straight)
    assert r.exit_code == 0, r.output
    assert f"nothing to resume: {straight} already finished at step 6 / 6" in " ".join(
        r.stdout.split())


def test_preempted_summary_names_the_resume_command():
    import io

    from rich.console import Console

    from astrai_cli.commands.train_cmd import render_summary

    buf = io.StringIO()
    render_summary({"run_dir": "runs/x", "checkpoint": "runs/x/checkpoints/step_4", "steps": 4,
                    "total_steps": 9, "final_loss": 1.5, "consumed_tokens": 10,
                    "elapsed_s": 1.0, "tokens_per_s": 10.0, "preempted": True, "steps_run": 4},
                   Console(file=buf, width=200))
    assert "continue with: astrai resume runs/x" in buf.getvalue()


def test_muon_dry_run_shows_groups_and_refusals_exit_2(datasets, tmp_path):
    out = tmp_path / "run"
    r = invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL, "--optimizer",
               "muon", "--muon-lr", "0.01", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    groups = {g["name"]: g for g in json.loads(r.stdout)["param_groups"]}
    assert groups["muon"]["optimizer"] == "muon" and groups["muon"]["lr"] == 0.01
    assert groups["muon"]["tensors"] == 2 * 7  # q, k, v, o, gate, up, down per block
    assert groups["adamw-no-decay"]["optimizer"] == "adamw"
    r = invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL, "--optimizer",
               "muon", "--dry-run")
    assert r.exit_code == 0 and "muon" in r.stdout and "match_rms_adamw" in r.stdout
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL,
                          "--optimizer", "muon", "--parallel", "fsdp"),
                   "optimizer: Muon", "--parallel ddp")
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL,
                          "--optimizer", "muon", "--lora-rank", "4"), "LoRA")
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL,
                          "--muon-momentum", "0.9"), "--optimizer muon")
    assert not out.exists()


def test_bf16_update_dry_run_shows_bytes_per_param_and_refusal_exit_2(datasets, tmp_path):
    """--dry-run lists weights + gradients + optimizer state per parameter for every
    precision / --bf16-update mode; the option with fp32 weights is a one-line error."""
    out = tmp_path / "run"
    args = ("train", "--data", datasets["pretrain"], "--out", out, *SMALL, "--precision",
            "bf16-true", "--bf16-update", "kahan", "--dry-run")
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    totals = {k: v["total"] for k, v in plan["bytes_per_param"].items()}
    assert totals == {"fp32": 16, "bf16-mixed": 16, "bf16-true nearest": 12,
                      "bf16-true stochastic": 12, "bf16-true kahan": 14}
    assert plan["bf16_update"] == "kahan"
    assert plan["memory_bytes"]["optimizer"] == plan["params"] * 10  # 2 fp32 moments + comp
    r = invoke(*args)
    assert r.exit_code == 0 and "bytes / parameter" in r.stdout
    assert "bf16-true kahan (this run)" in r.stdout and "2 + 2 + 10 = 14" in r.stdout
    one_line_error(invoke("train", "--data", datasets["pretrain"], "--out", out, *SMALL,
                          "--bf16-update", "stochastic"),
                   "bf16_update: 'stochastic' needs --precision bf16-true", "auto = fp32")
    assert not out.exists()
