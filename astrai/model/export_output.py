"""An export directory being written: refused when it would replace something that is not an
earlier export, built in a locked temporary directory beside it, renamed into place at the
end (docs/export.md).

Every export writes `OUT_DIR/.astrai-export`, a JSON marker naming the files it wrote; an
existing OUT_DIR is replaced only when it holds that marker and nothing the marker does not
list, so `--overwrite` never deletes a user's directory or file named by mistake.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from astrai import __version__
from astrai.atomic import first_unowned, replace_dir
from astrai.errors import CheckpointError
from astrai.tempdir import remove_abandoned, sibling_tempdir

MARKER = ".astrai-export"


def check_export_output(out: Path, overwrite: bool) -> None:
    """Refuse an `out` that exists, unless it is an empty directory or (with `overwrite`) an
    earlier export holding only what its marker lists."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    if not overwrite:
        raise CheckpointError(f"{out}: already exists; choose another path or pass --overwrite "
                              "(it replaces only an earlier astrai export)")
    if out.is_symlink() or not out.is_dir() or not (out / MARKER).is_file():
        what = ("a symlink" if out.is_symlink() else "a file" if not out.is_dir() else
                f"a directory without {MARKER}")
        raise CheckpointError(f"{out}: {what}, not an earlier astrai export; --overwrite "
                              "replaces only those, so remove it yourself or choose another "
                              "OUT_DIR")
    foreign = first_unowned(out, exported_files(out))
    if foreign is not None:
        raise CheckpointError(f"{out}: holds {foreign}, which the earlier export did not write "
                              f"({MARKER} does not list it); --overwrite would delete it, so "
                              "move it out or choose another OUT_DIR")


def exported_files(out: Path) -> set[str]:
    """The marker and the files it lists."""
    try:
        files = json.loads((out / MARKER).read_text(encoding="utf-8"))["files"]
        if not all(isinstance(f, str) for f in files):
            raise TypeError("'files' is not a list of paths")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{out / MARKER}: unreadable ({type(e).__name__}: {e}), so what "
                              "the earlier export wrote is unknown; remove OUT_DIR yourself or "
                              "choose another") from None
    return {MARKER, *files}


def write_marker(tmp: Path, source: Path) -> None:
    """Name every file written into `tmp` in its marker (written last)."""
    files = sorted(Path(cur, f).relative_to(tmp).as_posix()
                   for cur, _, names in os.walk(tmp) for f in names)
    marker = {"producer": f"astrai {__version__}", "source": str(source.resolve()),
              "files": files}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def export_tempdir(out: Path, what: str = "OUT_DIR") -> Iterator[Path]:
    """A locked temporary directory beside export `out` (after the removal of killed
    exports' temporary directories); a one-line CheckpointError naming `what` when it
    cannot be created. The caller moves its result into place and cleans up."""
    remove_abandoned(out)
    with contextlib.ExitStack() as held:  # the lock on the temporary directory
        try:
            tmp = held.enter_context(sibling_tempdir(out))
        except OSError as e:
            raise CheckpointError(f"{out}: cannot create it ({e.strerror or e}); choose a "
                                  f"writable {what}") from None
        yield tmp


@contextlib.contextmanager
def export_output(out: Path, source: Path) -> Iterator[Path]:
    """The temporary directory to write export `out` into (export_tempdir); marked and
    renamed to `out` when the block ends, deleted when it raises."""
    with export_tempdir(out) as tmp:
        try:
            yield tmp
            write_marker(tmp, source)
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
