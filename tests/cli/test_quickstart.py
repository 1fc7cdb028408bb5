"""`astrai quickstart`: sizing, output directory rules, bad input, the progress display.

The whole quickstart runs in tests/e2e/test_quickstart.py (slow)."""

from __future__ import annotations

import io
import shlex

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from astrai.errors import ConfigError, DataError
from astrai.model.config import ModelConfig
from astrai.quickstart import (
    QuickstartConfig,
    StageEvent,
    find_corpus,
    measure_step_seconds,
    next_commands,
    size_steps,
)
from astrai.quickstart.pipeline import _prepare_out
from astrai_cli.commands.quickstart_cmd import StageDisplay
from astrai_cli.main import app


def test_size_steps_fits_the_budget():
    p = size_steps(100.0, 0.5, steps_per_epoch=80, max_epochs=4)
    assert (p.steps, p.capped_by) == (200, None)
    assert p.steps * 0.5 <= 100.0
    p = size_steps(100.3, 0.5, steps_per_epoch=80, max_epochs=4)
    assert p.steps == 200  # floor: never over the budget


def test_a_budget_cut_is_reported_with_the_budget_that_fits():
    from astrai_cli.commands.quickstart_cmd import render

    cut = size_steps(100.0, 0.5, steps_per_epoch=80, max_epochs=4)
    assert cut.budget_cut and cut.cut_short and cut.full_steps == 320
    slight = size_steps(150.0, 0.5, steps_per_epoch=80, max_epochs=4)  # 300 of 320 steps
    assert slight.budget_cut and not slight.cut_short
    assert not size_steps(1000.0, 0.01, steps_per_epoch=80, max_epochs=4).budget_cut
    res = {"preempted": False, "val_bpb": 2.6, "val_loss": 1.0, "val_bytes": 10, "out": "o",
           "params": 1e6, "vocab_size": 10, "steps": 200, "consumed_tokens": 1,
           "threads": 1, "checkpoint": "c", "total_s": 1.0, "stage_s": {}, "sample": None,
           "commands": [], "step_s": 0.5, "full_steps": 320, "full_budget_s": 300.0,
           "fallback_from_steps": None}
    buf = io.StringIO()
    render(res, Console(file=buf, width=300))
    text = buf.getvalue()
    assert "the time budget cut training to 200 of the recipe's 320 steps" in text
    assert "--time-budget 300 (or --steps 320)" in text
    buf = io.StringIO()
    render({**res, "full_budget_s": None, "steps": 320}, Console(file=buf, width=300))
    assert "cut training" not in buf.getvalue()


def test_size_steps_bounds():
    fast = size_steps(1000.0, 0.01, steps_per_epoch=80, max_epochs=4)
    assert (fast.steps, fast.capped_by) == (320, "epochs")
    slow = size_steps(5.0, 2.0, steps_per_epoch=80, max_epochs=4)
    assert (slow.steps, slow.capped_by) == (10, "minimum")
    late = size_steps(-30.0, 1.0, steps_per_epoch=80, max_epochs=4)
    assert late.steps == 10


def test_measure_step_seconds_runs_a_real_step():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=32)
    before = torch.get_rng_state()
    s = measure_step_seconds(cfg, 2, 16, device=torch.device("cpu"), timed=2)
    assert 0 < s < 60
    assert torch.equal(before, torch.get_rng_state())  # its own generator: no RNG drawn


@pytest.mark.parametrize("optimizer,cls", [("adamw", "AdamW"), ("muon", "MuonAdamW")])
def test_measure_step_seconds_times_the_runs_optimizer(monkeypatch, optimizer, cls):
    """The step is timed with the optimizer the run trains with, built as the trainer
    builds it (Muon's Newton-Schulz iterations are part of the step time)."""
    from astrai.train import optim

    built = []
    real = optim.build_optimizer
    monkeypatch.setattr(optim, "build_optimizer",
                        lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    cfg = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=32)
    assert measure_step_seconds(cfg, 2, 16, device=torch.device("cpu"), timed=1,
                                optimizer=optimizer) > 0
    assert [type(o).__name__ for o in built] == [cls]
    assert all(o.state for o in built)  # it stepped


