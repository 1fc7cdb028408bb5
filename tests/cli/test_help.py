"""--help at 80 columns: every option name whole, switches as --x/--no-x (never `<bool>`),
panels for train's many options, and an example ending every command's help."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from astrai_cli.commands import COMMANDS, EXAMPLES
from astrai_cli.main import app

# train has ~97 options; at 80 columns one to three lines each plus ten panel frames. The
# budget is about half of typer's layout (482 lines, names cut) and fails if rows start
# wrapping names or help goes back to one column.
TRAIN_HELP_LINES = 304  # 290 + --checkpoint-format and --async-checkpoint, + --tp,
# --node-rank, --max-restarts and the --nproc-per-node alias


def _root():
    import typer.main

    return typer.main.get_command(app)


def all_paths() -> list[list[str]]:
    """Every command and subcommand, as argv words: [["train"], ["tokenizer", "train"], ...]."""
    root, out = _root(), [[]]
    for name in root.list_commands(None):
        cmd = root.get_command(None, name)
        out.append([name])
        out += [[name, sub] for sub in getattr(cmd, "commands", {})]
    return out


def help_of(words: list[str]) -> str:
    r = CliRunner().invoke(app, [*words, "--help"], prog_name="astrai",
                           env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert r.exit_code == 0, r.output
    return r.output


def option_names(words: list[str]) -> list[str]:
    cmd = _root()
    for w in words:
        cmd = cmd.get_command(None, w)
    ctx = cmd.context_class(cmd)  # the click typer bundles, or click's
    return [o for p in cmd.get_params(ctx) if p.param_type_name == "option"
            for o in (*p.opts, *p.secondary_opts)]


@pytest.mark.parametrize("words", all_paths(), ids=lambda w: " ".join(w) or "astrai")
def test_help_shows_every_name_whole_and_an_example(words):
    text = help_of(words)
    names = option_names(words)
    assert "--help" in names
    missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]
    assert not missing, f"cut or missing in `astrai {' '.join(words)} --help`: {missing}"
    assert "…" not in text and "<bool>" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    example = EXAMPLES[" ".join(words)]
    assert re.search(r"^ Examples?: *$", text, re.MULTILINE) and example[0].split()[-1] in text


def test_preprocess_merge_help():
    """`preprocess merge` is parsed by preprocess itself (a word, not a click subcommand)."""
    text = help_of(["preprocess", "merge"])
    for name in ("DIR...", "--out DIR", "--overwrite", "--json", "--help"):
        assert name in text
    assert "<bool>" not in text and re.search(r"^ Example: *$", text, re.MULTILINE)
    assert EXAMPLES["preprocess merge"][0] in text


def test_switches_show_both_spellings():
    text = help_of(["train"])
    assert "--gradient-checkpointing/--no-gradient-checkpointing" in text
    assert re.search(r"--dry-run\s", text) and "--no-dry-run" not in text


def test_train_help_has_panels_and_fits_the_budget():
    """One --help panel per TrainConfig section (Run for the top level), in class order,
    each option under its section's title (the panels are derived, not listed by hand)."""
    from astrai.config.section import flat_fields
    from astrai.config.train import TrainConfig
    from astrai_cli.commands.train_cmd import RUN_PANEL, panels

    where = panels()
    sections = [f.annotation.panel for f in TrainConfig.model_fields.values()
                if hasattr(f.annotation, "panel")]
    assert list(dict.fromkeys(where.values())) == [RUN_PANEL, "Optimizer", "Schedule", "LoRA",
                                                  "Checkpoints", "Validation", "Precision",
                                                  "Runtime & distributed", "Logging",
                                                  "BF16 guard", "Alignment (dpo/grpo/online)",
                                                  "Rollouts (online-*)"]
    assert set(sections) < set(where.values())
    assert where["max_lr"] == "Optimizer" and where["rollout_top_k"] == "Rollouts (online-*)"
    assert set(where) == set(flat_fields(TrainConfig))
    text = help_of(["train"])
    titles = re.findall(r"^╭─ (.+?) ─", text, re.MULTILINE)
    assert titles == [*dict.fromkeys(where.values()), "Options"]
    assert len(text.splitlines()) <= TRAIN_HELP_LINES


def test_every_command_in_the_table_loads_under_its_name():
    root = _root()
    for name in COMMANDS:
        assert root.get_command(None, name).name == name
    assert set(EXAMPLES) >= {" ".join(w) for w in all_paths()}
    assert max(len(line) for lines in EXAMPLES.values() for line in lines) <= 76
