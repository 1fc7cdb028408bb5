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
    assert r.exit_code == 2 and "broken.json: line 2: invalid JSON" in r.output


@pytest.mark.parametrize("records,fields,needle", [
    ([TEXT], {"output": "{tmp}/afile/ds"}, "output: cannot create"),
    ([TEXT], {"output": "{tmp}", "overwrite": True}, "not an astrai dataset"),
    ([TEXT, "[" * 100_000 + "]" * 100_000], {}, "nested too deeply"),
    ([TEXT, '{"text": "\\ud800"}'], {}, "lone surrogate"),
    ([TEXT], {"max_seq_len": True}, "max_seq_len: expected a number, got true"),
    ([TEXT], {"max_seq_len": 100_000_000_000}, "less than or equal to 1048576"),
    ([TEXT], {"packing": {"max_len": 1 << 21}}, "packing.max_len: Input should be less than"),
])
def test_hostile_specs_and_records_are_one_line(tmp_path, tok_dir, records, fields, needle):
    (tmp_path / "afile").write_text("x")
    fields = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v
              for k, v in fields.items()}
    spec = write_spec(tmp_path, tok_dir, records, **fields)
    r = runner.invoke(app, ["preprocess", str(spec), "--workers", "2"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output, r.output
    assert (tmp_path / "in.jsonl").is_file() and (tmp_path / "afile").read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_shards_merge_and_plain_progress(tmp_path, tok_dir, monkeypatch):
    """`--shard I/N` twice, `preprocess merge`, progress lines on a non-terminal stderr."""
    monkeypatch.setattr("astrai_cli.commands.preprocess_cmd.PLAIN_EVERY_S", 0.0)
    files = []
    for i in range(2):
        f = tmp_path / f"part{i}.jsonl"
        f.write_text("".join(json.dumps({"text": f"{TEXT['text']} {i} {k}"}) + "\n"
                             for k in range(4)))
        files.append(str(f))
    spec = write_spec(tmp_path, tok_dir, [TEXT], inputs=files, packing={"mode": "none"})
    for i in range(2):
        r = runner.invoke(app, ["preprocess", str(spec), "--shard", f"{i}/2", "--set",
                                f"output={tmp_path / f's{i}'}"])
        assert r.exit_code == 0, r.output
        assert "preprocess pretrain [train]" in r.stderr and "eta" in r.stderr
    r = runner.invoke(app, ["preprocess", "merge", str(tmp_path / "s1"), str(tmp_path / "s0"),
                            "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert "train: 2 shards, 8 samples" in r.stdout and "0 copied" in r.stdout
    r = runner.invoke(app, ["preprocess", "merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                            "--out", str(tmp_path / "m")])
    assert r.exit_code == 2 and "already exists" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["preprocess", str(spec), "--shard", "2/2"])
    assert r.exit_code == 2 and "expected I/N" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["preprocess", "merge", "--help"])
    assert r.exit_code == 0 and "--out" in r.stdout
