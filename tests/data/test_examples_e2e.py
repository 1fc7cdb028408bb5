"""The documented quickstart: train a tokenizer on the examples, preprocess every example
spec from the command line, open every dataset."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai.data import open_dataset
from astrai_cli.main import app

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_example_specs_end_to_end(tmp_path, monkeypatch):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)  # the specs' paths are relative to the repository root
    runner = CliRunner()
    r = runner.invoke(app, ["tokenizer", "train", "examples/data/shakespeare_train.jsonl",
                            "--vocab-size", "2048", "--out", "runs/tokenizer", "--json"])
    assert r.exit_code == 0, r.output
    for spec in sorted(Path("examples/specs").glob("*.json")):
        r = runner.invoke(app, ["preprocess", str(spec), "--json"])
        assert r.exit_code == 0, (spec, r.output)
        out = json.loads(r.stdout)
        assert out["splits"]["train"]["malformed"] == 0
        ds = open_dataset(out["output"])
        val = open_dataset(out["output"], "val")
        assert len(ds) > 0 and len(val) > 0
        batch = ds.collate([ds[i] for i in range(min(4, len(ds)))])
        assert batch
    pre = json.loads(Path("runs/data/pretrain/manifest.json").read_text())
    assert pre["splits"]["train"]["dropped_tokens"] == 0
    assert pre["splits"]["train"]["packing_efficiency"] > 0.95
