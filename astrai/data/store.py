"""Shard storage: each key is a ragged array (one 1-D array per sample).

* h5  -> `shard_00000.h5`: per key a flat chunked dataset `<key>` and `<key>.offsets`
  (int64, n+1). `H5Store` reads a shard into memory, optionally into shared memory so
  DataLoader workers share one copy (docs/formats.md).
* bin -> `shard_00000/<key>.bin` (raw values) + `<key>.idx` (raw int64 offsets, n+1).
  `MmapStore` maps them with np.memmap: zero copy, shared through the OS page cache.

Dtypes live in manifest.json; both stores return identical arrays for the same sample.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from astrai.diskfull import DiskFullError, full_message, is_disk_full
from astrai.errors import DataError

_FLUSH_VALUES = 1 << 20  # buffered values per key before an append to disk


class _WriteGuard:
    """The shard file as HDF5 sees it (h5py's file-object driver): a write that fails for a
    full disk is recorded and reported to HDF5 as done, so the library finishes and closes
    cleanly — after a failed write of its own, HDF5 crashes the process (SIGSEGV) when it
    frees its objects — and `ShardWriter.close` raises DiskFullError."""

    def __init__(self, f) -> None:
        self.f, self.error = f, None

    def write(self, b) -> int:
        if self.error is None:
            try:
                return self.f.write(b)
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.error = e
        return len(memoryview(b))

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def readinto(self, b) -> int:
        return self.f.readinto(b)

    def seek(self, *args) -> int:
        return self.f.seek(*args)

    def tell(self) -> int:
        return self.f.tell()

    def truncate(self, n: int | None = None) -> int:
        try:
            return self.f.truncate(n)
        except OSError as e:
            if not is_disk_full(e):
                raise
            self.error = self.error or e
            return n or 0

    def flush(self) -> None:
        if self.error is None:
            try:
                self.f.flush()
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.error = e


class ShardWriter:
    """Append samples (dict key -> 1-D array) to one shard file (h5) or directory (bin)."""

    def __init__(self, path: Path, fmt: str, dtypes: dict[str, str]) -> None:
        self.path, self.fmt, self.dtypes = Path(path), fmt, dict(dtypes)
        self.n = 0
        self._buf: dict[str, list[np.ndarray]] = {k: [] for k in dtypes}
        self._buffered = 0
        self._offsets: dict[str, list[int]] = {k: [0] for k in dtypes}
        if fmt == "h5":
            self._raw = open(self.path, "w+b")  # noqa: SIM115 - closed by close()
            self._guard = _WriteGuard(self._raw)
            self._h5 = h5py.File(self._guard, "w")
            for k, dt in dtypes.items():
                self._h5.create_dataset(k, shape=(0,), maxshape=(None,), dtype=dt,
                                        chunks=(1 << 16,))
        else:
            self.path.mkdir(parents=True)
            # kept open across add() calls; close() closes them
            self._files = {k: open(self.path / f"{k}.bin", "wb")  # noqa: SIM115
                           for k in dtypes}

    def add(self, sample: dict[str, np.ndarray]) -> None:
        for k, dt in self.dtypes.items():
            a = np.ascontiguousarray(sample[k], dtype=dt).reshape(-1)
            self._buf[k].append(a)
            self._offsets[k].append(self._offsets[k][-1] + a.size)
            self._buffered += a.size
        self.n += 1
        if self._buffered >= _FLUSH_VALUES:
            self._flush()

    def _flush(self) -> None:
        for k, parts in self._buf.items():
            if not parts:
                continue
            flat = np.concatenate(parts)
            if self.fmt == "h5":
                ds = self._h5[k]
                start = ds.shape[0]
                ds.resize((start + flat.size,))
                ds[start:] = flat
                if self._guard.error is not None:  # stop before HDF5 reads what it lost
                    self._abort()
                    raise DiskFullError(full_message(self.path))
            else:
                self._files[k].write(flat.tobytes())
            self._buf[k] = []
        self._buffered = 0

    def _abort(self) -> None:
        """Close the HDF5 file after a lost write (its writes go nowhere from now on): left
        open, HDF5 would crash the interpreter freeing it at exit."""
        try:
            self._h5.close()
        except Exception:  # noqa: BLE001, S110 - the shard is discarded either way
            pass
        try:
            self._raw.close()
        except OSError:
            pass

    def close(self) -> None:
        self._flush()
        for k, offs in self._offsets.items():
            arr = np.asarray(offs, dtype=np.int64)
            if self.fmt == "h5":
                self._h5.create_dataset(f"{k}.offsets", data=arr)
            else:
                arr.tofile(self.path / f"{k}.idx")
        if self.fmt == "h5":
            self._h5.close()
            try:
                self._raw.close()
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self._guard.error = self._guard.error or e
            if self._guard.error is not None:
                raise DiskFullError(full_message(self.path))
        else:
            for f in self._files.values():
                f.close()


class H5Store:
    """One .h5 shard read into memory (optionally shared memory for loader workers)."""

    def __init__(self, path: str | Path, keys: Sequence[str], shared: bool = False) -> None:
        self.path = Path(path)
        self._data: dict[str, np.ndarray] = {}
        self._offs: dict[str, np.ndarray] = {}
        try:
            with h5py.File(self.path, "r") as f:
                for k in keys:
                    self._data[k] = f[k][()]
                    self._offs[k] = f[f"{k}.offsets"][()]
        except (OSError, KeyError) as e:
            raise DataError(f"{self.path}: cannot read shard ({e}); rebuild the dataset") from e
        if shared:
            self._share()
        self.n = len(next(iter(self._offs.values()))) - 1 if self._offs else 0

    def _share(self) -> None:
        import torch  # only the shared-memory path needs torch

        for d in (self._data, self._offs):
            for k, a in d.items():
                if a.size and a.dtype != np.uint16:  # torch has no uint16 shared storage
                    d[k] = torch.from_numpy(a).share_memory_().numpy()
                elif a.size:
                    t = torch.from_numpy(a.view(np.int16)).share_memory_()
                    d[k] = t.numpy().view(np.uint16)

    def __len__(self) -> int:
        return self.n

    def get(self, key: str, i: int) -> np.ndarray:
        o = self._offs[key]
        return self._data[key][o[i]:o[i + 1]]


class MmapStore:
    """One bin shard directory, memory-mapped (zero copy)."""

    def __init__(self, path: str | Path, dtypes: dict[str, str]) -> None:
        self.path = Path(path)
        self._data: dict[str, np.ndarray] = {}
        self._offs: dict[str, np.ndarray] = {}
        for k, dt in dtypes.items():
            data, idx = self.path / f"{k}.bin", self.path / f"{k}.idx"
            if not data.is_file() or not idx.is_file():
                raise DataError(f"{self.path}: missing {data.name} or {idx.name}; "
                                "rebuild the dataset")
            self._offs[k] = np.fromfile(idx, dtype=np.int64)
            # np.memmap refuses empty files; an empty key is an empty array
            self._data[k] = (np.memmap(data, dtype=dt, mode="r") if data.stat().st_size
                             else np.zeros(0, dtype=dt))
        self.n = len(next(iter(self._offs.values()))) - 1 if self._offs else 0

    def __len__(self) -> int:
        return self.n

    def get(self, key: str, i: int) -> np.ndarray:
        o = self._offs[key]
        return self._data[key][o[i]:o[i + 1]]


class ShardedStore:
    """Shards seen as one sequence of samples."""

    def __init__(self, shards: Sequence[H5Store | MmapStore]) -> None:
        self.shards = list(shards)
        self._ends = np.cumsum([len(s) for s in self.shards]).tolist()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def get(self, key: str, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range (0..{len(self) - 1})")
        s = bisect.bisect_right(self._ends, i)
        start = self._ends[s - 1] if s else 0
        return self.shards[s].get(key, i - start)
