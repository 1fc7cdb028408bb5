"""Where `astrai train` may start a new run (docs/train.md "The run directory").

    with claim_new_run_dir(paths) as claim:   # created and locked; ConfigError / RunInUse
        ... validate, build ...
        claim.clear_stale()                    # only once the new run is about to write

`--out` may be missing, empty, or a run that was stopped before its first checkpoint (a
`kill -9` leaves its config, metrics and a `.step_N.tmp-*` of a torn save): a new run
starts afresh there, replacing them. A directory holding a complete checkpoint is
continued with `astrai resume`, and one holding files no run wrote is never touched.
The directory is locked before it is looked at (astrai.train.run_lock), so two `astrai
train --out DIR` started together cannot both pass the check.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from astrai.config.train import saved_option
from astrai.errors import ConfigError
from astrai.train.checkpointing import clean_leftovers, list_checkpoints
from astrai.train.context import RunPaths
from astrai.train.run_lock import LOCK_NAME, hold_run, probe_run

CONFIG_NAME = "train_config.json"
RUN_FILES = (CONFIG_NAME, "metrics.jsonl", "latest", "checkpoints")
"""What a run writes at the top of its directory (with TensorBoard's event files)."""


def _is_run_file(p: Path) -> bool:
    return p.name in RUN_FILES or p.name.startswith("events.out.tfevents.")


def _saved_ckpt_dir(run_dir: Path) -> Path | None:
    """The --ckpt-dir the stopped run saved in its train_config.json, if any."""
    try:
        saved = json.loads((run_dir / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = saved_option(saved, "ckpt_dir") if isinstance(saved, dict) else None
    return Path(value) if isinstance(value, str) and value else None


def check_new_run_dir(paths: RunPaths) -> list[Path]:
    """What a new run in `paths.run_dir` replaces: nothing for a missing or empty directory,
    the files of a run stopped before its first checkpoint; a one-line ConfigError for a
    file, a run with checkpoints, or a directory of other files. Changes nothing."""
    d = paths.run_dir
    if d.exists() and not d.is_dir():
        raise ConfigError(f"out: {d} is a file; --out takes a directory (new, empty, or a "
                          "run stopped before its first checkpoint)")
    if not d.is_dir():
        return []
    entries = sorted(p for p in d.iterdir() if p.name != LOCK_NAME)
    for ckpt_dir in {paths.ckpt_dir, d / "checkpoints", _saved_ckpt_dir(d)} - {None}:
        found = list_checkpoints(ckpt_dir)
        if found:
            raise ConfigError(
                f"out: {d} already exists and holds a run with checkpoints (newest "
                f"{found[-1][1].name}); continue it with `astrai resume {d}` or choose "
                "another --out")
    foreign = [p.name for p in entries if not _is_run_file(p)]
    if entries and (foreign or not (d / CONFIG_NAME).is_file()):
        names = ", ".join(foreign[:3] or [p.name for p in entries[:3]])
        raise ConfigError(
            f"out: {d} already exists and is not empty ({names}, not a run of `astrai "
            "train`); choose another --out (a run directory continues with `astrai resume`)")
    return entries


def probe_new_run_dir(paths: RunPaths) -> None:
    """check_new_run_dir, and RunInUse if a live run holds the directory (the launcher's
    check before it starts workers, which then take the lock themselves)."""
    if paths.run_dir.is_dir():
        probe_run(paths.run_dir)
    check_new_run_dir(paths)


@dataclass
class Claim:
    paths: RunPaths
    made: bool
    """The directory did not exist: this run created it."""
    stale: list[Path] = field(default_factory=list)
    """The files of a run stopped before its first checkpoint, to replace."""

    def clear_stale(self) -> None:
        """Remove the stopped run's files and its torn saves (it is dead: this process
        holds the lock)."""
        for p in self.stale:
            if p.name == "checkpoints" or p.name == CONFIG_NAME:
                continue  # the config is rewritten; checkpoints/ is cleaned below
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        for ckpt_dir in {self.paths.ckpt_dir, self.paths.run_dir / "checkpoints"}:
            clean_leftovers(ckpt_dir)
        self.stale = []


@contextlib.contextmanager
def claim_new_run_dir(paths: RunPaths) -> Iterator[Claim]:
    """Create `paths.run_dir`, lock it, then check it may hold a new run. The lock comes
    before the check, so of two `astrai train --out DIR` started together the second is
    refused by name, never both pass."""
    d = paths.run_dir
    if d.exists() and not d.is_dir():
        check_new_run_dir(paths)  # raises: a file
    made = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    with hold_run(d, "astrai train"):
        yield Claim(paths, made, check_new_run_dir(paths))
