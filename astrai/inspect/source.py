"""Where the weights are and how to read them a slice at a time.

A checkpoint is an astrai checkpoint directory (config.json + model.safetensors +
meta.json; or config.json + dcp/, the shards torch.distributed.checkpoint wrote), an
HF-format directory (config.json with `model_type`, model.safetensors or shards listed in
model.safetensors.index.json) or a single .safetensors file. Safetensors are never loaded
whole: `read_rows` reopens the file for every slice, so the memory map never holds more
than the slice just read (peak memory stays bounded by the chunk size). A DCP checkpoint
is read one tensor at a time (DCP reads only that tensor's chunks from every rank's file),
so peak memory is one tensor, never the whole model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from astrai.errors import CheckpointError
from astrai.model.dcp_format import is_dcp, read_metadata, read_tensors

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
}


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor: where it is and what it looks like."""

    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str
    """safetensors dtype string (F32, BF16, ...)."""

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch float dtype, or None for tensors the inspection skips (ints, fp8)."""
        return _DTYPES.get(self.dtype)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def rows(self) -> int:
        """Entries along dim 0 (the output features of a Linear weight, token ids of an
        embedding); a 1-D tensor is `numel` rows of one column."""
        return self.shape[0] if self.shape else 1

    @property
    def cols(self) -> int:
        return self.numel // max(self.rows, 1) if self.rows else 0


@dataclass
class WeightSource:
    """The tensors of one checkpoint, readable slice by slice."""

    path: Path
    """What the user passed."""
    format: str
    """astrai | hf | safetensors"""
    tensors: dict[str, TensorInfo]
    """Name -> info, in natural order (layer 2 before layer 10)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """meta.json of an astrai checkpoint ({} otherwise)."""
    _held: tuple[str, torch.Tensor] | None = None
    """DCP: the one whole tensor last read (its rows are asked for a chunk at a time)."""

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a tensor as a 2-D [rows, cols] tensor in its stored dtype."""
        info = self.tensors[name]
        if info.file.is_dir():  # a DCP directory
            if self._held is None or self._held[0] != name:
                self._held = None  # let the previous tensor go before reading the next
                self._held = (name, read_tensors(info.file, [name])[name])
            t = self._held[1].reshape(1, 1) if not info.shape else self._held[1][start:stop]
            return t.reshape(stop - start if info.shape else 1, info.cols)
        try:
            with safe_open(str(info.file), framework="pt") as fh:
                if len(info.shape) == 0:
                    t = fh.get_tensor(name).reshape(1, 1)
                else:
                    t = fh.get_slice(name)[start:stop]
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"{info.file}: tensor '{name}' is unreadable ({e}); re-export or re-download it"
            ) from None
        return t.reshape(stop - start if info.shape else 1, info.cols)

    def lr_from_meta(self) -> tuple[float | None, str | None]:
        """(learning rate, the meta.json key it came from) or (None, None)."""
        return find_lr(self.meta)


def find_lr(meta: dict[str, Any]) -> tuple[float | None, str | None]:
    """The learning rate in meta.json: top-level `lr` (the rate at that step), then
    `learning_rate`, then the first `lr`, `learning_rate` or `max_lr` in nested sections."""
    for key in ("lr", "learning_rate"):
        v = meta.get(key)
        if _is_rate(v):
            return float(v), key
    stack: list[tuple[str, Any]] = [(k, v) for k, v in meta.items() if isinstance(v, dict)]
    while stack:
        prefix, d = stack.pop(0)
        for key in ("lr", "learning_rate", "max_lr"):
            if _is_rate(d.get(key)):
                return float(d[key]), f"{prefix}.{key}"
        stack.extend((f"{prefix}.{k}", v) for k, v in d.items() if isinstance(v, dict))
    return None, None


def find_muon_lr(meta: dict[str, Any]) -> tuple[float | None, str | None]:
    """(Muon's lr, its meta.json key) when the run trained with Muon, else (None, None).
    Its train config, top level or nested, says so in either form a run saved: flat
    (`optimizer: muon`, `muon_lr`) or nested by section (`optimizer: {name: muon, muon_lr}`)."""
    stack: list[tuple[str, Any]] = [("", meta)]
    while stack:
        prefix, d = stack.pop(0)
        opt = d.get("optimizer")
        if isinstance(opt, dict) and opt.get("name") == "muon" and _is_rate(opt.get("muon_lr")):
            return float(opt["muon_lr"]), f"{prefix}optimizer.muon_lr"
        if opt == "muon" and _is_rate(d.get("muon_lr")):
            return float(d["muon_lr"]), f"{prefix}muon_lr"
        stack.extend((f"{prefix}{k}.", v) for k, v in d.items() if isinstance(v, dict))
    return None, None


def _is_rate(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{index}: not a safetensors index ({e!r}); it needs a 'weight_map' object"
            ) from None
        files = [path / f for f in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{path}: shard(s) listed in {index.name} missing: "
                                  f"{', '.join(missing[:4])}")
        return files
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        bins = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = (f" (found {bins[0]}: astrai reads weights only from safetensors; convert it)"
                if bins else "")
        raise CheckpointError(f"{path}: no .safetensors weights in this directory{hint}")
    return files


def _format(path: Path) -> str:
    cfg = path / "config.json"
    if not cfg.is_file():
        return "safetensors"
    try:
        data = json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg}: line {e.lineno}: invalid JSON ({e.msg})") from None
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        return "hf"
    return "astrai"


def open_source(path: str | Path) -> WeightSource:
    """Index a checkpoint's tensors (headers only; no tensor data is read)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory; pass a checkpoint directory "
                              "or a .safetensors file")
    if not path.is_file() and not path.is_dir():  # a device, FIFO or socket (or a link to one)
        raise CheckpointError(f"{path}: not a regular file or a directory of weights; pass a "
                              "checkpoint directory or a .safetensors file")
    if path.is_dir() and not (path / "model.safetensors").is_file() and is_dcp(path):
        return _dcp_source(path)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path}: not a .safetensors file; pass a checkpoint "
                                  "directory or a .safetensors file")
        files, fmt = [path], "safetensors"
    else:
        files, fmt = _weight_files(path), _format(path)
    tensors: dict[str, TensorInfo] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    sl = fh.get_slice(name)
                    tensors[name] = TensorInfo(name, f, tuple(sl.get_shape()), sl.get_dtype())
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"{f}: not a readable safetensors file ({e}); re-export or re-download it"
            ) from None
    if not tensors:
        raise CheckpointError(f"{path}: the weights file holds no tensors")
    return WeightSource(path, fmt, _natural_order(tensors), _read_meta(path))


_SAFETENSORS_DTYPE = {v: k for k, v in _DTYPES.items()}


def _dcp_source(path: Path) -> WeightSource:
    """The weights of a DCP checkpoint, indexed from its metadata (no tensor data read)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    d = path / "dcp"
    tensors = {}
    for key, m in read_metadata(path).state_dict_metadata.items():
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata):
            name = key[len("model."):]
            dtype = _SAFETENSORS_DTYPE.get(m.properties.dtype, str(m.properties.dtype))
            tensors[name] = TensorInfo(name, d, tuple(m.size), dtype)
    if not tensors:
        raise CheckpointError(f"{d}: the DCP checkpoint holds no model weights")
    return WeightSource(path, "astrai", _natural_order(tensors), _read_meta(path))


def _natural_order(tensors: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    return {k: tensors[k] for k in sorted(tensors, key=_natural)}


def _read_meta(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    meta_file = path / "meta.json" if path.is_dir() else None
    if meta_file is not None and meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{meta_file}: line {e.lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(meta, dict):
            raise CheckpointError(f"{meta_file}: expected a JSON object")
    return meta
