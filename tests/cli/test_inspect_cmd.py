"""`astrai inspect-weights`: report, --json, thresholds, exit codes 0 / 1 / 2, --variance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai.inspect.testing import (
    fresh_state,
    plant_lockin,
    tiny_config,
    write_checkpoint,
    write_hf_dir,
)
from astrai_cli.main import app

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    cfg = tiny_config()
    root = tmp_path_factory.mktemp("cli")
    healthy = write_checkpoint(root / "healthy", fresh_state(cfg), cfg, meta={"lr": 1e-4})
    planted = write_checkpoint(root / "planted", plant_lockin(fresh_state(cfg), cfg), cfg)
    only_rows = fresh_state(cfg)
    only_rows["layers.0.attn.k_proj.weight"][6:8] = 1.0
    locked = write_checkpoint(root / "locked", only_rows, cfg)
    moved = {k: v + 1e-3 for k, v in only_rows.items()}
    moved["layers.1.mlp.up_proj.weight"][:, :5] = only_rows["layers.1.mlp.up_proj.weight"][:, :5]
    moved["layers.0.attn.k_proj.weight"][6:8] = 1.0  # locked weights do not move
    later = write_checkpoint(root / "later", moved, cfg)
    hf = write_hf_dir(root / "hf", plant_lockin(fresh_state(cfg), cfg), cfg)
    return {"healthy": healthy, "planted": planted, "locked": locked, "later": later, "hf": hf}


def run(*args):
    return runner.invoke(app, ["inspect-weights", *map(str, args)])


def test_planted_report_and_exit_1(dirs):
    r = run(dirs["planted"])
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert "Verdict: lock-in found" in out
    assert "Affected parameters" in out and "rows 6–7" in out and "tokens 0–3" in out
    assert "Top offenders" in out and "BF16 dead zone" in out
    assert "1-D gains" in out


def test_healthy_exit_0_and_lr_from_meta(dirs):
    r = run(dirs["healthy"])
    assert r.exit_code == 0, r.output
    assert "Verdict: healthy" in r.stdout and "lr 0.0001 from meta.json:lr" in r.stdout


def test_json_output(dirs):
    r = run(dirs["hf"], "--json", "--lr", "7.5e-6")
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["verdict"] == "found"
    ck = d["checkpoints"][0]
    assert ck["format"] == "hf" and ck["lr"] == 7.5e-6
    kinds = {p["kind"]: p for p in ck["patterns"]}
    assert kinds["self_attn.k_proj"]["rows"] == [[6, 7]]
    assert kinds["self_attn.k_proj"]["layers"] == [[1, 3]]


def test_thresholds_are_flags(dirs):
    assert run(dirs["locked"]).exit_code == 1
    assert run(dirs["locked"], "--lock-min-count", "129").exit_code == 0
    assert run(dirs["locked"], "--lock-z", "100").exit_code == 0
    r = run(dirs["planted"], "--overflow", "1e38", "--json")
    ck = json.loads(r.stdout)["checkpoints"][0]
    assert ck["totals"]["overflow"] == 0


def test_two_checkpoints_report_stuck(dirs):
    r = run(dirs["locked"], dirs["later"], "--lock-min-count", "100000")
    assert r.exit_code == 1
    assert "Stuck across 2 checkpoints" in r.stdout
    assert "layers.1.mlp.up_proj.weight" in r.stdout
    d = json.loads(run(dirs["locked"], dirs["later"], "--json").stdout)
    assert d["stuck"]["stuck"] == 128 * 5 + 128  # up_proj cols 0-4, + the locked k_proj rows


def test_tensors_table(dirs):
    r = runner.invoke(app, ["inspect-weights", str(dirs["healthy"]), "--tensors"],
                      env={"COLUMNS": "200"})
    assert "Tensors" in r.stdout and "layers.3.mlp.down_proj.weight" in r.stdout


@pytest.mark.parametrize("args, message", [
    ((), "pass at least one CHECKPOINT"),
    (("/no/such/dir",), "no such file or directory"),
    (("--lock-z", "-1", "X"), "lock_min_z"),
    (("--variance", "tiny", "X"), "takes no CHECKPOINT"),
    (("--variance", "tiny", "--tokens", "a,b"), "not a list of integer token ids"),
    (("--variance", "/no/such/model"), "neither a preset"),
])
def test_bad_input_exit_2_one_line(args, message):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1



def test_a_device_is_not_a_checkpoint(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    for target in (tmp_path / "zero", Path("/dev/null")):
        r = run(str(target))
        assert r.exit_code == 2, r.output
        assert "not a regular file or a directory of weights" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1

def test_variance_on_a_checkpoint(tmp_path):
    cfg = tiny_config(n_layers=2)
    ck = write_checkpoint(tmp_path / "v", fresh_state(cfg), cfg)
    r = runner.invoke(app, ["inspect-weights", "--variance", str(ck), "--seq-len", "16"])
    assert r.exit_code == 0, r.output
    assert "Var(x_l) / Var(x_0)" in r.stdout and "= 2L = 4" in r.stdout
    d = json.loads(runner.invoke(
        app, ["inspect-weights", "--variance", str(ck), "--tokens", "1,2,3", "--json"]).stdout)
    assert d["tokens"] == [1, 3] and d["expected_ratio"] == 4
    assert d["series"][0]["name"] == "checkpoint"


def test_a_pipe_gets_whole_names_and_no_wrapped_lines(dirs):
    """Off a terminal (a file, a pipe, this runner) tables get room: no parameter name is
    split over two lines or cut with an ellipsis, whatever the default 80 columns."""
    r = run(dirs["planted"], "--tensors")
    out = r.stdout
    assert "…" not in out, out
    names = [n for n in ("layers.0.attn.k_proj.weight", "layers.1.mlp.up_proj.weight",
                         "embed_tokens.weight") if n.split(".")[-2] in out]
    assert names and all(n in out for n in names), out
    assert max(len(line) for line in out.splitlines()) > 80
