"""`astrai serve-bench --base-url` against a minimal stand-in OpenAI server (stdlib
http.server in a thread): default lengths fit the context the server or the model directory
reports, and a 401 says to pass --api-key."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from astrai_cli.main import app

runner = CliRunner()


class FakeServer:
    """Streams max_tokens one-token chunks per completion; records every request body."""

    def __init__(self, max_model_len: int | None = None, key: str | None = None) -> None:
        self.bodies: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if key and self.headers.get("Authorization") != f"Bearer {key}":
                    self._send(401, b'{"error": {"message": "invalid api key"}}')
                    return False
                return True

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path != "/v1/models":
                    return self._send(404, b"{}")
                model = {"id": "m"} | ({"max_model_len": max_model_len} if max_model_len
                                       else {})
                self._send(200, json.dumps({"data": [model]}).encode())

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                n = body["max_tokens"]
                chunks = [{"choices": [{"text": "a"}]} for _ in range(n)]
                chunks.append({"choices": [], "usage": {"completion_tokens": n,
                                                        "prompt_tokens": len(body["prompt"])}})
                data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
                self._send(200, data + b"data: [DONE]\n\n", "text/event-stream")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def model_dir(tmp_path):
    """A model directory as the server serves it: only config.json (a 256-token model)."""
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 300, "max_seq_len": 256}))
    return tmp_path


def bench(model_dir, url, *extra):
    return runner.invoke(app, ["serve-bench", str(model_dir), "--base-url", url,
                               "--num-prompts", "4", "--warmup", "0", "--json", *extra])


@pytest.mark.parametrize("max_model_len, context", [(None, 256), (100, 100)])
def test_default_lengths_fit_the_servers_or_the_models_context(model_dir, max_model_len,
                                                               context):
    server = FakeServer(max_model_len)
    try:
        r = bench(model_dir, server.url)
    finally:
        server.close()
    assert r.exit_code == 0, r.output
    assert len(server.bodies) == 4
    assert all(len(b["prompt"]) + b["max_tokens"] <= context for b in server.bodies)
    report = json.loads(r.stdout)
    assert report["runs"][0]["completed"] == 4
    assert report["model"] == {"kind": "server", "name": "m", "path": str(model_dir),
                               "base_url": server.url}


def test_unauthorized_says_to_pass_the_api_key(model_dir, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = FakeServer(key="sk-right")
    try:
        r = bench(model_dir, server.url)
        ok = bench(model_dir, server.url, "--api-key", "sk-right")
    finally:
        server.close()
    assert r.exit_code == 2 and "HTTP 401" in r.stderr and "--api-key" in r.stderr
    assert ok.exit_code == 0, ok.output
