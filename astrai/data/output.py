"""A dataset directory being written: refused when it would replace something that is not
a dataset (or a dataset holding files it does not own), built in a locked temporary directory beside it, renamed into place at the end
(an interrupted or failed run never leaves a dataset that looks complete)."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from astrai.atomic import first_unowned, replace_dir
from astrai.data.manifest import MANIFEST
from astrai.errors import ConfigError
from astrai.tempdir import remove_abandoned, sibling_tempdir


def check_output(out: Path, overwrite: bool, inputs: list[Path]) -> None:
    """`overwrite` replaces only a dataset astrai wrote (a directory with its manifest) that
    holds none of this run's inputs; anything else named as output is refused."""
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise ConfigError(f"output: {out} already exists; remove it, choose another output, "
                          "or pass --set overwrite=true")
    if not out.is_dir() or not (out / MANIFEST).is_file():
        raise ConfigError(f"output: {out} exists and is not an astrai dataset (no {MANIFEST}); "
                          "overwrite only replaces datasets, so remove it yourself or choose "
                          "another output")
    root = out.resolve()
    for f in inputs:
        if f.resolve().is_relative_to(root):
            raise ConfigError(f"output: {out} holds the input {f}; overwriting it would delete "
                              "the input, so choose another output")
    foreign = first_unowned(out, owned_files(out))
    if foreign is not None:
        raise ConfigError(f"output: {out} holds {foreign}, which the dataset does not own (its "
                          f"{MANIFEST} does not list it); overwriting would delete it, so move "
                          "it out or choose another output")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def owned_files(out: Path) -> set[str]:
    """What a dataset directory's manifest says it holds (docs/formats.md "Dataset
    directory"): the manifest, the tokenizer copy, every split's shards (a bin shard is a
    directory of one .bin and one .idx per key)."""
    try:
        m = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        tok = m["tokenizer"]["dir"]
        owned = {MANIFEST, *(f"{tok}/{name}" for name in TOKENIZER_FILES)}
        for split, s in m["splits"].items():
            owned.add(split)
            for shard in s["shards"]:
                path = shard["path"]
                owned.add(path)
                if m["format"] == "bin":
                    owned.update(f"{path}/{k}.{ext}" for k in m["keys"] for ext in ("bin", "idx"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            AttributeError) as e:
        raise ConfigError(f"output: {out / MANIFEST} is unreadable ({type(e).__name__}: {e}), "
                          "so what the dataset owns is unknown; remove it yourself or choose "
                          "another output") from None
    return {str(p) for p in owned}


def _start_output(out: Path, held: contextlib.ExitStack) -> Path:
    """The temporary directory beside `out`, locked until `held` closes; a one-line
    ConfigError when it cannot be created (read-only, no permission, a parent is a file)."""
    try:
        return held.enter_context(sibling_tempdir(out))
    except OSError as e:
        raise ConfigError(f"output: cannot create {out} ({e.strerror or e}); choose a "
                          "writable location") from None


@contextlib.contextmanager
def dataset_output(out: Path, overwrite: bool, inputs: list[Path]) -> Iterator[Path]:
    """The temporary directory to write dataset `out` into (after `check_output` and the
    removal of killed runs' temporary directories); renamed to `out` when the block ends,
    deleted when it raises."""
    check_output(out, overwrite, inputs)
    remove_abandoned(out)
    with contextlib.ExitStack() as held:  # the lock on the temporary directory
        tmp = _start_output(out, held)
        try:
            yield tmp
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
