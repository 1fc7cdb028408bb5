"""`astrai preprocess merge`: shard datasets (`--shard I/N` builds) -> one dataset directory.

The token data is not rewritten: each shard file is hard-linked into the merged directory
(a second name for the same bytes: no copy, no extra disk, and deleting the shard
directories afterwards is safe). Where a hard link is impossible (another filesystem, or a
filesystem without links) the file is copied. The merged directory is self-contained: a
manifest listing the shards in order with their summed counts, and a copy of the tokenizer.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from astrai.data.builder import SplitStats
from astrai.data.manifest import MANIFEST, TOKENIZER_DIR, read_manifest
from astrai.data.output import dataset_output
from astrai.errors import DataError

# Manifest fields every merged shard must share (what the data means, and how to read it).
SAME = ("kind", "grpo_mode", "format", "keys", "token_dtype", "has_loss_mask", "position_ids",
        "max_seq_len", "row_len", "packing")
COUNTS = tuple(f.name for f in fields(SplitStats) if f.name != "shards")


@dataclass
class MergeResult:
    """What `merge_datasets` returns (and `astrai preprocess merge --json` prints)."""

    output: str
    inputs: list[str]
    splits: dict[str, dict]
    linked: int
    copied: int

    def to_dict(self) -> dict:
        return {"output": self.output, "inputs": self.inputs, "splits": self.splits,
                "linked_files": self.linked, "copied_files": self.copied}


def _order(dirs: list[Path], manifests: list[dict]) -> list[int]:
    """Shards of one `--shard I/N` run in shard order (a shell glob sorts shard-10 before
    shard-2); a repeated or missing shard is an error. Other datasets keep the given order."""
    info = [m.get("shard") for m in manifests]
    if not all(info):
        return list(range(len(dirs)))
    counts = {s["count"] for s in info}
    if len(counts) > 1:
        raise DataError(f"the inputs are shards of runs with different counts "
                        f"({', '.join(map(str, sorted(counts)))}); merge one run's shards")
    seen: dict[int, Path] = {}
    for d, s in zip(dirs, info, strict=True):
        if s["index"] in seen:
            raise DataError(f"{d}: shard {s['index']}/{s['count']} is also {seen[s['index']]}; "
                            "pass each shard once")
        seen[s["index"]] = d
    missing = sorted(set(range(counts.pop())) - set(seen))
    if missing:
        raise DataError(f"shard{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} of {info[0]['count']} missing; pass "
                        "every shard's directory (or rebuild the missing ones)")
    return sorted(range(len(dirs)), key=lambda k: info[k]["index"])


def _check_compatible(dirs: list[Path], manifests: list[dict]) -> None:
    first, m0 = dirs[0], manifests[0]
    for d, m in zip(dirs[1:], manifests[1:], strict=True):
        if m["tokenizer"]["fingerprint"] != m0["tokenizer"]["fingerprint"]:
            raise DataError(f"{d}: built with another tokenizer than {first} (fingerprints "
                            f"{m['tokenizer']['fingerprint'][:12]} vs "
                            f"{m0['tokenizer']['fingerprint'][:12]}); merge only datasets "
                            "built with one tokenizer")
        for key in SAME:
            if m.get(key) != m0.get(key):
                raise DataError(f"{d}: {key} is {m.get(key)!r} but {first} has "
                                f"{m0.get(key)!r}; merge only shards of one spec")


def _link(src: Path, dst: Path) -> bool:
    """Hard-link file `src` as `dst`; copy it where links are impossible. True if linked."""
    try:
        os.link(src, dst)
        return True
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    shutil.copy2(src, dst)
    return False


def merge_datasets(dirs: Sequence[str | Path], out: str | Path, *,
                   overwrite: bool = False) -> MergeResult:
    """Join datasets of one spec and tokenizer into `out`, samples in shard order."""
    dirs = [Path(d) for d in dirs]
    out = Path(out)
    if not dirs:
        raise DataError("merge: name at least one dataset directory")
    manifests = [read_manifest(d) for d in dirs]
    _check_compatible(dirs, manifests)
    order = _order(dirs, manifests)
    dirs, manifests = [dirs[k] for k in order], [manifests[k] for k in order]
    linked = copied = 0
    splits: dict[str, dict] = {}
    with dataset_output(out, overwrite, dirs) as tmp:
        for d, m in zip(dirs, manifests, strict=True):
            for name, s in m["splits"].items():
                acc = splits.setdefault(name, {**dict.fromkeys(COUNTS, 0), "shards": []})
                (tmp / name).mkdir(exist_ok=True)
                for k in COUNTS:
                    acc[k] += s.get(k, 0)
                for sh in s["shards"]:
                    src = d / sh["path"]
                    i = len(acc["shards"])
                    rel = f"{name}/shard_{i:05d}" + (".h5" if m["format"] == "h5" else "")
                    files = [(src, tmp / rel)] if src.is_file() else [
                        (f, tmp / rel / f.name) for f in sorted(src.iterdir())]
                    if not src.is_file():
                        (tmp / rel).mkdir()
                    for a, b in files:
                        ok = _link(a, b)
                        linked, copied = linked + ok, copied + (not ok)
                    acc["shards"].append({**sh, "path": rel,
                                          "from": str(d.resolve() / sh["path"])})
        for acc in splits.values():
            acc["packing_efficiency"] = (acc["tokens"] / acc["capacity"] if acc["capacity"]
                                         else None)
        src_tok = dirs[0] / manifests[0]["tokenizer"]["dir"]
        shutil.copytree(src_tok, tmp / TOKENIZER_DIR)
        manifest = {**manifests[0], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "tokenizer": {**manifests[0]["tokenizer"], "dir": TOKENIZER_DIR},
                    "splits": splits, "shard": None,
                    "merged_from": [{"path": str(d.resolve()), "shard": m.get("shard")}
                                    for d, m in zip(dirs, manifests, strict=True)]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return MergeResult(str(out), [str(d) for d in dirs], splits, linked, copied)
