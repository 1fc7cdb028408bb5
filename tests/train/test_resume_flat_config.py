"""`astrai resume` of a run saved before TrainConfig was nested: its train_config.json and
meta.json hold the flat config (tests/train/assets/flat_train_config_v1.json, written by
`astrai train` of that version), and the resumed run ends exactly where a straight run of
the new code ends, saving its checkpoints' config in the nested form."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai.config.train import TrainConfig
from astrai.data.testing import tiny_dataset
from astrai_cli.main import app

FLAT = Path(__file__).parent / "assets" / "flat_train_config_v1.json"
# the command that wrote the fixture (paths aside)
ARGV = ["--strategy", "sft", "--model", "tiny", "--model-overrides", "dim=64",
        "--model-overrides", "n_layers=2", "--model-overrides", "ffn_dim=128",
        "--window-size", "64", "--device", "cpu", "--peak-tflops", "1", "--batch-size", "2",
        "--grad-accum-steps", "2", "--max-steps", "4", "--ckpt-interval", "2",
        "--max-lr", "3e-3"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def flat_config(data: Path, out: Path) -> dict:
    text = FLAT.read_text().replace("{data}", str(data)).replace("{out}", str(out))
    return json.loads(text)


def test_resume_of_a_run_saved_with_the_flat_config(tmp_path):
    data = tiny_dataset(tmp_path / "data", "sft", n=48, n_val=8)
    straight = tmp_path / "straight"
    r = invoke("train", "--data", data, "--out", straight, *ARGV, "--json")
    assert r.exit_code == 0, r.output
    saved = json.loads((straight / "train_config.json").read_text())
    assert saved["optimizer"]["max_lr"] == 3e-3 and "max_lr" not in saved  # nested now
    # the fixture is this run's config, as the flat version saved it
    old = tmp_path / "old"
    assert TrainConfig.from_dict(flat_config(data, old)) == TrainConfig.from_dict(
        {**saved, "out": str(old)})

    # the old run: stopped after step 2, its config files flat
    shutil.copytree(straight, old)
    shutil.rmtree(old / "checkpoints" / "step_4")
    (old / "latest").write_text("checkpoints/step_2")
    flat = flat_config(data, old)
    (old / "train_config.json").write_text(json.dumps(flat, indent=2))
    meta_file = old / "checkpoints" / "step_2" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "train_config": flat}, indent=2))

    r = invoke("resume", old, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["steps"] == 4 and s["resumed_from"].endswith("step_2")
    final = Path("checkpoints") / "step_4"
    assert ((old / final / "model.safetensors").read_bytes()
            == (straight / final / "model.safetensors").read_bytes())
    resumed = json.loads((old / final / "meta.json").read_text())["train_config"]
    assert resumed["checkpoint"]["interval"] == 2 and "ckpt_interval" not in resumed
