"""Shell completion: the scripts in completions/ are current, and completion answers right.

Typer's scripts are shims: on TAB the shell runs `astrai` with `_ASTRAI_COMPLETE=complete_<sh>`
and the words so far, and the command tree answers. So the tests drive that protocol
in-process (as every shell does), then run the real scripts in bash, zsh and fish when those
shells are installed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astrai_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
COMPLETIONS = ROOT / "completions"


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_completions",
                                                  ROOT / "scripts" / "gen_completions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bash_complete(line: str) -> list[str]:
    """What bash's TAB offers after `line` (a trailing space = a new empty word)."""
    words = line.split()
    cword = len(words) if line.endswith(" ") else len(words) - 1
    r = CliRunner().invoke(app, [], prog_name="astrai", env={
        "_ASTRAI_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(cword)})
    assert r.exit_code == 0, r.output
    return r.output.split()


def command_names() -> list[str]:
    import typer.main

    return typer.main.get_command(app).list_commands(None)


def strategy_names() -> list[str]:
    from astrai.train.strategies import STRATEGIES

    return STRATEGIES.names()


# -- the scripts ------------------------------------------------------------------------------

def test_scripts_are_current(tmp_path):
    gen = _gen_module()
    assert gen.main(["--check"]) == 0, "run python scripts/gen_completions.py"
    # --check does detect a stale file (so the line above can fail)
    gen.main(["--dir", str(tmp_path)])
    (tmp_path / "astrai.bash").write_text("# old\n")
    assert gen.main(["--check", "--dir", str(tmp_path)]) == 1


def test_scripts_call_astrai_with_the_complete_var():
    for name, shell in (("astrai.bash", "bash"), ("_astrai", "zsh"), ("astrai.fish", "fish")):
        text = (COMPLETIONS / name).read_text()
        assert f"_ASTRAI_COMPLETE=complete_{shell}" in text
    assert (COMPLETIONS / "_astrai").read_text().startswith("#compdef astrai\n")


# -- the protocol (what every shim asks) ---------------------------------------------------

def test_command_prefix_completes():
    assert bash_complete("astrai pre") == ["preprocess"]
    assert bash_complete("astrai quick") == ["quickstart"]
    assert sorted(bash_complete("astrai ")) == sorted(command_names())
    assert {"quickstart", "train", "resume", "chat", "serve-bench", "inspect-weights",
            "preprocess", "tokenizer"} <= set(command_names())


def test_option_prefix_completes():
    got = bash_complete("astrai train --strat")
    assert "--strategy" in got
    assert all(o.startswith("--strat") for o in got)
    assert bash_complete("astrai quickstart --time") == ["--time-budget"]


def test_strategy_values_complete():
    assert sorted(bash_complete("astrai train --strategy ")) == sorted(strategy_names())
    assert {"seq", "sft", "dpo", "grpo"} <= set(strategy_names())
    assert sorted(bash_complete("astrai train --strategy online-")) == \
        sorted(n for n in strategy_names() if n.startswith("online-"))
    # after other options too
    assert "sft" in bash_complete("astrai train --data d --strategy s")


def test_static_names_match_the_registries():
    """Completion lists strategy and executor names without importing astrai.train."""
    from astrai.train.executors import EXECUTORS
    from astrai_cli.commands.train_cmd import EXECUTOR_NAMES, STRATEGY_NAMES

    assert sorted(STRATEGY_NAMES) == sorted(strategy_names())
    assert sorted(EXECUTOR_NAMES) == sorted(EXECUTORS.names())


IMPORTED = """
import os, sys
sys.argv[0] = "astrai"
os.environ.update({"_ASTRAI_COMPLETE": "complete_bash", "COMP_WORDS": sys.argv[1],
                   "COMP_CWORD": sys.argv[2]})
import astrai_cli.main
after_import = set(sys.modules)
try:
    astrai_cli.main.main()
except SystemExit:
    pass
heavy = ("torch", "numpy", "astrai.train", "astrai.model", "astrai.config.train")
print("import:", *sorted(m for m in heavy if m in after_import))
print("complete:", *sorted(m for m in heavy if m in sys.modules))
"""


@pytest.mark.parametrize("line, cword, loads_config", [
    ("astrai pre", 1, False), ("astrai ", 1, False), ("astrai chat --dev", 2, False),
    ("astrai train --strategy ", 3, True), ("astrai train --strat", 2, True)])
def test_completion_imports_no_heavy_library(line, cword, loads_config):
    """TAB must answer fast on an idle machine: no torch, no astrai.train, and TrainConfig
    only when train itself is being completed (asserted on the import set, not on time)."""
    import os

    out = subprocess.run([sys.executable, "-c", IMPORTED, line, str(cword)],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    imported, completed = (line.split()[1:] for line in out.splitlines()[-2:])
    assert imported == []
    assert completed == (["astrai.config.train"] if loads_config else [])


def test_subcommand_of_a_group_completes():
    assert sorted(bash_complete("astrai tokenizer ")) == ["encode", "info", "train"]


def test_zsh_and_fish_protocols():
    r = CliRunner().invoke(app, [], prog_name="astrai", env={
        "_ASTRAI_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "astrai pre"})
    assert r.exit_code == 0 and '"preprocess"' in r.output
    r = CliRunner().invoke(app, [], prog_name="astrai", env={
        "_ASTRAI_COMPLETE": "complete_fish", "_TYPER_COMPLETE_ARGS": "astrai train --strategy ",
        "_TYPER_COMPLETE_FISH_ACTION": "get-args"})
    assert r.exit_code == 0
    assert sorted(line.split("\t")[0] for line in r.output.splitlines() if line) == \
        sorted(strategy_names())


# -- the real shells ---------------------------------------------------------------------------

def _astrai_on_path(tmp_path: Path) -> dict:
    """PATH with an `astrai` that runs this checkout's CLI under this interpreter."""
    import os

    exe = tmp_path / "bin" / "astrai"
    exe.parent.mkdir()
    # click names the completion variable after argv[0], so the file must be called astrai
    exe.write_text(f"#!{sys.executable}\nimport sys\nfrom astrai_cli.main import main\n"
                   "sys.exit(main())\n")
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{exe.parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT)}


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_bash_script(tmp_path):
    script = (f'source {COMPLETIONS / "astrai.bash"}\n'
              'COMP_WORDS=(astrai train --strategy ""); COMP_CWORD=3\n'
              '_astrai_completion astrai; printf "%s\\n" "${COMPREPLY[@]}"\n'
              'echo ---\n'
              'COMP_WORDS=(astrai pre); COMP_CWORD=1\n'
              '_astrai_completion astrai; printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "-c", script], env=_astrai_on_path(tmp_path),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    strategies, _, pre = out.partition("---\n")
    assert sorted(strategies.split()) == sorted(strategy_names())
    assert pre.split() == ["preprocess"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish not installed")
def test_fish_script(tmp_path):
    cmd = (f"source {COMPLETIONS / 'astrai.fish'}; complete -C 'astrai pre'; echo ---; "
           "complete -C 'astrai train --strategy '")
    out = subprocess.run(["fish", "--no-config", "-c", cmd], env=_astrai_on_path(tmp_path),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    pre, _, strategies = out.partition("---\n")
    assert [line.split("\t")[0] for line in pre.splitlines()] == ["preprocess"]
    assert sorted(line.split("\t")[0] for line in strategies.splitlines()) == \
        sorted(strategy_names())


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh not installed")
def test_zsh_script(tmp_path):
    # Outside an interactive completion widget, stub the completion builtins and record
    # what the script hands to zsh's _arguments (the candidate list).
    cmd = ("compdef() { :; }; _arguments() { print -r -- \"$@\"; }; "
           f"source {COMPLETIONS / '_astrai'}; "
           "words=(astrai pre); CURRENT=2; _astrai_completion")
    out = subprocess.run(["zsh", "-f", "-c", cmd], env=_astrai_on_path(tmp_path),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert '"preprocess"' in out and "serve-bench" not in out


def test_root_help_imports_no_command_module():
    """`astrai --help` lists the commands from the table alone: no command module, no
    pydantic, no rich until it renders."""
    import os

    code = ("import sys; sys.argv[0] = 'astrai'\n"
            "from astrai_cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED', *sorted(m for m in sys.modules if m.startswith("
            "('astrai_cli.commands.', 'pydantic', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True,
                         text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert "quickstart" in out and "serve-bench" in out
    assert out.strip().splitlines()[-1].split() == ["LOADED"]
