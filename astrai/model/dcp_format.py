"""Reading and writing the DCP (torch.distributed.checkpoint) part of a checkpoint, in one
process, with no process group.

    CKPT/dcp/.metadata        what each tensor is (shape, dtype, which file holds which chunk)
    CKPT/dcp/__R_0.distcp     the chunks rank R wrote (FSDP: its shards; DDP: its share of
                              the deduplicated replicas)

The state is one flattened dict: `model.<name>` for every weight and
`optimizer.state.<name>.<key>` / `optimizer.param_groups.<i>.<key>` for the optimizer,
keyed by parameter name (torch.distributed.checkpoint.state_dict's layout), so any number
of processes, with any executor, can read it back into their own shards.

torch's FileSystemReader unpickles `.metadata` with `pickle.load`, which runs whatever a
crafted file names; a checkpoint is data anyone may hand you, so `SafeReader` unpickles it
with an allow-list of the few classes DCP's metadata is made of. The data files are read
by DCP itself (tensors as raw bytes, other values with torch.load(weights_only=True)).
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from astrai.errors import CheckpointError

DCP_DIR = "dcp"
"""Inside a DCP checkpoint directory: the directory torch.distributed.checkpoint writes."""
METADATA = ".metadata"
MODEL_PREFIX = "model."

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


class SafeReader(FileSystemReader):
    """FileSystemReader whose `.metadata` is unpickled with an allow-list (module doc)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(Path(self.path) / METADATA, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def dcp_dir(path: str | Path) -> Path:
    """The DCP directory of a checkpoint: CKPT/dcp, or `path` itself when it holds .metadata."""
    path = Path(path)
    return path if (path / METADATA).is_file() else path / DCP_DIR


def is_dcp(path: str | Path) -> bool:
    """Whether `path` is a DCP checkpoint directory (its dcp/.metadata exists)."""
    return (Path(path) / DCP_DIR / METADATA).is_file()


def _fix(path: Path) -> str:
    return ("copy the whole checkpoint directory again, or use another checkpoint (a run's "
            "older step_N)")


def read_metadata(path: str | Path) -> Metadata:
    """The checkpoint's DCP metadata, checked against its data files (each one present and
    long enough for every chunk it holds); one-line CheckpointError otherwise."""
    d = dcp_dir(path)
    f = d / METADATA
    if not f.is_file():
        raise CheckpointError(f"{d}: no {METADATA}; not a complete DCP checkpoint ({_fix(d)})")
    try:
        metadata = SafeReader(str(d)).read_metadata()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError,
            AttributeError, IndexError, ImportError) as e:
        raise CheckpointError(f"{f}: truncated or damaged ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'unreadable'}); "
                              f"{_fix(d)}") from None
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0),
                                       int(info.offset) + int(info.length))
    for name, end in sorted(ends.items()):
        data = d / name
        if not data.is_file():
            raise CheckpointError(f"{data}: missing shard of this DCP checkpoint; {_fix(d)}")
        if data.stat().st_size < end:
            raise CheckpointError(f"{data}: truncated shard ({data.stat().st_size} of {end} "
                                  f"bytes); {_fix(d)}")
    return metadata


def tensor_shapes(path: str | Path, prefix: str = MODEL_PREFIX) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor whose key starts with `prefix` (the prefix removed), from the
    metadata alone (no tensor data read)."""
    meta = read_metadata(path).state_dict_metadata
    return {k[len(prefix):]: tuple(v.size) for k, v in meta.items()
            if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}


def read_tensors(path: str | Path, names: list[str] | None = None,
                 prefix: str = MODEL_PREFIX) -> dict[str, torch.Tensor]:
    """Full CPU tensors of the checkpoint's `prefix` keys (all, or only `names`, given
    without the prefix), assembled from every rank's chunks in this one process. Reads only
    the chunks of the tensors asked for, so a caller can stream a large checkpoint a few
    tensors at a time."""
    return read_items(path, names, prefix, tensors_only=True)


def read_items(path: str | Path, names: list[str] | None = None, prefix: str = "",
               tensors_only: bool = False) -> dict[str, Any]:
    """read_tensors, and also the plain values (an optimizer's param_groups) when not
    `tensors_only`; DCP reads those with torch.load(weights_only=True)."""
    import torch.distributed.checkpoint as dcp

    d = dcp_dir(path)
    meta = read_metadata(d).state_dict_metadata
    keys = [k for k, v in meta.items() if k.startswith(prefix)
            and (isinstance(v, TensorStorageMetadata) or not tensors_only)]
    if names is not None:
        wanted = {prefix + n for n in names}
        keys = [k for k in keys if k in wanted]
    template: dict[str, Any] = {
        k: torch.empty(tuple(meta[k].size), dtype=meta[k].properties.dtype)
        if isinstance(meta[k], TensorStorageMetadata) else None for k in keys}
    try:
        with alone():
            dcp.load(template, storage_reader=SafeReader(str(d)), no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - any reader failure
        raise CheckpointError(f"{d}: unreadable DCP data ({_first_line(e)}); {_fix(d)}") from None
    return {k[len(prefix):]: v for k, v in template.items()}


def read_optimizer(path: str | Path) -> dict[str, Any] | None:
    """The checkpoint's optimizer state in optimizer.pt's layout: torch.optim's own
    (`state` and `param_groups` keyed by parameter index) plus `param_names`, the name of
    each index; None when it holds no optimizer state."""
    items = read_items(path, prefix="optimizer.")
    if not items:
        return None
    groups: dict[int, dict[str, Any]] = {}
    by_name: dict[str, dict[str, Any]] = {}
    for key, value in items.items():
        kind, rest = key.split(".", 1)
        if kind == "param_groups":  # param_groups.<i>.<field>
            index, name = rest.split(".", 1)
            groups.setdefault(int(index), {})[name] = value
        elif kind == "state":  # state.<parameter name>.<field>; fields hold no dot
            name, key_ = rest.rsplit(".", 1)
            by_name.setdefault(name, {})[key_] = value
    ordered = [groups[i] for i in sorted(groups)]
    names = [n for g in ordered for n in g.get("params", [])]
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: s for n, s in by_name.items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in ordered],
            "param_names": names}


def write_tensors(path: str | Path, state: dict[str, Any]) -> None:
    """Write `state` (nested dicts of tensors and plain values) as a DCP directory from this
    one process (a conversion; training saves with every rank, astrai.train.dcp_save)."""
    import torch.distributed.checkpoint as dcp

    with alone():
        dcp.save(state, storage_writer=FileSystemWriter(str(path)), no_dist=True)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """DCP in one process on purpose: without its warning that no process group exists."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _first_line(e: BaseException) -> str:
    """The reason of a DCP failure: the first failed rank's exception (a CheckpointException
    carries one per rank), its first line."""
    for failure in getattr(e, "failures", {}).values():
        e = failure[0] if isinstance(failure, tuple) else failure
        break
    text = str(e)
    if "weights_only" in text:  # torch.load's refusal: keep its reason, never its advice
        reason = text.split("WeightsUnpickler error:", 1)[-1]
        lines = [x.strip() for x in reason.splitlines() if x.strip() and "weights_only" not in x]
        return f"not data DCP wrote: {lines[0][:200]}" if lines else "not data DCP wrote"
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__