def test_fastest_threads_picks_a_measured_count_and_restores():
    from astrai.quickstart.sizing import fastest_threads

    cfg = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                      ffn_dim=64, max_seq_len=32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        n, s = fastest_threads(cfg, 2, 16, device=torch.device("cpu"))
        assert n in (1, 2) and s > 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_next_commands_quote_paths():
    cmds = next_commands("my runs/run/checkpoints/step_9", "my runs/run")
    by = {shlex.split(c["command"])[1]: shlex.split(c["command"]) for c in cmds}
    assert set(by) == {"chat", "resume", "inspect-weights", "serve-bench", "preprocess",
                       "train"}
    assert by["chat"][2] == "my runs/run/checkpoints/step_9"
    assert by["resume"][2] == "my runs/run"
    # Fine-tuning: the bundled SFT data rebuilt with the checkpoint's own tokenizer, then
    # trained from the checkpoint (beside the quickstart's directory, not in it).
    assert by["preprocess"][2:] == ["examples/specs/sft.json", "--set",
                                    "tokenizer=my runs/run/checkpoints/step_9", "--set",
                                    "output=my runs-sft/data"]
    assert by["train"][2:] == ["--strategy", "sft", "--data", "my runs-sft/data", "--model",
                               "my runs/run/checkpoints/step_9", "--out", "my runs-sft/run"]
    # a shorter model than the spec's 256 tokens: the rows are cut to fit it
    short = {shlex.split(c["command"])[1]: shlex.split(c["command"])
             for c in next_commands("ck", "q/run", seq_len=64)}
    assert short["preprocess"][-2:] == ["--set", "max_seq_len=64"]
    assert "--no-template" in by["chat"]  # a base model continues text


def test_out_directory_rules(tmp_path):
    out = tmp_path / "qs"
    (out / "run").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    cfg = QuickstartConfig(out=str(out))
    with pytest.raises(ConfigError, match="--overwrite"):
        _prepare_out(cfg)
    cfg.overwrite = True
    _prepare_out(cfg)
    assert list(out.iterdir()) == []  # a previous quickstart is replaced
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="notes.txt"):
        _prepare_out(cfg)  # never deletes what it did not make
    assert (out / "notes.txt").read_text() == "mine"


def test_corpus_is_found_and_bad_dirs_are_named(tmp_path):
    c = find_corpus()
    assert c.train.name == "shakespeare_train.jsonl" and c.val.is_file()
    with pytest.raises(DataError, match=str(tmp_path)):
        find_corpus(tmp_path)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="vocab_size"):
        QuickstartConfig.from_dict({"vocab_size": 10})
    with pytest.raises(ConfigError, match="bogus"):
        QuickstartConfig.from_dict({"bogus": 1})


