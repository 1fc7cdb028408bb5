"""`astrai preprocess spec.json [--set k=v] [--workers N] [--json] [--schema]`."""

import json

import pytest
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai_cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok")).path


def write_spec(tmp_path, tok_dir, records, **fields):
    data = tmp_path / "in.jsonl"
    data.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    spec = {"kind": "pretrain", "inputs": [str(data)], "tokenizer": str(tok_dir),
            "output": str(tmp_path / "ds"), "max_seq_len": 64, **fields}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


TEXT = {"text": "Shall I compare thee to a summer's day? Thou art more lovely and temperate."}


def test_json_summary_and_set(tmp_path, tok_dir):
    spec = write_spec(tmp_path, tok_dir, [TEXT] * 5)
    r = runner.invoke(app, ["preprocess", str(spec), "--json", "--set", "format=bin",
                            "--set", "packing.mode=bfd", "--workers", "2"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    tr = res["splits"]["train"]
    assert res["format"] == "bin" and tr["records_kept"] == 5 and tr["samples"] >= 1
    assert 0 < tr["packing_efficiency"] <= 1
    assert (tmp_path / "ds" / "manifest.json").is_file()
    # again without --json: a rich table, and refusing to overwrite without being told
    r = runner.invoke(app, ["preprocess", str(spec)])
    assert r.exit_code == 2 and "already exists" in r.output
    r = runner.invoke(app, ["preprocess", str(spec), "--set", "overwrite=true"])
    assert r.exit_code == 0 and "packing efficiency" in r.stdout


def test_schema():
    r = runner.invoke(app, ["preprocess", "--schema"])
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    assert schema["title"] == "PreprocessSpec" and "packing" in schema["properties"]


def test_on_error_fail_and_skip(tmp_path, tok_dir):
    spec = write_spec(tmp_path, tok_dir, [TEXT, "{oops", TEXT, "not json"])
    r = runner.invoke(app, ["preprocess", str(spec)])
    assert r.exit_code == 2
    assert "in.jsonl:2: invalid JSON" in r.output and "in.jsonl:4: invalid JSON" in r.output
    assert not (tmp_path / "ds").exists()
    r = runner.invoke(app, ["preprocess", str(spec), "--on-error", "skip", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["splits"]["train"]["malformed"] == 2


def test_spec_errors(tmp_path, tok_dir):
    spec = write_spec(tmp_path, tok_dir, [TEXT], packing={"mode": "bfd", "typo": 1})
    r = runner.invoke(app, ["preprocess", str(spec)])
    assert r.exit_code == 2 and "packing.typo: unknown key" in r.output
    r = runner.invoke(app, ["preprocess", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "spec file does not exist" in r.output
    (tmp_path / "broken.json").write_text('{"kind": "sft",\n "inputs": [}')
    r = runner.invoke(app, ["preprocess", str(tmp_path / "broken.json")])
    assert r.exit_code == 2 and "broken.json:2: invalid JSON" in r.output
