"""`astrai tokenizer train | info | encode`."""

import json

from typer.testing import CliRunner

from astrai.data.testing import tiny_corpus_path
from astrai_cli.main import app

runner = CliRunner()


def test_train_info_encode(tmp_path):
    out = tmp_path / "tok"
    r = runner.invoke(app, ["tokenizer", "train", str(tiny_corpus_path()), "--vocab-size", "400",
                            "--out", str(out), "--special", "<tool>", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["vocab_size"] == 400 and info["bos"] == ["<|bos|>", 0]
    assert "5" in info["special_tokens"] and info["special_tokens"]["5"] == "<tool>"
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    r = runner.invoke(app, ["tokenizer", "info", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["fingerprint"] == info["fingerprint"]
    r = runner.invoke(app, ["tokenizer", "encode", str(out), "Hi", "--chat", "--json"])
    enc = json.loads(r.stdout)
    assert enc["ids"][0] == 0 and "".join(enc["pieces"]).endswith("<|im_start|>assistant\n")
    r = runner.invoke(app, ["tokenizer", "info", str(out)])
    assert r.exit_code == 0 and "fingerprint" in r.stdout


def test_errors_exit_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": 1}\n')
    r = runner.invoke(app, ["tokenizer", "train", str(bad), "--vocab-size", "300",
                            "--out", str(tmp_path / "t")])
    assert r.exit_code == 2
    assert "bad.jsonl:1: missing field 'text'" in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["tokenizer", "info", str(tmp_path / "none")])
    assert r.exit_code == 2 and "does not exist" in r.output
