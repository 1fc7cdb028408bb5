"""Stream routing: each `Engine.generate` call reads its own requests' outputs.

A generate call owns a queue; every output of its requests is put there as the step that
made it ends, whichever thread ran that step. A reader with nothing queued runs the next
step itself (under the engine's lock), so several threads may each iterate their own
stream and the engine needs no thread of its own.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Protocol

from astrai.infer.request import RequestOutput

Sink = queue.SimpleQueue
"""Where one generate call's outputs wait for its reader."""


class Driver(Protocol):
    """What a stream needs of the engine to make progress."""

    lock: threading.RLock

    def step(self) -> list[RequestOutput]: ...

    def has_unfinished(self) -> bool: ...

    def abort(self, request_id: str) -> bool: ...


class Streams:
    def __init__(self) -> None:
        self._sinks: dict[str, Sink] = {}

    def attach(self, request_id: str, sink: Sink) -> None:
        """Send `request_id`'s outputs to `sink` from now on."""
        self._sinks[request_id] = sink

    def route(self, out: RequestOutput) -> None:
        """Deliver an output to its stream, if it has one (the last one detaches it)."""
        rid = out.request_id
        sink = self._sinks.pop(rid, None) if out.finished else self._sinks.get(rid)
        if sink is not None:
            sink.put(out)


def drain(engine: Driver, request_ids: list[str], sink: Sink) -> Iterator[RequestOutput]:
    """Yield the outputs of `request_ids` as they come, stepping the engine whenever none
    is waiting; closing the iterator early aborts the requests still unfinished."""
    remaining = set(request_ids)
    try:
        while remaining:
            try:
                out = sink.get_nowait()
            except queue.Empty:
                with engine.lock:
                    if sink.empty():  # another thread's step may have filled it meanwhile
                        if not engine.has_unfinished():
                            raise RuntimeError(f"requests {sorted(remaining)} were lost")
                        engine.step()
                continue
            if out.finished:
                remaining.discard(out.request_id)
            yield out
    finally:
        for rid in remaining:
            engine.abort(rid)
