"""--tensorboard: event files beside metrics.jsonl that read back (with tensorboard's own
EventAccumulator) as exactly metrics.jsonl's scalars at its steps, across a resume that
drops an interrupted attempt's steps."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)

from astrai.errors import MissingExtraError
from astrai.train import resume, train
from astrai.train.callbacks.tensorboard import record_scalars

from .conftest import make_config, make_data


def jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0 = keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def expected(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's scalars per key, as TensorBoard stores them (float32)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        for k, v in record_scalars(rec).items():
            out.setdefault(k, []).append((rec["step"], float(np.float32(v))))
    return out


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        np.testing.assert_array_equal([v for _, v in got[tag]], [v for _, v in want[tag]],
                                      err_msg=tag)


def test_event_files_hold_exactly_the_metrics(tmp_path):
    cfg = make_config(tmp_path, tensorboard=True, max_steps=5, eval_interval=2, log_interval=1)
    s = train(cfg, data=make_data(n=24, eval_n=4))
    run = Path(s.run_dir)
    assert list(run.glob("events.out.tfevents.*"))
    recs = jsonl(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    want = expected(recs)
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "val_ppl"} <= set(want)
    assert [st for st, _ in want["val_loss"]] == [2, 4, 5]
    assert_same(events(run), want)


def test_resume_rewrites_without_the_interrupted_steps(tmp_path):
    """Checkpoints at 2 and 4 of 6, then the newest two taken away as if the run had been
    killed after step 6 with only step 2 saved: the resumed run's event files hold steps 1-6
    once each, with the resumed values (metrics.jsonl's), not the first attempt's."""
    cfg = make_config(tmp_path, max_steps=6, ckpt_interval=2, tensorboard=True)
    s = train(cfg, data=make_data(n=24))
    run = Path(s.run_dir)
    first = jsonl(run)
    for step in (4, 6):
        shutil.rmtree(run / "checkpoints" / f"step_{step}")
    # the first attempt's steps 3-6 also sit in the event files: make them differ
    lines = [json.dumps({**r, "loss": r["loss"] + 100.0}) if r["step"] > 2 else json.dumps(r)
             for r in first]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    resume(run, data=make_data(n=24))
    recs = jsonl(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] < 50 for r in recs)
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert_same(events(run), expected(recs))


def test_resume_turns_tensorboard_on_with_the_whole_history(tmp_path):
    cfg = make_config(tmp_path, max_steps=4, ckpt_interval=2)
    run = Path(train(cfg, data=make_data(n=24)).run_dir)
    shutil.rmtree(run / "checkpoints" / "step_4")
    assert not list(run.glob("events.out.tfevents.*"))
    resume(run, data=make_data(n=24), tensorboard=True)
    assert_same(events(run), expected(jsonl(run)))
    meta = json.loads((run / "checkpoints" / "step_4" / "meta.json").read_text())
    assert meta["train_config"]["logging"]["tensorboard"] is True  # later resumes keep writing


def test_without_tensorboard_installed_nothing_is_written(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    cfg = make_config(tmp_path, tensorboard=True, max_steps=2)
    with pytest.raises(MissingExtraError, match=r"pip install 'astrai\[tensorboard\]'"):
        train(cfg, data=make_data(n=24))
    assert not Path(cfg.out).exists()


def test_cli_train_and_resume_with_tensorboard(tmp_path):
    """`astrai train --tensorboard` on a preprocessed dataset (val_bpb included), then
    `astrai resume --tensorboard` from an older checkpoint."""
    from typer.testing import CliRunner

    from astrai.data.testing import tiny_dataset
    from astrai_cli.main import app

    data = tiny_dataset(tmp_path / "data", "pretrain", n=24, n_val=4)
    run = tmp_path / "run"
    r = CliRunner().invoke(app, [str(a) for a in (
        "train", "--strategy", "seq", "--data", data, "--out", run, "--model", "tiny",
        "--model-overrides", "dim=64", "--model-overrides", "n_layers=2",
        "--model-overrides", "ffn_dim=128", "--device", "cpu", "--peak-tflops", "1",
        "--batch-size", "4", "--max-steps", "4", "--ckpt-interval", "2", "--eval-interval", "2",
        "--tensorboard")])
    assert r.exit_code == 0, r.output
    assert "val_bpb" in expected(jsonl(run))
    assert_same(events(run), expected(jsonl(run)))
    shutil.rmtree(run / "checkpoints" / "step_4")
    r = CliRunner().invoke(app, ["resume", str(run), "--tensorboard"])
    assert r.exit_code == 0, r.output
    assert [rec["step"] for rec in jsonl(run)] == [1, 2, 3, 4]
    assert_same(events(run), expected(jsonl(run)))
