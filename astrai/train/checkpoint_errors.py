"""Why a training checkpoint could not be written or read, as one line that says what to do.

    load_failure(e)                  the reason of a refused torch.load, without its advice
    is_disk_full(e)                  a save that failed for want of space
    disk_full_message(...)           where, and which checkpoint is still good
    damaged_hint(path, older)        move the damaged one away: resume from `older`

Pure functions over exceptions and paths (the callers in astrai.train.checkpointing find
the checkpoints). A refused unpickling never suggests `weights_only=False`: a run
directory is data anyone may hand you (docs/resume.md).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from astrai.diskfull import DiskFullError
from astrai.diskfull import is_disk_full as full_anywhere

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SENTENCE_END = re.compile(r"(?<=\.)\s+")
# Sentences of PyTorch's weights_only refusal that advise rather than explain: to load
# unsafely, to allow-list globals, to read the docs or file an issue.
_ADVICE = ("weights_only", "safe_globals", "trust", "torch.load", "file an issue",
           "two options", "weights only load failed")
_MARKER = "WeightsUnpickler error:"


def load_failure(e: BaseException) -> str:
    """One short line for a failed torch.load. PyTorch's weights_only refusal is paragraphs
    of advice (some of it to load the file unsafely) around one reason line, such as
    `Trying to load unsupported GLOBAL posix.system ...` or `Unsupported operand 103`:
    keep the reason, drop the advice."""
    text = _ANSI.sub("", str(e))
    refused = "weights_only" in text or _MARKER in text
    if _MARKER in text:
        text = text.split(_MARKER, 1)[1]
    for line in text.splitlines():
        keep = [s for s in _SENTENCE_END.split(line.strip())
                if s and not any(a in s.lower() for a in _ADVICE)]
        if keep:
            reason = " ".join(keep).rstrip(".")
            return f"not a file torch.save wrote with plain tensors: {reason}" if refused \
                else reason
    return "not a file torch.save wrote with plain tensors" if refused else type(e).__name__


_FULL_TEXT = ("unexpected pos", "storagefull")


def is_disk_full(e: BaseException) -> bool:
    """astrai.diskfull's test (ENOSPC / EDQUOT / EFBIG however a writer says it, and its
    DiskFullError), or what torch's zip writer and safetensors also say for a short write
    (`unexpected pos N vs M`, `StorageFull`)."""
    if isinstance(e, DiskFullError) or full_anywhere(e):
        return True
    return any(t in str(e).lower() for t in _FULL_TEXT)


def _free(path: Path) -> str:
    for p in (path, *path.parents):
        if p.is_dir():
            try:
                return f"{shutil.disk_usage(p).free / 2**20:,.0f} MiB free"
            except OSError:
                return "free space unknown"
    return "free space unknown"


def disk_full_message(ckpt_dir: Path, step: int, last_good: Path | None, run_dir: Path) -> str:
    """The line for a checkpoint save that ran out of space (its partial files are gone)."""
    where = f"{ckpt_dir}: disk full while saving checkpoint step_{step} ({_free(ckpt_dir)})"
    if last_good is None:
        return (f"{where}; no checkpoint of this run was saved yet: free space, then run the "
                "same `astrai train` command again")
    return (f"{where}; its partial files were removed and the last good checkpoint is "
            f"{last_good.name} ({last_good}): free space, then `astrai resume {run_dir}`")


def damaged_hint(path: Path, older: Path | None) -> str:
    """What to do about the damaged checkpoint `path`, given the newest one before it."""
    if older is not None:
        return f"the checkpoint is damaged: move {path} away to resume from {older.name}"
    return (f"the checkpoint is damaged and the run has no older one: move {path} away and "
            "run the same `astrai train` command again to start afresh")
