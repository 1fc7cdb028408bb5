"""A full disk is the user's to fix: one line naming the path and the free space left.

    with writing(out_path):           # DiskFullError instead of whatever the writer raised
        save_file(tensors, out_path)

Writers report a full disk in their own ways: an OSError with errno ENOSPC (no space),
EDQUOT (quota) or EFBIG (the file size limit), pyarrow's OSError without an errno,
torch.save's RuntimeError ("PytorchStreamWriter failed writing file"), the tokenizers
library's Exception ("No space left on device (os error 28)"). `is_disk_full` recognises
them all, through the exception's chain; `DiskFullError` is an AstraiError, so the CLI prints
it as one line and exits 2. The commands that write leave nothing half-written: they write
into a temporary name and rename (astrai.atomic), and remove it when a write fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from astrai.errors import AstraiError

ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
MESSAGES = tuple(os.strerror(e).lower() for e in sorted(ERRNOS)) + (
    "failed writing file", "os error 28", "os error 122", "os error 27", "requested and")
"""How writers without an errno say it (torch.save's stream writer fails on any short
write, numpy's tofile says "N requested and M written"; the rest are the C library's and
Rust's wording)."""


class DiskFullError(AstraiError):
    """No space (or quota, or file-size allowance) left for a file the command writes."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, says the disk is full."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in ERRNOS:
            return True
        if any(m in str(e).lower() for m in MESSAGES):
            return True
        e = e.__cause__ or e.__context__
    return False


def free_space(path: str | Path) -> str:
    """The free space on `path`'s filesystem (its nearest existing parent), e.g. "3.2 MiB"."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if free >= size:
            return f"{free / size:.1f} {unit}"
    return f"{free} bytes"


def full_message(path: str | Path) -> str:
    return (f"{path}: the disk is full ({free_space(path)} free there; or the quota or the "
            "file size limit is reached); free some space or write elsewhere")


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Within the block, a full disk while writing `path` raises DiskFullError naming it."""
    try:
        yield
    except DiskFullError:  # named by an inner writer (a temporary file): name `path`
        raise DiskFullError(full_message(path)) from None
    except Exception as e:
        if is_disk_full(e):
            raise DiskFullError(full_message(getattr(e, "filename", None) or path)) from None
        raise