@pytest.mark.parametrize("args, needle", [
    (["--corpus", "/nonexistent/corpus"], "/nonexistent/corpus"),
    (["--model-overrides", "n_layers"], "key=value"),
    (["--vocab-size", "12"], "vocab_size"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    r = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "o" / "run").exists()


def test_cli_refuses_a_non_empty_out(tmp_path):
    (tmp_path / "x.txt").write_text("keep")
    r = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--overwrite" in r.output
    assert (tmp_path / "x.txt").read_text() == "keep"


def test_stage_display_plain_lines():
    buf = io.StringIO()
    d = StageDisplay(Console(file=buf, force_terminal=False, width=100), clock=lambda: 0.0)
    with d:
        d(StageEvent("tokenizer", "start"))
        d(StageEvent("tokenizer", "end", info="2,048 tokens"))
        d(StageEvent("train", "start", 0, 10))
        d(StageEvent("train", "update", 5, 10, "loss 3.0"))
        d(StageEvent("train", "end", 10, 10, "loss 2.0"))
    lines = buf.getvalue().splitlines()
    assert lines == ["[1/6] train tokenizer ...", "[1/6] train tokenizer: done 2,048 tokens",
                     "[4/6] train ...", "[4/6] train: done loss 2.0"]


def test_stage_display_plain_progress_every_interval():
    # Not a terminal (a log file): the long training stage prints a line every interval_s
    # seconds of the (here scripted) clock, as `astrai train` does, instead of nothing.
    times = iter([0.0, 10.0, 31.0, 40.0, 62.0, 70.0])
    buf = io.StringIO()
    d = StageDisplay(Console(file=buf, force_terminal=False, width=100), interval_s=30,
                     clock=lambda: next(times))
    with d:
        d(StageEvent("train", "start", 0, 100))
        for step in (10, 31, 40, 62):
            d(StageEvent("train", "update", step, 100, f"loss {5 - step / 100:.3f}"))
        d(StageEvent("train", "end", 100, 100, "loss 4.0"))
    assert buf.getvalue().splitlines() == [
        "[4/6] train ...",
        "[4/6] train: 31/100 (31%) · loss 4.690 · ETA 1m09s",
        "[4/6] train: 62/100 (62%) · loss 4.380 · ETA 0m38s",
        "[4/6] train: done loss 4.0"]


def test_cli_logs_are_not_hard_wrapped(tmp_path, monkeypatch):
    """`astrai quickstart 2>log`: stderr is no terminal, and a line longer than 80 columns
    stays one line (rich wraps at 80 there unless told otherwise)."""
    import astrai.quickstart as q

    long_info = "690 steps at 0.29 s/step, 1 thread (cut by the time budget: the recipe is " \
                "1,000 steps)"

    def fake_run(cfg, on_event):
        on_event(StageEvent("size", "start", info="timing training steps"))
        on_event(StageEvent("size", "end", info=long_info))
        return q.QuickstartResult(**{**_result(tmp_path, None), "stage_s": {
            s: 1.0 for s in ("tokenizer", "preprocess", "size", "train", "validate",
                             "sample")}})

    monkeypatch.setattr(q, "run_quickstart", fake_run)
    r = CliRunner().invoke(app, ["quickstart", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert f"[3/6] size the run: done {long_info}\n" in r.stderr
    time_row = next(line for line in r.stdout.splitlines() if "time" in line)
    assert "sample 1 s)" in time_row  # the summary's longest row on one line too


def test_stage_display_live_rows():
    buf = io.StringIO()
    d = StageDisplay(Console(file=buf, force_terminal=True, width=120))
    with d:
        d(StageEvent("train", "start", 0, 10))
        d(StageEvent("train", "update", 4, 10, "loss 3.000"))
        task = d.progress.tasks[0]
        assert (task.completed, task.total) == (4, 10)
        d(StageEvent("train", "end", 10, 10, "loss 2.000"))
        assert task.finished and task.fields["info"] == "loss 2.000"
        d(StageEvent("validate", "start"))
        d(StageEvent("validate", "end", info="2.5 bits/byte"))
        assert d.progress.tasks[1].finished
    assert "4/6] train" in buf.getvalue()


def test_summary_json_keys_documented():
    # docs/quickstart.md lists the summary.json fields; keep them in step with the result.
    from dataclasses import fields
    from pathlib import Path

    from astrai.quickstart import QuickstartResult

    doc = (Path(__file__).resolve().parents[2] / "docs" / "quickstart.md").read_text()
    missing = [f.name for f in fields(QuickstartResult) if f"`{f.name}`" not in doc]
    assert not missing, f"docs/quickstart.md does not describe {missing}"


def test_cli_defaults_are_the_config_defaults():
    """The command's option defaults are QuickstartConfig's (one recipe, not two)."""
    import typer.main

    cmd = typer.main.get_command(app).get_command(None, "quickstart")
    defaults = {p.name: p.default for p in cmd.params}
    cfg = QuickstartConfig()
    for name in ("vocab_size", "seq_len", "batch_size", "max_lr", "seed", "device",
                 "optimizer", "weight_decay", "max_epochs"):
        assert defaults[name] == getattr(cfg, name), name
    assert defaults["time_budget"] == cfg.time_budget_s


def _result(tmp_path, loss_plot):
    from astrai.quickstart import QuickstartResult

    return QuickstartResult(
        out=str(tmp_path), tokenizer="t", dataset="d", run_dir=str(tmp_path / "run"),
        checkpoint="c", vocab_size=2048, params=1_000_000, train_rows=10, val_rows=2, steps=3,
        step_s=None, threads=1, full_steps=None, full_budget_s=None, fallback_from_steps=None,
        consumed_tokens=100, val_loss=4.0, val_ppl=54.6, val_bpb=2.5,
        val_bytes=1000, sample_prompt="A", sample=None, loss_plot=loss_plot,
    ).to_dict()


def test_loss_png_or_how_to_get_it(tmp_path, monkeypatch):
    """loss.png of the run when matplotlib is there; otherwise the pip line, no failure."""
    import importlib.util
    import json
    import struct

    from astrai.quickstart.pipeline import plot_loss
    from astrai_cli.commands.quickstart_cmd import render

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in (10, 20, 30)))
    pytest.importorskip("matplotlib")
    path = plot_loss(run, tmp_path / "loss.png")
    assert path == str(tmp_path / "loss.png")
    assert struct.unpack(">II", (tmp_path / "loss.png").read_bytes()[16:24]) == (800, 450)
    buf = io.StringIO()
    render(_result(tmp_path, path), Console(file=buf, width=200))
    assert f"loss curve │ {path}" in buf.getvalue()

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert plot_loss(run, tmp_path / "other.png") is None
    assert not (tmp_path / "other.png").exists()
    buf = io.StringIO()
    render(_result(tmp_path, None), Console(file=buf, width=200))
    assert f"pip install 'astrai[plot]' to get {tmp_path / 'loss.png'}" in buf.getvalue()


TINY = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16, "ffn_dim": 64}
SMALLER = {"dim": 16, "head_dim": 8, "ffn_dim": 32}


def _tiny_run(tmp_path, monkeypatch, recipe_s: float, **kw):
    """A whole quickstart on a few held-out records with a 1-layer model, the step time
    faked per model width: `recipe_s` for the recipe's model (dim 32), 0.25 s for the
    fallback (dim 16). Returns the result."""
    import astrai.quickstart.pipeline as qp
    from astrai.quickstart import run_quickstart

    def fake_step(config, *a, **k):
        return recipe_s if config.dim == 32 else 0.25

    monkeypatch.setattr(qp, "measure_step_seconds", fake_step)
    monkeypatch.setattr(qp, "fastest_threads", lambda config, *a, **k: (1, fake_step(config)))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = find_corpus().val.read_text().splitlines()
    (corpus / "shakespeare_train.jsonl").write_text("\n".join(lines[:6]) + "\n")
    (corpus / "shakespeare_val.jsonl").write_text(lines[6] + "\n")
    cfg = QuickstartConfig(out=str(tmp_path / "qs"), corpus=str(corpus), vocab_size=300,
                           seq_len=32, model_overrides=TINY, fallback_overrides=SMALLER,
                           sample_tokens=4, **kw)
    return run_quickstart(cfg)


def test_a_slow_machine_trains_the_smaller_fallback_model(tmp_path, monkeypatch):
    import json

    from astrai.model.stats import param_counts

    # 3 s a step leaves the recipe's model the 10-step minimum of a 60 s budget: the
    # fallback model trains instead, for as many steps as its own step time fits.
    res = _tiny_run(tmp_path, monkeypatch, recipe_s=3.0, time_budget_s=60.0)
    assert res.fallback_from_steps == 10
    assert res.steps > 10 and res.step_s == 0.25
    saved = json.loads((tmp_path / "qs" / "run" / "train_config.json").read_text())
    assert {k: saved["model_overrides"][k] for k in SMALLER} == SMALLER
    small = ModelConfig(vocab_size=res.vocab_size, max_seq_len=32, n_layers=1, n_heads=2,
                        n_kv_heads=1, **SMALLER)
    assert res.params == param_counts(small).total
    assert res.full_budget_s is not None and res.val_bpb is not None

    from astrai_cli.commands.quickstart_cmd import render

    buf = io.StringIO()
    render(res.to_dict(), Console(file=buf, width=400))
    assert (f"gave the recipe's model only 10 steps on this machine now, so a smaller model "
            f"trained for {res.steps} steps instead") in buf.getvalue()


def test_no_fallback_when_the_budget_is_not_what_limits(tmp_path, monkeypatch):
    # An epoch cap below fallback_below_steps is the recipe's own length, not a slow machine.
    res = _tiny_run(tmp_path, monkeypatch, recipe_s=0.001, max_epochs=0.2)
    assert res.fallback_from_steps is None and res.full_budget_s is None
    assert 10 <= res.steps < QuickstartConfig().fallback_below_steps


def _measured(**kw):
    from astrai.quickstart.plan import Measurements

    return Measurements(**{"elapsed_s": 10.0, "threads": 2, "steps_per_epoch": 200,
                           "val_tokens": 0, "tokens_per_step": 2048, **kw})


def test_plan_without_training_fits_the_budget_and_asks_for_the_fallback():
    from astrai.quickstart.plan import TAIL_S, plan

    cfg = QuickstartConfig(time_budget_s=100.0, max_epochs=4, fallback_below_steps=450)
    base = {"n_layers": 2}
    fast = plan(cfg, _measured(recipe_step_s=0.125), base)
    assert fast.steps.steps == (100.0 - 10.0 - TAIL_S) / 0.125 == 672
    assert not fast.wants_fallback and fast.fallback_from is None and fast.overrides == base
    slow = plan(cfg, _measured(recipe_step_s=1.0), base)  # 84 steps < 450: time the fallback
    assert slow.wants_fallback and slow.steps.steps == 84 and slow.overrides == base
    small = plan(cfg, _measured(recipe_step_s=1.0, fallback_step_s=0.25), base)
    assert not small.wants_fallback and small.fallback_from == 84
    assert small.steps.steps == 336 and small.overrides == {**base, **cfg.fallback_overrides}
    assert small.full_budget_s == 820.0  # 100 s + (800 - 84) s, to the next 10 s
    assert "fallback" in small.info


def test_plan_with_fixed_steps_times_nothing():
    from astrai.quickstart.plan import plan

    p = plan(QuickstartConfig(steps=7), _measured(), {})
    assert p.steps.steps == 7 and p.steps.step_s is None and not p.wants_fallback
    assert p.info == "7 steps"
