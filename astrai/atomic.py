"""Atomic writes: a reader (or a run killed half way) never sees half a file or directory.

Everything is written beside its target under a temporary name, then renamed into place
with os.replace, which POSIX makes atomic within one filesystem. Files and directories get
the permissions of the umask, like other tools' outputs; temporary directories are locked
while written, so a later writer can delete those of writers that died
(astrai.tempdir.remove_abandoned).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from astrai.diskfull import writing
from astrai.errors import CheckpointError
from astrai.tempdir import follow_umask, sibling_tempdir


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path`, creating its directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with writing(path), os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        follow_umask(tmp)  # mkstemp creates the file private (0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any, *, indent: int | None = 2) -> None:
    """`obj` as JSON (indented unless indent=None), newline-terminated."""
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


def replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished directory `tmp` to `final`, swapping out an existing one: the old
    directory is renamed aside first and deleted only after the new one is in place."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def first_unowned(root: str | Path, owned: Iterable[str]) -> str | None:
    """The first entry under directory `root` (a relative POSIX path, in sorted order) that a
    writer does not own: neither one of its `owned` paths nor a directory on the way to one,
    or any symlink (writers here create none). None when `root` holds only what it owns:
    the test a writer passes before replacing a directory it wrote earlier, so that a
    user's file put inside is never deleted with it."""
    owned = {PurePosixPath(p) for p in owned}
    allowed = owned | {d for p in owned for d in p.parents}
    root = Path(root)
    for cur, dirs, files in os.walk(root):  # symlinks are listed, never followed
        rel = PurePosixPath(Path(cur).relative_to(root).as_posix())
        dirs.sort()
        for name in sorted(files):
            if rel / name not in owned or os.path.islink(os.path.join(cur, name)):
                return str(rel / name)
        for name in dirs:
            if rel / name not in allowed or os.path.islink(os.path.join(cur, name)):
                return str(rel / name)
    return None


@contextlib.contextmanager
def atomic_dir(final: str | Path, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary directory beside `final`; rename it into place only on success."""
    final = Path(final)
    with sibling_tempdir(final) as tmp:  # permissions of the umask, deleted on an error
        yield tmp
        if final.exists() and not overwrite:
            raise CheckpointError(f"{final}: already exists; choose another path")
        replace_dir(tmp, final)
