"""Fault test: many streaming clients at once, some of them leaving mid-stream, malformed
requests among them; the rest get exactly what they get alone, the KV pool comes back
whole, and memory does not grow with the number of requests served."""

from __future__ import annotations

import http.client
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import pytest

from astrai.infer import Engine, SamplingParams
from tests.serve.conftest import ServeProcess, wait_until
from tests.serve.test_lifecycle import metrics, next_event

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

N, CONCURRENCY, LEAVERS, MALFORMED, OUT = 200, 64, 30, 20, 12


@pytest.fixture(scope="module")
def busy_server(ckpt, tmp_path_factory):
    log = tmp_path_factory.mktemp("fault") / "err.txt"
    srv = ServeProcess([str(ckpt), "--max-running", "64", "--max-queue", "512",
                        "--max-kv-tokens", "8192"], log)
    yield srv
    srv.stop()


def _conn(srv) -> http.client.HTTPConnection:
    u = urlparse(srv.url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=300)


def _stream(srv, prompt: list[int], leave: bool) -> str | None:
    conn = _conn(srv)
    conn.request("POST", "/v1/completions", body=json.dumps({
        "prompt": prompt, "max_tokens": OUT, "temperature": 0, "ignore_eos": True,
        "stream": True}))
    resp = conn.getresponse()
    assert resp.status == 200
    text = []
    try:
        while (e := next_event(resp)) != "[DONE]":
            text.append(json.loads(e)["choices"][0]["text"])
            if leave and len(text) == 2:
                conn.sock.close()  # gone mid-stream
                return None
        return "".join(text)
    finally:
        conn.close()


MALFORMED_BODIES = [b"{", b"[]", b'{"prompt": []}', b'{"prompt": "x", "n": 0}',
                    b'{"prompt": "x", "temperature": -1}', b'{"prompt": "x", "top_p": 7}',
                    b'{"prompt": [1, 100000]}', b'{"prompt": "x", "best_of": 3}',
                    b'{"prompt": "x", "max_tokens": -2}', b'{"prompt": "x", "stop": 5}']


def _malformed(srv, k: int) -> tuple[int, dict]:
    conn = _conn(srv)
    conn.request("POST", "/v1/completions", body=MALFORMED_BODIES[k % len(MALFORMED_BODIES)])
    resp = conn.getresponse()
    status, body = resp.status, json.loads(resp.read())
    conn.close()
    return status, body


def test_disconnects_and_garbage_under_load(busy_server, ckpt):
    srv = busy_server
    prompts = [[(7 * i + j) % 400 + 3 for j in range(4 + i % 17)] for i in range(N)]
    leave = set(range(0, N, N // LEAVERS)[:LEAVERS])
    engine = Engine.from_checkpoint(ckpt, device="cpu")
    alone = [o.text for o in engine.generate(
        [p for i, p in enumerate(prompts) if i not in leave],
        SamplingParams.greedy(OUT, ignore_eos=True))]
    total = metrics(srv)["astrai:kv_pages_total"]
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        streams = [pool.submit(_stream, srv, p, i in leave) for i, p in enumerate(prompts)]
        bad = [pool.submit(_malformed, srv, k) for k in range(MALFORMED)]
        got = [f.result() for f in streams]
        errors = [f.result() for f in bad]
    assert [g for i, g in enumerate(got) if i not in leave] == alone
    for status, body in errors:
        assert 400 <= status < 500 and set(body["error"]) == {"message", "type", "param", "code"}
    def settled():
        m = metrics(srv)
        return m if m["astrai:num_requests_in_flight"] == 0 else None

    m = wait_until(settled, what="every request to leave the engine")
    assert m["astrai:kv_pages_free"] == total
    assert srv.get("/health")[0] == 200
    assert "Traceback" not in srv.log.read_text()


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc")
def test_memory_does_not_grow_with_requests(busy_server):
    srv = busy_server

    def one(i: int) -> None:
        conn = _conn(srv)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": 2}))
        assert conn.getresponse().status == 200
        conn.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(100)))
        after_100 = _rss_kb(srv.proc.pid)
        list(pool.map(one, range(100, 1000)))
        after_1000 = _rss_kb(srv.proc.pid)
    assert after_1000 <= 1.1 * after_100, (after_100, after_1000)
