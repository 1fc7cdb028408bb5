"""Packing documents into fixed-capacity rows, and the per-token arrays of a packed row.

Pure functions over lengths (tested against hand cases and a naive search); `Packer` runs
them over a stream with a bounded buffer so memory stays flat on any input size.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

IGNORE = -100


def split_spans(length: int, capacity: int) -> list[tuple[int, int]]:
    """bfd_split: cut a document into [start, end) pieces of at most `capacity` tokens."""
    return [(s, min(s + capacity, length)) for s in range(0, length, capacity)]


def truncate_span(length: int, limit: int, side: str) -> tuple[int, int]:
    """The [start, end) kept when a document of `length` is cut to `limit` tokens."""
    if length <= limit:
        return 0, length
    return (length - limit, length) if side == "left" else (0, limit)


def pack_simple(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Sequential fill: add documents in order; start a new row when one does not fit."""
    rows: list[list[int]] = []
    used = capacity + 1
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ValueError(f"document {i} has {n} tokens > capacity {capacity}")
        if used + n > capacity:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def pack_bfd(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: longest first, each into the open row it fills most tightly.

    Rows come out in the order they were opened; ties keep input order (stable sort), so the
    result is deterministic.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (remaining capacity, row index)
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"document {i} has {n} tokens > capacity {capacity}")
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            rem, r = free.pop(k)
        else:
            rows.append([])
            rem, r = capacity, len(rows) - 1
        rows[r].append(i)
        if rem - n > 0:
            bisect.insort(free, (rem - n, r))
    return rows


Span = tuple[int, int, int]  # (document index, start, end)


def pack_bfd_split(lengths: Sequence[int], capacity: int, min_piece: int = 32
                   ) -> list[list[Span]]:
    """bfd_split: documents longer than `capacity` are cut into full rows; the rest are packed
    best-fit decreasing; then the emptiest rows are dissolved into the others' gaps, cutting
    a document where it does not fit whole. A cut never leaves a piece shorter than
    `min_piece` in a gap, so few documents are cut. Rows are lists of (doc, start, end).
    """
    rows: list[list[Span]] = []
    rest: list[Span] = []
    for i, n in enumerate(lengths):
        full = n // capacity if n > capacity else 0
        rows += [[(i, k * capacity, (k + 1) * capacity)] for k in range(full)]
        if n - full * capacity > 0:
            rest.append((i, full * capacity, n))
    packed = pack_bfd([e - s for _, s, e in rest], capacity)
    bins = [[rest[j] for j in idx] for idx in packed]
    free = sorted((capacity - sum(e - s for _, s, e in b), r) for r, b in enumerate(bins))
    free = [f for f in free if f[0] > 0]  # (gap, row), ascending; full rows never change
    dissolved: set[int] = set()
    while len(free) > 1:
        gap, r = free[-1]  # the emptiest row
        k = bisect.bisect_left(free, (min_piece, -1), hi=len(free) - 1)
        if capacity - gap > sum(g for g, _ in free[k:-1]):
            break  # its tokens do not fit in the others' usable gaps
        free.pop()
        dissolved.add(r)
        for doc, start, end in sorted(bins[r], key=lambda sp: sp[1] - sp[2]):
            while start < end:
                n = end - start
                k = bisect.bisect_left(free, (n, -1))
                if k < len(free):  # best fit: the tightest gap it fits in whole
                    g, b = free.pop(k)
                    take = n
                else:  # cut: fill the roomiest gap, leaving at least min_piece behind
                    g, b = free.pop()
                    take = min(g, n - min_piece) if n > 2 * min_piece else min(g, n)
                bins[b].append((doc, start, start + take))
                start += take
                if g - take > 0:
                    bisect.insort(free, (g - take, b))
    return rows + [b for r, b in enumerate(bins) if r not in dissolved]


def doc_ids(doc_lens: Sequence[int]) -> np.ndarray:
    """[T] index of the document each token of a packed row belongs to."""
    return np.repeat(np.arange(len(doc_lens), dtype=np.int64), np.asarray(doc_lens, np.int64))


def position_ids(doc_lens: Sequence[int], mode: str) -> np.ndarray | None:
    """[T] positions: doc_reset restarts at 0 per document; continuous counts 0..T-1."""
    lens = np.asarray(doc_lens, dtype=np.int64)
    total = int(lens.sum())
    if mode == "none":
        return None
    if mode == "continuous":
        return np.arange(total, dtype=np.int64)
    starts = np.repeat(np.cumsum(lens) - lens, lens)  # first index of each token's document
    return np.arange(total, dtype=np.int64) - starts


def shifted_targets(tokens: np.ndarray, doc_lens: Sequence[int],
                    loss_mask: np.ndarray | None = None) -> np.ndarray:
    """[T] next-token targets: tokens[i+1], or -100 at a document's last token and where
    the next token is masked (loss_mask[i+1] == 0). Targets never cross documents."""
    tokens = np.asarray(tokens, dtype=np.int64)
    tgt = np.full(tokens.shape, IGNORE, dtype=np.int64)
    tgt[:-1] = tokens[1:]
    ends = np.cumsum(np.asarray(doc_lens, dtype=np.int64)) - 1
    tgt[ends[ends >= 0]] = IGNORE
    if loss_mask is not None:
        keep = np.zeros(tokens.shape, dtype=bool)
        keep[:-1] = np.asarray(loss_mask[1:], dtype=bool)
        tgt[~keep] = IGNORE
    return tgt


class Packer:
    """Streams documents into rows: `add(doc) -> rows ready`, `finish() -> the rest`.

    A document is a dict of equal-length 1-D arrays (tokens, optional loss mask); a row is
    the same dict concatenated plus `doc_lens`. `mode` none puts each document in its own row.
    """

    def __init__(self, mode: str, capacity: int, buffer: int = 2048, min_piece: int = 32
                 ) -> None:
        self.mode, self.capacity, self.buffer, self.min_piece = mode, capacity, buffer, min_piece
        self._docs: list[dict[str, np.ndarray]] = []
        self._used = 0

    @staticmethod
    def _row(docs: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        row = {k: np.concatenate([d[k] for d in docs]) for k in docs[0]}
        row["doc_lens"] = np.array([len(d["input_ids"]) for d in docs], dtype=np.int32)
        return row

    def add(self, doc: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:
        n = len(doc["input_ids"])
        if self.mode == "none":
            yield self._row([doc])
        elif self.mode == "simple":
            if self._docs and self._used + n > self.capacity:
                yield self._row(self._docs)
                self._docs, self._used = [], 0
            self._docs.append(doc)
            self._used += n
        else:
            self._docs.append(doc)
            if len(self._docs) >= self.buffer:
                yield from self._flush_bfd()

    def _flush_bfd(self) -> Iterator[dict[str, Any]]:
        docs, self._docs = self._docs, []
        lens = [len(d["input_ids"]) for d in docs]
        if self.mode == "bfd":
            for idx in pack_bfd(lens, self.capacity):
                yield self._row([docs[i] for i in idx])
            return
        for spans in pack_bfd_split(lens, self.capacity, self.min_piece):
            yield self._row([{k: v[s:e] for k, v in docs[i].items()} for i, s, e in spans])

    def finish(self) -> Iterator[dict[str, Any]]:
        if self.mode in ("bfd", "bfd_split"):
            yield from self._flush_bfd()
        elif self._docs:
            yield self._row(self._docs)
            self._docs, self._used = [], 0
