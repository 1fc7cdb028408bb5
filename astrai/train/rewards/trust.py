"""Rewards that are Python code, and what `astrai resume` asks before it runs them.

A run directory is data: someone may hand it over, and its meta.json can be edited to name
any file. `--reward module:function` / `file.py:function` imports and runs code, so resume
never takes such a spec from the run directory alone: the user gives the same `--reward`
again on the command line (having looked at the code), and the error shows which module
the run names. The check reads strings only; nothing is imported before it passes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from astrai.errors import ConfigError
from astrai.train.rewards.base import BUILTIN, FACTORIES


def names_code(spec: str) -> bool:
    """Whether a --reward spec is a user callable (module:function or file.py:function)
    rather than a built-in rule or a reward model (astrai.train.rewards.base.load_reward)."""
    spec = spec.strip()
    if spec in BUILTIN:
        return False
    head, sep, _ = spec.partition(":")
    return bool(sep) and head not in FACTORIES


def _split(spec: str) -> tuple[str, str]:
    module, _, attr = spec.strip().rpartition(":")
    return module, attr


def is_file_spec(module: str) -> bool:
    return module.endswith(".py") or "/" in module or os.sep in module


def absolute_reward(spec: str) -> str:
    """`file.py:function` with the file's absolute path (what the run saves, so resume
    names the same file from any directory); other specs unchanged."""
    if not names_code(spec):
        return spec
    module, attr = _split(spec)
    if is_file_spec(module):
        return f"{Path(module).resolve()}:{attr}"
    return spec.strip()


def describe(spec: str) -> str:
    """`file /abs/path.py, function f` or `module 'pkg.mod', function f`."""
    module, attr = _split(spec)
    if is_file_spec(module):
        return f"file {Path(module).resolve()}, function {attr}"
    return f"module '{module}' (from the working directory or the installed packages), " \
           f"function {attr}"


def confirm_rewards(config, given: Sequence[str] | None, source: Path | str) -> None:
    """Refuse to continue `config` (read from `source`) when its rewards are code that the
    command line did not name again; `given` must then be the run's rewards, in order."""
    saved = [absolute_reward(s) for s in config.alignment.reward]
    code = [s for s in saved if names_code(s)]
    if given:
        if not config.strategy.startswith("online"):
            raise ConfigError(f"--reward: the run's strategy '{config.strategy}' takes no "
                              "reward functions; drop --reward")
        mine = [absolute_reward(s) for s in given]
        if mine != saved:
            raise ConfigError(
                f"--reward {' '.join(given)}: the run was trained with --reward "
                f"{' --reward '.join(saved or ['exact'])} ({source}); give the same rewards, "
                "in the same order, to continue it exactly")
        return
    if code and config.strategy.startswith("online"):
        names = "; ".join(describe(s) for s in code)
        again = " ".join(f"--reward {s}" for s in saved)
        raise ConfigError(
            f"{source}: the run scores its rollouts with Python code ({names}); astrai resume "
            f"never runs code named only in a run directory: read that code, then pass the "
            f"run's rewards again: astrai resume {config.out} {again}")
