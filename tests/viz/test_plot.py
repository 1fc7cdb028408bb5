"""`astrai plot`: the curves handed to matplotlib (not pixels) and the PNG's size."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai_cli.main import app

pytest.importorskip("matplotlib")

from astrai.viz.curves import plot_runs


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def lines_by_gid(fig) -> dict[str, object]:
    return {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_cli_writes_a_png_of_the_requested_size(runs, tmp_path):
    out = tmp_path / "sub" / "curves.png"
    r = CliRunner().invoke(app, ["plot", str(runs["resumed"]), str(runs["evaluated"]),
                                 "--out", str(out), "--size", "640x480", "--smooth"])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == f"wrote {out}" and r.stdout == ""  # as inspect-weights --plot
    assert png_size(out) == (640, 480)
    assert not list(out.parent.glob(".*tmp*"))


def test_curves_hold_every_step_once_and_a_resumed_run_is_one_curve(runs):
    fig = plot_runs([runs["resumed"], runs["evaluated"]], x="step")
    by = lines_by_gid(fig)
    assert sorted(ax.get_title() for ax in fig.axes if ax.get_visible()) == \
        sorted(["loss", "val_loss", "lr", "grad_norm", "tokens_per_s"])
    loss = by["resumed/run|loss"]  # one line for the run, interrupted at 3 and resumed
    assert list(loss.get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(loss.get_ydata()) == [r["loss"] for r in records(runs["resumed"])]
    assert list(by["evaluated/run|loss"].get_xdata()) == [1, 2, 3, 4]
    assert list(by["evaluated/run|val_loss"].get_xdata()) == [2, 4]
    assert "resumed/run|val_loss" not in by  # that run never validated
    assert sum(1 for g in by if g.startswith("resumed/run|loss")) == 1


def test_x_axes_smoothing_and_chosen_metrics(runs):
    recs = records(runs["resumed"])
    fig = plot_runs([runs["resumed"]], metrics=["loss", "lr"], x="tokens", smooth=0.6)
    by = lines_by_gid(fig)
    assert set(by) == {"run|loss", "run|loss|raw", "run|lr"}
    assert list(by["run|loss"].get_xdata()) == [r["consumed_tokens"] for r in recs]
    raw = list(by["run|loss|raw"].get_ydata())
    assert raw == [r["loss"] for r in recs]
    assert list(by["run|loss"].get_ydata()) != raw  # smoothed on top
    assert list(by["run|lr"].get_ydata()) == [r["lr"] for r in recs]  # never smoothed
    ev = lines_by_gid(plot_runs([runs["evaluated"]], smooth=0.6))
    assert "run|loss|raw" in ev and "run|val_loss|raw" not in ev  # validation: not smoothed
    assert ev["run|val_loss"].get_marker() == "o"  # few points: each one marked
    t = plot_runs([runs["resumed"]], metrics=["loss"], x="time")
    xs = list(lines_by_gid(t)["run|loss"].get_xdata())
    assert xs == [r["elapsed_s"] for r in recs] and xs == sorted(xs)  # time continues


def test_svg_and_user_mistakes(runs, tmp_path):
    cli = CliRunner()
    svg = tmp_path / "c.svg"
    r = cli.invoke(app, ["plot", str(runs["evaluated"]), "--out", str(svg)])
    assert r.exit_code == 0 and svg.read_text().lstrip().startswith("<?xml")
    for args, msg in [
        (["--out", str(tmp_path / "c.pdf")], "must end in .png or .svg"),
        (["--metrics", "loss,nope"], "nope in none of the runs"),
        (["--size", "big"], "WIDTHxHEIGHT"),
    ]:
        r = cli.invoke(app, ["plot", str(runs["evaluated"]), *args])
        assert r.exit_code == 2 and msg in r.output, r.output
    r = cli.invoke(app, ["plot", str(tmp_path / "none"), "--out", str(tmp_path / "n.png")])
    assert r.exit_code == 2 and "no metrics.jsonl" in r.output
    assert not (tmp_path / "n.png").exists()


def test_without_matplotlib_one_line_says_how_to_install(runs, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    out = tmp_path / "x.png"
    r = CliRunner().invoke(app, ["plot", str(runs["evaluated"]), "--out", str(out)])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and "pip install 'astrai[plot]'" in r.output
    assert not out.exists()


def test_earlier_runs_metric_names_still_plot(tmp_path):
    """Runs written before the grpo/dpo metrics took TRL's names (grpo_reward_mean,
    dpo_margin, ...) plot on the same panels as new runs, asked for by either name."""
    old, new = tmp_path / "old" / "run", tmp_path / "new" / "run"
    for run, keys in ((old, ("dpo_margin", "grpo_reward_std")),
                      (new, ("rewards/margins", "reward_std"))):
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, keys[0]: 0.1 * s, keys[1]: 1.0 + s}) + "\n"
            for s in (1, 2, 3)))
    for asked in (["rewards/margins", "reward_std"], ["dpo_margin", "grpo_reward_std"]):
        by = lines_by_gid(plot_runs([old, new], metrics=asked))
        assert set(by) == {"old/run|rewards/margins", "new/run|rewards/margins",
                           "old/run|reward_std", "new/run|reward_std"}, asked
        assert list(by["old/run|rewards/margins"].get_ydata()) == [0.1, 0.2, 0.1 * 3]
    r = CliRunner().invoke(app, ["plot", str(old), "--metrics", "dpo_margin", "--out",
                                 str(tmp_path / "old.png")])
    assert r.exit_code == 0, r.output


def test_smoothing_leaves_the_guards_measured_shares_alone(tmp_path):
    """--smooth draws the lock-in guard's shares as measured: an EMA over its few points
    would show a value the run never had."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 5.0 - s / 100} for s in range(1, 301)]
    for s, v in ((100, 0.4), (200, 0.2), (300, 0.086)):
        rows[s - 1].update({"update_visible/matrices": v, "rounds_away_at_peak/matrices": v})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = ["loss", "update_visible/matrices", "rounds_away_at_peak/matrices"]
    by = lines_by_gid(plot_runs([run], metrics=names, smooth=0.6))
    assert "run|loss|raw" in by  # the loss is smoothed
    for name in names[1:]:
        assert f"run|{name}|raw" not in by
        assert list(by[f"run|{name}"].get_ydata()) == [0.4, 0.2, 0.086]
