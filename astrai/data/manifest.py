"""manifest.json: what a dataset directory holds (docs/formats.md "Dataset directory")."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astrai import __version__
from astrai.errors import DataError

if TYPE_CHECKING:
    from astrai.config.preprocess import PreprocessSpec
    from astrai.data.tokenizer import Tokenizer

MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
FORMAT_VERSION = 1


def write_manifest(path: Path, *, spec: PreprocessSpec, tok: Tokenizer, token_dtype: str,
                   dtypes: dict[str, str], stats: dict, offline_grpo: bool,
                   shard: dict | None = None, command: dict | None = None) -> dict:
    splits = {}
    for name, s in stats.items():
        d = asdict(s)
        d["packing_efficiency"] = s.packing_efficiency
        splits[name] = d
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "astrai_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "kind": spec.kind,
        "grpo_mode": ("offline" if offline_grpo else "online") if spec.kind == "grpo" else None,
        "format": spec.format,
        "keys": dtypes,
        "token_dtype": token_dtype,
        "has_loss_mask": spec.kind in ("pretrain", "sft") and spec.has_loss_mask,
        "position_ids": spec.position_ids,
        "max_seq_len": spec.max_seq_len,
        "row_len": spec.row_len,
        "packing": spec.packing.mode,
        "tokenizer": {
            "dir": TOKENIZER_DIR, "fingerprint": tok.fingerprint(),
            "vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
            "pad_id": tok.pad_id, "stop_ids": tok.stop_ids,
        },
        "splits": splits,
        "shard": shard,
        "spec": spec.model_dump(mode="json"),
        "command": command,
    }
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def read_manifest(root: str | Path) -> dict:
    """The manifest of dataset directory `root`; DataError when it is not a dataset."""
    root = Path(root)
    f = root / MANIFEST
    if not f.is_file():
        hint = " (an interrupted preprocess leaves only a hidden .tmp directory)" if (
            root.exists()) else ""
        raise DataError(f"{root}: not a dataset directory, no {MANIFEST}{hint}; build one "
                        "with `astrai preprocess spec.json`")
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{f}:{e.lineno}: invalid JSON ({e.msg}); rebuild the dataset") from e
    if m.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{f}: format_version {m.get('format_version')} is not supported "
                        f"(expected {FORMAT_VERSION}); rebuild the dataset")
    return m


def dataset_tokenizer_dir(root: str | Path) -> Path:
    """The copy of the tokenizer a dataset was built with (copy it into checkpoints)."""
    d = Path(root) / read_manifest(root)["tokenizer"]["dir"]
    if not (d / "tokenizer.json").is_file():
        raise DataError(f"{d}: the dataset's tokenizer copy is missing; rebuild the dataset")
    return d


REBUILT_FIELDS = ("tokenizer", "output", "overwrite")
"""Spec fields a rebuild with another tokenizer sets itself (the recorded --set of these
are dropped)."""


def retokenize_command(root: str | Path, tokenizer: str | Path) -> tuple[str, Path]:
    """(the `astrai preprocess` command that rebuilds dataset `root` with `tokenizer`, the
    directory it writes). The command repeats the spec file and --set overrides the dataset
    was built with (the manifest's `command`), sets the tokenizer, and writes beside the
    dataset (ROOT-<tokenizer dir name>); 'SPEC' stands for the spec file when the manifest
    names none (a dataset built from Python)."""
    import shlex

    root, tokenizer = Path(root), Path(tokenizer)
    try:
        built = read_manifest(root).get("command") or {}
    except DataError:
        built = {}
    sets = [s for s in built.get("set") or []
            if s.partition("=")[0].strip() not in REBUILT_FIELDS]
    out = root.parent / f"{root.name}-{tokenizer.name}"
    sets += [f"tokenizer={tokenizer}", f"output={out}"]
    spec = shlex.quote(built["spec"]) if built.get("spec") else "SPEC"
    return " ".join(["astrai preprocess", spec,
                     *(f"--set {shlex.quote(s)}" for s in sets)]), out
