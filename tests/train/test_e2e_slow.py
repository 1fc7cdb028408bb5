"""Demonstration (slow): tokenizer → preprocess → pretrain → sft from its checkpoint, all
through the CLI on the project's sample data; losses fall and validation improves."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai_cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def ok(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_pretrain_then_sft_losses_fall(tmp_path):
    data = REPO / "examples" / "data"
    tok = tmp_path / "tok"
    ok("tokenizer", "train", data / "shakespeare_train.jsonl", "--vocab-size", 1024,
       "--out", tok)
    specs = {}
    for kind, files, extra in (
        ("pretrain", ("shakespeare_train.jsonl", "shakespeare_val.jsonl"), {}),
        ("sft", ("sft_train.jsonl", "sft_val.jsonl"),
         {"sections": [{"field": "messages", "action": "$role", "template": True}],
          "packing": {"mode": "bfd"}}),
    ):
        spec = {"kind": kind, "inputs": [str(data / files[0])],
                "val_inputs": [str(data / files[1])], "tokenizer": str(tok),
                "output": str(tmp_path / kind), "max_seq_len": 128, "max_records": 400,
                **extra}
        specs[kind] = tmp_path / f"{kind}.json"
        specs[kind].write_text(json.dumps(spec))
        ok("preprocess", specs[kind], "--json")
    small = ["--model-overrides", "dim=128", "--model-overrides", "n_layers=2",
             "--model-overrides", "ffn_dim=384", "--device", "cpu", "--peak-tflops", "1"]
    pre = tmp_path / "pre"
    ok("train", "--strategy", "seq", "--data", tmp_path / "pretrain", "--model", "tiny",
       "--out", pre, "--batch-size", 8, "--max-steps", 60, "--max-lr", 3e-3,
       "--warmup-steps", 5, "--eval-interval", 20, "--eval-max-batches", 4, *small)
    recs = records(pre)
    evals = [r["val_loss"] for r in recs if "val_loss" in r]
    assert len(evals) == 3 and evals[0] > evals[1] > evals[2]
    assert sum(r["loss"] for r in recs[-5:]) / 5 < recs[0]["loss"] - 1.0
    sft = tmp_path / "sft_run"
    ok("train", "--strategy", "sft", "--data", tmp_path / "sft", "--model",
       pre / "checkpoints" / "step_60", "--out", sft, "--batch-size", 8, "--max-steps", 40,
       "--max-lr", 1e-3, "--eval-interval", 20, "--eval-max-batches", 4, "--device", "cpu")
    evals = [r["val_loss"] for r in records(sft) if "val_loss" in r]
    assert evals[-1] < evals[0]
    assert (sft / "checkpoints" / "step_40" / "tokenizer.json").is_file()
