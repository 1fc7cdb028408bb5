"""A streaming client that never reads, against a real `astrai serve`: its requests are
aborted once it falls MAX_BACKLOG_STEPS behind (their KV pages freed while it is still
connected), the server's memory stays bounded, a concurrent small request keeps being
answered, and one request cannot ask for more tokens than the KV pool holds.

The server runs with its address space capped (RLIMIT_AS), so that a server that queues
without bound fails the test rather than the host."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from tests.serve.conftest import API_KEY, ServeProcess, wait_until
from tests.serve.test_abuse import LIVENESS_BOUND_S, post, refused
from tests.serve.test_lifecycle import metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

KV_TOKENS = 65_536
N, MAX_TOKENS = 64, 1000
"""64 x 1000 = 64,000 tokens: within the pool; the stream's chunks (20 top log-probabilities
each) come to ~100 MB, most of which the server would queue for a client that never reads."""
RSS_GROWTH_BOUND = 600 << 20
"""The server's resident memory may grow this much while the unread stream runs (measured
with the bound: ~100 MiB; without it the queued outputs took GBs)."""


@pytest.fixture(scope="module")
def srv(ckpt, tmp_path_factory):
    log = tmp_path_factory.mktemp("backpressure") / "err.txt"
    s = ServeProcess([str(ckpt), "--api-key", API_KEY, "--max-kv-tokens", str(KV_TOKENS),
                      "--max-running", "80"], log, limit_as=6 << 30)
    yield s
    s.stop()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_unread_stream(srv) -> socket.socket:
    """Send a streaming request on a socket with a tiny receive buffer, and never read."""
    u = urlparse(srv.url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((u.hostname, u.port))
    body = json.dumps({"prompt": [1, 2, 3], "n": N, "logprobs": 20, "max_tokens": MAX_TOKENS,
                       "ignore_eos": True, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def read_until(sock: socket.socket, marker: bytes, timeout: float = 60) -> bytes:
    """What the server sent, read until `marker` shows (the tail kept small)."""
    sock.settimeout(timeout)
    tail = b""
    while marker not in tail:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        tail = (tail + chunk)[-4096:]
    return tail


def test_a_client_that_never_reads_is_aborted_and_others_go_on(srv):
    pid = srv.proc.pid
    base = rss(pid)
    total = metrics(srv)["astrai:kv_pages_total"]
    sock = open_unread_stream(srv)
    try:
        slowest, peak, victims = 0.0, base, 0
        end = time.monotonic() + 60

        def aborted() -> dict | None:
            m = metrics(srv)
            return m if m.get("vllm:request_success_total{finished_reason=abort}", 0) >= N \
                and m["astrai:num_requests_in_flight"] == 0 else None

        while (m := aborted()) is None:
            assert time.monotonic() < end, "the unread stream was never aborted"
            t0 = time.monotonic()
            assert post(srv, {"prompt": [1, 2], "max_tokens": 1, "ignore_eos": True},
                        timeout=60)[0] == 200
            victims += 1
            slowest = max(slowest, time.monotonic() - t0)
            peak = max(peak, rss(pid))
        # aborted while the client is still connected, before the requests could end
        assert m["astrai:kv_pages_free"] == total
        assert m.get("vllm:request_success_total{finished_reason=length}", 0) == victims
        assert m["vllm:generation_tokens_total"] < N * MAX_TOKENS / 2
        assert slowest < LIVENESS_BOUND_S, slowest
        assert peak - base < RSS_GROWTH_BOUND, (base, peak)
        assert b"client_too_slow" in read_until(sock, b"client_too_slow")
    finally:
        sock.close()
    wait_until(lambda: srv.get("/health")[0] == 200, timeout=30, what="/health")
    assert post(srv, {"prompt": [1, 2], "max_tokens": 1})[0] == 200


def test_more_tokens_than_the_pool_is_a_400_naming_max_tokens(srv):
    # 64 prompts x n 2 x 600 = 76,800 tokens > the pool's 65,536
    status, body = post(srv, {"prompt": [[1, 2]] * 64, "n": 2, "max_tokens": 600})
    assert refused(status, body, "max_tokens") and str(KV_TOKENS) in body["error"]["message"]
    # an absent max_tokens counts the context left: 2 x 64 x (1024 - 2) is over the pool
    status, body = post(srv, {"prompt": [[1, 2]] * 2, "n": 64})
    assert refused(status, body, "max_tokens"), body
    assert post(srv, {"prompt": [[1, 2]] * 2, "n": 64, "max_tokens": 1})[0] == 200
