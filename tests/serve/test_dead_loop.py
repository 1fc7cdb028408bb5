"""A dead engine loop never leaves a client waiting: when the loop thread dies, the request
it was running, the ones queued behind it and every later one get a 503 at once, and
/health says the loop has stopped."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from astrai.serve.loop import EngineLoop, EngineStopped

from .conftest import wait_until


class Fatal(BaseException):
    """What no step catches (as MemoryError or a C extension's abort would be)."""


class StubEngine:
    """Steps block until released, then the step raises Fatal."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.added: list[str] = []

    def add_request(self, ids, params, request_id, lora=None) -> None:
        self.added.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.added)

    def abort(self, rid: str) -> None:
        pass

    def step(self):
        self.release.wait(60)
        raise Fatal("the step died")


def test_the_loop_fails_held_queued_and_new_requests_once_it_dies():
    eng = StubEngine()
    loop = EngineLoop(eng, max_in_flight=8)
    got: dict[str, list] = {"held": [], "queued": []}
    loop.submit([("held", [1], None)], got["held"].append)
    loop.start()
    wait_until(lambda: eng.added, what="the first request to be stepped")
    loop.submit([("queued", [2], None)], got["queued"].append)  # behind the blocked step
    eng.release.set()
    wait_until(lambda: got["held"] and got["queued"], timeout=10, what="both failures")
    assert all(isinstance(v[0], EngineStopped) and "the step died" in str(v[0])
               for v in got.values())
    assert not loop.alive()
    with pytest.raises(EngineStopped, match="engine loop has stopped"):
        loop.submit([("new", [3], None)], got["held"].append)


def request(url: str, timeout: float = 30) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    req = urllib.request.Request(url + "/v1/completions", json.dumps(
        {"prompt": "hi", "max_tokens": 4}).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), time.monotonic() - t0


def test_a_server_whose_loop_died_answers_503_at_once(ckpt):
    from astrai.serve import ServeConfig
    from astrai.serve.server import Server

    server = Server.from_config(ServeConfig(str(ckpt), port=0, device="cpu")).start()
    release = threading.Event()

    def step():
        release.wait(60)
        raise Fatal("the step died")

    server.engine.step = step
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(request, server.url)
            wait_until(lambda: server.loop.in_flight == 1, timeout=30, what="held")
            queued = pool.submit(request, server.url)
            wait_until(lambda: server.loop.in_flight == 2, timeout=30, what="queued")
            release.set()
            outcomes = [held.result(), queued.result(), request(server.url)]
        for status, body, seconds in outcomes:
            assert status == 503 and body["error"]["code"] == "engine_stopped", body
            assert "the step died" in body["error"]["message"] and seconds < 20
        assert _status(server.url + "/health") == 503
    finally:
        release.set()
        server.stop()


def _status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_failing_abort_does_not_stop_the_loop():
    """A client's disconnect aborts its request; should that abort raise, the loop goes on
    serving the others."""

    class AbortFails(StubEngine):
        def abort(self, rid: str) -> None:
            raise ValueError("list.remove(x): x not in list")

        def has_unfinished(self) -> bool:
            return False

    eng = AbortFails()
    loop = EngineLoop(eng, max_in_flight=8)
    loop.start()
    try:
        loop.abort(["gone"])
        loop.submit([("next", [1], None)], lambda item: None)
        wait_until(lambda: eng.added == ["next"], timeout=10, what="the next request")
        assert loop.alive()
    finally:
        loop.stop(10)
