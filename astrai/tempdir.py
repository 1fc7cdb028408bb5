"""Temporary sibling directories for atomic writes, and the clean-up of abandoned ones.

    with sibling_tempdir(final) as tmp:     # .NAME.tmp-PID-HEX beside `final`
        ... write into tmp ...
        os.replace(tmp, final)
    remove_abandoned(final)                 # the .NAME.tmp-* of killed writers

A writer holds an exclusive `flock` on its temporary directory for as long as it runs; the
kernel drops the lock when the process dies, even by `kill -9`. So a temporary directory
whose lock can be taken belongs to nobody alive and is safe to delete, and one still being
written is never touched (flock(2); Linux and macOS). Directories and files are created
with the permissions of the umask, like other tools' outputs (`tempfile.mkdtemp` would
make them private, 0700).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; abandoned directories are left alone
    fcntl = None  # type: ignore[assignment]


def temp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-"


def current_umask() -> int:
    """The process umask (Linux reads it without changing it; elsewhere set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path, mode: int = 0o666) -> None:
    """chmod `path` to `mode` less the umask (for files a library wrote private, 0600)."""
    os.chmod(path, mode & ~current_umask())


def _lock(path: Path) -> int | None:
    """An fd holding an exclusive non-blocking flock on directory `path`; None when another
    process holds it (or flock is unavailable)."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def sibling_tempdir(final: str | Path) -> Iterator[Path]:
    """A new directory `.NAME.tmp-PID-HEX` beside `final` (its parent is created), locked
    while the block runs and deleted if the block raises; the caller renames it into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{temp_prefix(final)}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    fd = _lock(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if fd is not None:
            os.close(fd)


def remove_abandoned(final: str | Path) -> list[Path]:
    """Delete the temporary directories of `final` left by writers that died (their lock is
    free); return them. Directories of live writers, symlinks and files are left alone."""
    final = Path(final)
    removed: list[Path] = []
    if fcntl is None or not final.parent.is_dir():
        return removed
    for p in final.parent.glob(glob.escape(temp_prefix(final)) + "*"):
        if p.is_symlink() or not p.is_dir():
            continue
        try:
            fd = _lock(p)
        except OSError:
            continue
        if fd is None:
            continue  # a live writer holds it
        try:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        finally:
            os.close(fd)
    return removed
