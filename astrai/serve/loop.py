"""EngineLoop: one thread owns the Engine; HTTP handlers talk to it through a queue.

Every connection's requests join the same continuous batch: handlers `submit` (prompt ids,
params, a delivery callback) and `abort`; the loop thread adds and aborts requests between
steps, steps while there is work and hands each RequestOutput to its request's callback.
Nothing else calls the engine while the loop runs, so a handler never waits for a step.

Admission is bounded (vLLM's `--max-num-seqs` running, plus a waiting queue): at most
`max_running + max_queue` engine requests are in flight; one more is refused at once
(`QueueFull`, the server's 503) rather than waiting unboundedly.

A loop thread that dies (an error no step catches) never leaves a request waiting on
it: every request it held and every command still queued get `EngineStopped`, and so
does every later `submit`, at once (the server's 503, and /health says so).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from astrai.infer.params import SamplingParams
from astrai.infer.request import RequestOutput

log = logging.getLogger("astrai.serve")
Deliver = Callable[[RequestOutput | BaseException], None]


class QueueFull(Exception):
    """The server holds max_running + max_queue requests already."""


class EngineStopped(Exception):
    """The engine loop has stopped: nothing more will be served."""


class EngineLoop:
    def __init__(self, engine: Any, *, max_in_flight: int,
                 on_finish: Callable[[RequestOutput], None] | None = None,
                 post: Callable[[Callable[[], None]], Any] | None = None) -> None:
        """`post(fn)`: run fn on the consumers' thread (an asyncio loop's
        call_soon_threadsafe); every delivery of one step goes in one call, so a step with
        64 running requests wakes the event loop once, not 64 times. None: deliver from
        the loop thread directly."""
        self.engine = engine
        self.max_in_flight = max_in_flight
        self.on_finish = on_finish
        self.post = post
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Deliver] = {}
        self._count_lock = threading.Lock()
        self._in_flight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="astrai-engine", daemon=True)
        self.error: BaseException | None = None
        """What killed the loop thread, if anything (then /health fails)."""

    # -- handler side (any thread) ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(self, items: list[tuple[str, list[int], SamplingParams]], deliver: Deliver,
               lora: str | None = None) -> None:
        """Queue engine requests (all or none) under LoRA adapter `lora` (None: the base);
        raises QueueFull when over the bound."""
        with self._count_lock:  # the loop dies under this lock: nothing is queued after
            if self.error is not None:
                raise EngineStopped(self._why())
            if self._in_flight + len(items) > self.max_in_flight:
                raise QueueFull
            self._in_flight += len(items)
            self._cmds.put(("add", (items, lora), deliver))

    def abort(self, request_ids: list[str]) -> None:
        """Cancel requests (a client went away): their KV pages are freed at the next turn."""
        self._cmds.put(("abort", request_ids, None))

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._cmds.put(("wake", None, None))
        self._thread.join(timeout)

    # -- loop thread -----------------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop.is_set():
                busy = eng.has_unfinished()
                try:  # idle: block until a command comes; busy: take what is there
                    cmd = self._cmds.get(block=not busy, timeout=None)
                except queue.Empty:
                    cmd = None
                while cmd is not None:
                    self._command(*cmd)
                    try:
                        cmd = self._cmds.get_nowait()
                    except queue.Empty:
                        cmd = None
                if eng.has_unfinished():
                    self._step()
        except BaseException as e:  # the loop is dead: say so to everyone
            log.exception("the engine loop stopped")
            self._die(e)

    def _why(self) -> str:
        e = self.error
        return f"the engine loop has stopped ({type(e).__name__}: {e}); restart the server"

    def _die(self, error: BaseException) -> None:
        """Fail every request held and every command still queued; refuse new ones."""
        with self._count_lock:
            self.error = error
            sinks = set(self._sinks.values())
            while True:
                try:
                    op, _, deliver = self._cmds.get_nowait()
                except queue.Empty:
                    break
                if op == "add":
                    sinks.add(deliver)
        stopped = EngineStopped(self._why())
        self._send([(d, stopped) for d in sinks])

    def _command(self, op: str, arg: Any, deliver: Deliver | None) -> None:
        try:
            self._apply(op, arg, deliver)
        except Exception:  # a command that fails must not stop the loop
            log.exception("engine loop command %r failed", op)

    def _apply(self, op: str, arg: Any, deliver: Deliver | None) -> None:
        if op == "add":
            added: list[str] = []
            arg, lora = arg
            try:
                for rid, ids, params in arg:
                    self.engine.add_request(ids, params, request_id=rid, lora=lora)
                    self._sinks[rid] = deliver
                    added.append(rid)
            except Exception as e:  # noqa: BLE001 -- a bad request fails alone; siblings withdrawn
                for rid in added:
                    self.engine.abort(rid)
                self._release(len(arg) - len(added))
                self._send([(deliver, e)])
        elif op == "abort":
            for rid in arg:
                self.engine.abort(rid)

    def _step(self) -> None:
        try:
            outs = self.engine.step()
        except Exception:  # noqa: BLE001 - the engine failed that step's requests only: their
            log.exception("engine step failed")  # error outputs come with the next step
            return
        batch = []
        for out in outs:
            deliver = self._sinks.get(out.request_id)
            if out.finished:
                self._sinks.pop(out.request_id, None)
                self._release(1)
                if self.on_finish is not None:
                    self.on_finish(out)
            if deliver is not None:
                batch.append((deliver, out))
        self._send(batch)

    def _send(self, batch: list[tuple[Deliver, Any]]) -> None:
        if not batch:
            return
        if self.post is None:
            for deliver, item in batch:
                deliver(item)
            return

        def run() -> None:
            for deliver, item in batch:
                deliver(item)

        self.post(run)

    def _release(self, k: int) -> None:
        with self._count_lock:
            self._in_flight -= k
