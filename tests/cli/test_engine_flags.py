"""The engine's flags are one list (astrai_cli/engine_flags.py): chat, serve and serve-bench
take all of it and eval the loading part, each gets one EngineOptions from it, and a bad
value is the same one line on every command."""

from __future__ import annotations

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from astrai.infer.build import EngineOptions
from astrai_cli.engine_flags import FLAGS, LOADING, PANEL, engine_options
from astrai_cli.main import app

runner = CliRunner()


def command(name: str) -> click.Command:
    group = get_command(app)
    cmd = group.get_command(click.Context(group), name)
    assert cmd is not None, name
    return cmd


@pytest.mark.parametrize("name, want", [("chat", set(FLAGS)), ("serve", set(FLAGS)),
                                        ("serve-bench", set(FLAGS)), ("eval", set(LOADING))])
def test_each_command_takes_the_one_engine_flag_list(name, want):
    params = command(name).params
    in_panel = {p.name for p in params if getattr(p, "rich_help_panel", None) == PANEL}
    assert in_panel == want
    names = [p.name for p in params]
    assert len(names) == len(set(names))  # no command declares one of them again


def test_the_flags_become_one_engine_options():
    got = engine_options({"device": "cpu", "dtype": "auto", "quantize": "none",
                          "enforce_eager": True, "lora": ["sql=a/sql", "poet=a/poet"],
                          "max_loras": 1, "max_lora_rank": 8, "speculative": "ngram",
                          "num_speculative_tokens": 3, "adapter": None,
                          "speculative_model": None})
    assert got == EngineOptions(device="cpu", decode="eager", max_loras=1, max_lora_rank=8,
                                loras={"sql": "a/sql", "poet": "a/poet"},
                                speculative=got.speculative)
    assert got.dtype is None and got.quantize is None
    assert got.speculative.method == "ngram" and got.speculative.num_speculative_tokens == 3
    # a config inheriting the options takes them whole, with its own changes
    assert got.engine_fields(seed=7)["seed"] == 7
    assert got.engine_fields()["loras"] == {"sql": "a/sql", "poet": "a/poet"}


@pytest.mark.parametrize("flags, line", [
    (["--quantize", "int3"], "--quantize 'int3': use none or int8"),
    (["--lora", "nodir"], "--lora 'nodir': expected NAME=DIR"),
    (["--max-lora-rank", "0"], "--max-lora-rank 0: must be >= 1"),
])
@pytest.mark.parametrize("name", ["chat", "serve", "serve-bench"])
def test_a_bad_engine_flag_is_the_same_line_on_every_command(tmp_path, name, flags, line):
    (tmp_path / "config.json").write_text("{}")  # never read: the flags fail first
    r = runner.invoke(app, [name, str(tmp_path), *flags])
    assert r.exit_code == 2, r.output
    assert line in r.output and "Traceback" not in r.output
