"""Where the quickstart's corpus lives: examples/data/shakespeare.

Shakespeare's plays and poems for training (39 works, 4.7 MB) and two held-out texts (The
Tempest, the first sonnets) for validation (examples/data/README.md). The files ship in the
repository, not inside the wheel, so they are looked up beside the installed package (an
editable install or a checkout), then under the current directory; `--corpus DIR` points
anywhere else (`--corpus examples/data` is the 8-play, 1 MB sample earlier recipes used,
at 4 epochs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from astrai.errors import DataError

TRAIN_FILE = "shakespeare_train.jsonl"
VAL_FILE = "shakespeare_val.jsonl"


@dataclass(frozen=True)
class Corpus:
    train: Path
    val: Path


def _candidates() -> list[Path]:
    import astrai

    pkg_root = Path(astrai.__file__).resolve().parent.parent
    return [root / "examples" / "data" / "shakespeare" for root in (pkg_root, Path.cwd())]


def find_corpus(directory: str | Path | None = None) -> Corpus:
    """The train/val files in `directory`, or in the bundled examples/data/shakespeare."""
    dirs = [Path(directory)] if directory is not None else _candidates()
    for d in dirs:
        if (d / TRAIN_FILE).is_file() and (d / VAL_FILE).is_file():
            return Corpus(d / TRAIN_FILE, d / VAL_FILE)
    where = ", ".join(str(d) for d in dirs)
    raise DataError(
        f"corpus: {TRAIN_FILE} and {VAL_FILE} not found in {where}; run from an astrai "
        "checkout (the files are in examples/data/shakespeare) or pass --corpus DIR"
    )


def text_bytes(path: Path, field: str = "text") -> int:
    """UTF-8 bytes of every record's `field` (for the summary: how much text was held out)."""
    import json

    n = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                n += len(json.loads(line)[field].encode("utf-8"))
    return n
