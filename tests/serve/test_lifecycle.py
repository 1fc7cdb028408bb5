"""Connections come and go: a client that disconnects frees its KV pages at once, a full
server answers 503, /metrics parses as Prometheus text, SIGTERM drains and exits 0."""

from __future__ import annotations

import http.client
import json
import signal
import urllib.request
from urllib.parse import urlparse

import pytest

from tests.serve.conftest import API_KEY, ServeProcess, wait_until

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def open_stream(server, body: dict, path: str = "/v1/completions"):
    u = urlparse(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", path, body=json.dumps({**body, "stream": True}),
                 headers={"Authorization": f"Bearer {API_KEY}",
                          "Content-Type": "application/json"})
    return conn, conn.getresponse()


def next_event(resp) -> str:
    """The data of the next server-sent event."""
    while True:
        line = resp.readline().decode()
        if not line:
            raise EOFError("the stream ended")
        if line.startswith("data: "):
            return line[6:].strip()


def metrics(server) -> dict[str, float]:
    """{'name{labels}': value} of the exposition, parsed by prometheus_client."""
    parser = pytest.importorskip("prometheus_client.parser")
    status, text = server.get("/metrics")
    assert status == 200
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                             if k != "model_name")
            out[s.name + (f"{{{extra}}}" if extra else "")] = s.value
    return out


def test_metrics_parse_with_vllm_names(server, client):
    client.completions.create(model="tiny", prompt="Once", max_tokens=3)
    m = metrics(server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_bucket{le=+Inf}",
                 "vllm:e2e_request_latency_seconds_sum"):
        assert name in m, name
    assert m["vllm:generation_tokens_total"] >= 3
    assert m["vllm:time_to_first_token_seconds_count"] >= 1
    assert m["vllm:time_to_first_token_seconds_bucket{le=+Inf}"] == \
        m["vllm:time_to_first_token_seconds_count"]


def test_disconnect_aborts_and_frees_the_kv_pages(server):
    total = metrics(server)["astrai:kv_pages_total"]
    before = metrics(server).get("vllm:request_success_total{finished_reason=abort}", 0)
    # ~1000 tokens each: they cannot finish while the test reads two events and closes, so
    # only the abort on disconnect can take them out of the engine.
    streams = [open_stream(server, {"prompt": list(range(10 + i, 30 + i)), "max_tokens": 1000,
                                    "temperature": 0, "ignore_eos": True}) for i in range(4)]
    for _, resp in streams:
        next_event(resp)
        next_event(resp)
    for conn, _ in streams:
        conn.sock.close()  # the client goes away mid-stream
        conn.close()

    def settled():
        m = metrics(server)
        return m if m["astrai:num_requests_in_flight"] == 0 else None

    m = wait_until(settled, what="the aborted requests to leave the engine")
    assert m["astrai:kv_pages_free"] == total and m["vllm:kv_cache_usage_perc"] == 0
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m.get("vllm:request_success_total{finished_reason=abort}", 0) > before
    assert server.get("/health")[0] == 200


def test_full_server_answers_503_and_sigterm_drains(ckpt, tmp_path):
    srv = ServeProcess([str(ckpt), "--api-key", API_KEY, "--max-running", "1",
                        "--max-queue", "0", "--max-kv-tokens", "1024", "--drain-timeout", "600"],
                       tmp_path / "err.txt")
    try:
        # 400 tokens: still running when the next request comes, however fast the machine
        conn, resp = open_stream(srv, {"prompt": [5, 6, 7], "max_tokens": 400,
                                       "temperature": 0, "ignore_eos": True})
        first = json.loads(next_event(resp))
        assert first["object"] == "text_completion"
        u = urlparse(srv.url)
        c2 = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        c2.request("POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 1}),
                   headers={"Authorization": f"Bearer {API_KEY}"})
        r2 = c2.getresponse()
        body = json.loads(r2.read())
        assert r2.status == 503 and r2.getheader("Retry-After") == "1"
        assert body["error"]["code"] == "queue_full"
        # SIGTERM while the stream runs: it still ends with every token and [DONE].
        srv.proc.send_signal(signal.SIGTERM)
        events = []
        while (e := next_event(resp)) != "[DONE]":
            events.append(json.loads(e))
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert 1 + len(events) == 400
        conn.close()
        assert srv.proc.wait(timeout=60) == 0
        assert '"POST /v1/completions" 503' in srv.log.read_text()  # the access log
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def test_library_server_in_a_thread(ckpt):
    from astrai.serve import ServeConfig, Server

    server = Server.from_config(ServeConfig(str(ckpt), port=0, device="cpu",
                                            served_model_name="t")).start()
    try:
        req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(
            {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            body = json.loads(r.read())
        assert body["usage"]["completion_tokens"] >= 1 and body["model"] == "t"
    finally:
        server.stop()
    assert not server.loop.alive()
