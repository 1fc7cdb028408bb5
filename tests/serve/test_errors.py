"""Bad input gets a 4xx in OpenAI's error shape (never a 500), the client raises its typed
error, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest

from tests.serve.conftest import API_KEY, MAX_CONTEXT

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

OK = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def raw(server, path: str, body: bytes | str, headers: dict | None = None,
        method: str = "POST") -> tuple[int, dict]:
    u = urlparse(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    h = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json",
         **(headers or {})}
    conn.request(method, path, body=body if isinstance(body, bytes) else body.encode(),
                 headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else {}


@pytest.mark.parametrize(("change", "param"), [
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    # the tiny model's ChatML template does not render tools: generic format, no grammar
    # beside it
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"frobnicate": True}, "frobnicate"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stop": [""]}, "stop"),
])
def test_bad_parameter_is_a_400_naming_it(server, change, param):
    status, body = raw(server, "/v1/chat/completions", json.dumps({**OK, **change}))
    assert status == 400, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert param.split(".")[0].split("[")[0] in err["message"]


def test_client_raises_typed_errors(client, server):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[5] * MAX_CONTEXT, max_tokens=4)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[1, 2], max_tokens=4, echo=True)
    assert "echo" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=OK["messages"], max_tokens=2)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=OK["messages"], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_malformed_bodies_and_paths(server, client):
    assert raw(server, "/v1/chat/completions", b"{not json")[0] == 400
    assert raw(server, "/v1/chat/completions", "[1, 2]")[0] == 400
    assert raw(server, "/v1/completions", json.dumps({"prompt": [[1], "a", 3]}))[0] == 400
    assert raw(server, "/v1/completions", json.dumps({"prompt": [1, 99999]}))[0] == 400
    assert raw(server, "/v1/chat/completions", b"\xff\xfe")[0] == 400
    status, body = raw(server, "/v1/chat/completions", b"x" * (5 * 1024 * 1024))
    assert status == 413 and body["error"]["code"] == "request_too_large"
    status, body = raw(server, "/v1/nothing", "{}")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, _ = raw(server, "/v1/chat/completions", "{}", method="GET")
    assert status == 405
    status, _ = raw(server, "/v1/chat/completions", json.dumps(OK),
                    headers={"Authorization": ""})
    assert status == 401
    # ... and the server still answers well-formed requests.
    r = client.chat.completions.create(**OK)
    assert r.usage.completion_tokens >= 1
    assert server.get("/health")[0] == 200
