"""A checkpoint whose tokenizer does not fit the dataset: the error gives the exact
`astrai preprocess` command that rebuilds the data with the checkpoint's tokenizer, and
that command works as printed."""

from __future__ import annotations

import json
import shlex

from typer.testing import CliRunner

from astrai.data.testing import tiny_corpus_path, tiny_tokenizer
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.main import app

runner = CliRunner()


def test_vocab_error_gives_the_preprocess_command_that_fixes_it(tmp_path):
    big, small = tiny_tokenizer(tmp_path, 512), tiny_tokenizer(tmp_path, 300)
    raw = tmp_path / "raw.jsonl"
    paras = [p for p in tiny_corpus_path().read_text().split("\n\n") if len(p) > 50][:40]
    raw.write_text("".join(json.dumps({"text": p}) + "\n" for p in paras))
    spec = tmp_path / "pre.json"
    spec.write_text(json.dumps({"kind": "pretrain", "inputs": [str(raw)],
                                "tokenizer": str(big.path), "output": str(tmp_path / "data"),
                                "max_seq_len": 64}))
    r = runner.invoke(app, ["preprocess", str(spec), "--set", "max_seq_len=32"])
    assert r.exit_code == 0, r.output
    cfg = ModelConfig(vocab_size=small.vocab_size, dim=32, n_layers=1, n_heads=2,
                      n_kv_heads=1, ffn_dim=64, max_seq_len=64)
    ckpt = save_checkpoint(tmp_path / "ck", build_model(cfg, seed=0), cfg,
                           tokenizer_dir=small.path)
    train = ["train", "--strategy", "seq", "--model", str(ckpt), "--out",
             str(tmp_path / "run"), "--dry-run", "--data"]
    r = runner.invoke(app, [*train, str(tmp_path / "data")])
    assert r.exit_code == 2
    fixed = tmp_path / "data-ck"
    command = (f"astrai preprocess {spec} --set max_seq_len=32 --set tokenizer={ckpt} "
               f"--set output={fixed}")
    assert "vocab_size 300 is smaller than the dataset tokenizer's 512" in r.stderr
    assert f"{command}, then train with --data {fixed}" in r.stderr
    r = runner.invoke(app, shlex.split(command)[1:])  # the command as printed
    assert r.exit_code == 0, r.output
    assert json.loads((fixed / "manifest.json").read_text())["max_seq_len"] == 32
    r = runner.invoke(app, [*train, str(fixed)])
    assert r.exit_code == 0, r.output
