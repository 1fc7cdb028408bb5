"""Input units -> chunks of records -> encoded results, in order, on one or many processes.

Chunks are cut from the input in a fixed way (by size and line count, never by timing) and
their results come back in submission order, so the dataset does not depend on the number
of workers. At most `2 * workers` chunks are in flight: memory stays bounded.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

from astrai.config.preprocess import PreprocessSpec
from astrai.data.encode import RecordEncoder
from astrai.data.sources import Unit, iter_unit
from astrai.data.tokenizer import Tokenizer

CHUNK_BYTES = 1 << 19  # raw JSONL bytes per encode_batch call (bounds memory per chunk)
CHUNK_LINES = 4096

Chunk = list[tuple[str, int | str, bytes | dict]]


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def iter_chunks(units: Sequence[Unit], spec: PreprocessSpec, limit: int | None
                ) -> Iterator[tuple[Chunk, int]]:
    """(chunk of (file, position, raw line or record), input bytes read so far). JSONL
    lines stay undecoded: the encoders decode them, so a line that is not UTF-8 is one bad
    record (skipped and counted under --on-error skip), not the whole file."""
    chunk: Chunk = []
    size = read = before = 0
    pos = 0
    for unit in units:
        name = str(unit.path)
        for n, item, pos in iter_unit(unit, spec):
            if limit is not None and read >= limit:
                break
            chunk.append((name, n, item))
            size += len(item) if isinstance(item, bytes) else 256
            read += 1
            if size >= CHUNK_BYTES or len(chunk) >= CHUNK_LINES:
                yield chunk, before + pos
                chunk, size = [], 0
        before += unit.size
    if chunk:
        yield chunk, before


_WORKER: RecordEncoder | None = None  # per-process state of a pool worker, set once


def _worker_init(spec_json: str, tok_dir: str) -> None:
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool is the parallelism
    _WORKER = RecordEncoder(PreprocessSpec.model_validate_json(spec_json), Tokenizer.load(tok_dir))


def _worker_encode(lines: Chunk) -> list[tuple]:
    assert _WORKER is not None
    return _WORKER.encode_lines(lines)


class Encoders:
    """In-process encoding, or a process pool with a bounded number of chunks in flight."""

    def __init__(self, spec: PreprocessSpec, tok: Tokenizer, tok_dir: Path, workers: int):
        self.pool = None
        self.local = RecordEncoder(spec, tok) if workers <= 1 else None
        if workers > 1:
            import multiprocessing as mp

            ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self.pool = ctx.Pool(workers, _worker_init, (spec.model_dump_json(), str(tok_dir)))
            self.depth = 2 * workers

    def map(self, chunks: Iterator[tuple[Chunk, int]]) -> Iterator[tuple[list[tuple], int]]:
        """(results, input bytes read) per chunk, in input order."""
        if self.pool is None:
            # One chunk encodes in a thread while the caller packs and writes the previous
            # one: the Rust encoder releases the GIL, so packing no longer idles the cores.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as ex:
                ahead: deque = deque()
                for c, pos in chunks:
                    ahead.append((ex.submit(self.local.encode_lines, c), pos))  # type: ignore[union-attr]
                    if len(ahead) >= 2:
                        f, p = ahead.popleft()
                        yield f.result(), p
                while ahead:
                    f, p = ahead.popleft()
                    yield f.result(), p
            return
        pending: deque = deque()
        for c, pos in chunks:
            pending.append((self.pool.apply_async(_worker_encode, (c,)), pos))
            if len(pending) >= self.depth:
                r, p = pending.popleft()
                yield r.get(), p
        while pending:
            r, p = pending.popleft()
            yield r.get(), p

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
