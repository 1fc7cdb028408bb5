"""The Responses API (`/v1/responses`) through a real `astrai serve` with the official openai
client's `client.responses`, on a random-weight model with Qwen3's template (hermes tool
calls). The reference is the server's own chat/completions: a response is that chat
request under other names, so at temperature 0 its text, its prompt's token count and its
calls equal chat's for the same conversation (instructions as a system message, a
`function_call` as the assistant's tool_calls, a `function_call_output` as a tool
message, `previous_response_id` as the earlier turns). Only the grammar can make the random
model's output a call or valid JSON, so calls and JSON validating (jsonschema) is the
grammar's doing. Then the store's bounds (count, bytes, expiry) and hostile bodies."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from astrai.serve.responses_store import ResponseStore, ResponseStoreConfig
from tests.real_tokenizers import tiny_hf_model
from tests.serve.conftest import API_KEY, ServeProcess, wait_until
from tests.serve.test_lifecycle import metrics

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 8},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
ADD = {"type": "function", "name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                     "b": {"type": "integer", "minimum": -99, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
              for t in TOOLS]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
AUTH = "Bearer " + API_KEY
LIVENESS_BOUND_S = 5.0
"""How long a 1-token chat request may take while hostile and long responses requests run
(a liveness bound on a loaded 2-core machine, not a speed target)."""


STORE_TTL = 4.0


@pytest.fixture(scope="module")
def servers(ckpt, tmp_path_factory):
    """(a Qwen3-template model's server, conftest's tiny model behind a small store: 3
    responses, 24,000 bytes, STORE_TTL s), started side by side."""
    root = tmp_path_factory.mktemp("responses")
    bounded = [str(ckpt), "--api-key", API_KEY, "--served-model-name", "tiny",
               "--response-store-max", "3", "--response-store-bytes", "24000",
               "--response-store-ttl", str(STORE_TTL)]
    with ThreadPoolExecutor(2) as pool:
        second = pool.submit(ServeProcess, bounded, root / "bounded.txt")
        model = tiny_hf_model("qwen3", root, context=2048)
        first = ServeProcess([str(model), "--api-key", API_KEY, "--served-model-name", "tiny",
                              "--max-kv-tokens", "16384", "--max-running", "8"],
                             root / "err.txt")
        srvs = (first, second.result())
    yield srvs
    for srv in srvs:
        srv.proc.terminate()
    for srv in srvs:
        srv.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def qwen(servers):
    return servers[0]


@pytest.fixture(scope="module")
def bounded(servers):
    return servers[1]


@pytest.fixture(scope="module")
def client(qwen):
    c = openai.OpenAI(base_url=qwen.url + "/v1", api_key=API_KEY, max_retries=0,
                      timeout=120)
    yield c
    c.close()  # its open connection would hold the server's graceful shutdown


def post(srv, body: bytes | dict, path: str = "/v1/responses", method: str = "POST",
         timeout: float = 120) -> tuple[int, dict]:
    u = urlparse(srv.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(method, path, body=data if method == "POST" else None,
                 headers={"Authorization": AUTH, "Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else {}


def refused(status: int, body: dict, param: str | None, code: int = 400) -> bool:
    err = body.get("error", {})
    return (status == code and set(err) == {"message", "type", "param", "code"}
            and err["param"] == param)


def chat(client, messages, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                          **kw)


def test_plain_text_equals_chat(client):
    r = client.responses.create(model="tiny", instructions="Be brief.", temperature=0,
                                max_output_tokens=12, input=[{"role": "user", "content": [
                                    {"type": "input_text", "text": "Hello"}]}])
    want = chat(client, [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hello"}], max_tokens=12)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert r.output_text == want.choices[0].message.content and r.output_text
    assert r.instructions == "Be brief." and r.max_output_tokens == 12
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (want.usage.prompt_tokens, 12)
    assert u.total_tokens == u.input_tokens + u.output_tokens
    # the random model writes no end of turn in 12 tokens: the bound ended it
    assert want.choices[0].finish_reason == "length"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_a_stream_is_the_event_sequence_of_the_same_text(client):
    kw = {"model": "tiny", "input": "Tell me a story.", "max_output_tokens": 16,
          "temperature": 0}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *[d.type for d in deltas],
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.incomplete"]
    assert isinstance(deltas[0], openai.types.responses.ResponseTextDeltaEvent)
    text = "".join(d.delta for d in deltas)
    assert text == events[-4].text == whole.output_text and text
    item_id = events[2].item.id
    assert events[2].item.content == [] and events[3].part.text == ""
    assert events[-2].item.status == "incomplete"  # the bound cut it
    assert all(e.item_id == item_id for e in deltas) and events[-2].item.id == item_id
    final = events[-1].response
    assert final.output_text == text and final.status == "incomplete"
    assert final.usage.output_tokens == 16 == whole.usage.output_tokens
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert client.responses.retrieve(final.id).output_text == text  # stored as it ended


def _calls(r) -> list:
    return [o for o in r.output if o.type == "function_call"]


def check_call(call, allowed: set[str]) -> dict:
    assert call.type == "function_call" and call.name in allowed
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    args = json.loads(call.arguments)
    jsonschema.validate(args, SCHEMAS[call.name])
    return args


def test_a_forced_call_then_its_output_in_a_second_turn(client):
    user = {"role": "user", "content": "Weather in Paris?"}
    r = client.responses.create(model="tiny", input=[user], tools=TOOLS, temperature=0,
                                tool_choice="required", parallel_tool_calls=False,
                                max_output_tokens=120)
    assert r.status == "completed", r
    (call,) = _calls(r)
    check_call(call, set(SCHEMAS))
    assert r.tool_choice == "required" and r.parallel_tool_calls is False
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}
    # the second turn twice: the whole history sent again, and previous_response_id
    replay = client.responses.create(
        model="tiny", tools=TOOLS, temperature=0, max_output_tokens=6,
        input=[user, call.model_dump(exclude_none=True), result])
    # an agent's usual loop: the output objects appended to the input as they came
    objects = client.responses.create(model="tiny", tools=TOOLS, temperature=0,
                                      max_output_tokens=6, input=[user, *r.output, result])
    follow = client.responses.create(model="tiny", tools=TOOLS, temperature=0,
                                     max_output_tokens=6, previous_response_id=r.id,
                                     input=[result])
    want = chat(client, [user, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 C"}],
        tools=CHAT_TOOLS, max_tokens=6)
    for second in (replay, objects, follow):
        assert second.usage.input_tokens == want.usage.prompt_tokens
        assert second.output_text == (want.choices[0].message.content or "")
    assert follow.previous_response_id == r.id
    assert want.usage.prompt_tokens > r.usage.input_tokens + r.usage.output_tokens


def test_a_named_call_streams_its_arguments(client):
    kw = {"model": "tiny", "input": "Add 2 and 3.", "tools": TOOLS, "temperature": 0,
          "tool_choice": {"type": "function", "name": "add"}, "max_output_tokens": 120}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     *["response.function_call_arguments.delta"] * len(deltas),
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    added, done = events[2].item, events[-2].item
    assert added.type == "function_call" and added.name == "add" and added.arguments == ""
    assert added.status == "in_progress" and done.status == "completed"
    assert "".join(deltas) == events[-3].arguments == done.arguments
    args = check_call(done, {"add"})
    (call,) = _calls(whole)
    assert json.loads(call.arguments) == args  # greedy: the same call streamed or not
    assert _calls(events[-1].response)[0].call_id == done.call_id == added.call_id


def test_json_schema_output_parses_and_validates(client):
    r = client.responses.create(model="tiny", input="A person as JSON.", temperature=0,
                                max_output_tokens=200, text={"format": {
                                    "type": "json_schema", "name": "person",
                                    "schema": PERSON, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema"
    obj = client.responses.create(model="tiny", input="Any JSON object.", temperature=1.0,
                                  max_output_tokens=200, text={"format": {
                                      "type": "json_object"}}, extra_body={"seed": 3})
    if obj.status == "completed":  # a random object may outgrow the bound; its start holds
        assert isinstance(json.loads(obj.output_text), dict)
    assert obj.output_text.startswith("{")


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model="tiny", input="Hi there", max_output_tokens=5,
                                    temperature=0, instructions="Old rules.")
    second = client.responses.create(model="tiny", input="And then?", max_output_tokens=5,
                                     temperature=0, previous_response_id=first.id)
    # the earlier instructions are not carried over (OpenAI's rule); its turns are
    want = chat(client, [{"role": "user", "content": "Hi there"},
                         {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": "And then?"}], max_tokens=5)
    assert second.usage.input_tokens == want.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.output_text == want.choices[0].message.content
    third = client.responses.create(model="tiny", input="More.", max_output_tokens=3,
                                    temperature=0, previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.total_tokens


def test_get_and_delete(client, qwen):
    r = client.responses.create(model="tiny", input="Hello", max_output_tokens=4,
                                temperature=0, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"}
    client.responses.delete(r.id)
    for call in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError):
            call(r.id)
    status, body = post(qwen, b"", f"/v1/responses/{r.id}", "GET")
    assert refused(status, body, None, 404) and r.id in body["error"]["message"]
    assert refused(*post(qwen, b"", "/v1/responses/resp_nope", "DELETE"), None, 404)
    unstored = client.responses.create(model="tiny", input="Hi", max_output_tokens=2,
                                       store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    status, body = post(qwen, {"input": "Hi", "previous_response_id": unstored.id})
    assert refused(status, body, "previous_response_id"), body
    u = urlparse(qwen.url)  # the key guards these routes as every /v1 route
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", f"/v1/responses/{r.id}")
    assert conn.getresponse().status == 401


FN = {"type": "function", "name": "f"}


@pytest.mark.parametrize(("change", "param"), [
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": None}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": ["x"]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": "x", "color": "red"}]}, "input[0].color"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 10**7}, "input"),  # more than the context leaves
    ({"temperature": -1}, "temperature"),
    ({"top_p": 2}, "top_p"),
    ({"instructions": 3}, "instructions"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{**FN, "name": "bad name!"}]}, "tools[0].name"),
    ({"tools": [{**FN, "parameters": {"type": "array"}}]}, "tools[0].parameters"),
    ({"tools": [{**FN, "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(("}}}}], "tool_choice": "required"},
     "tools[0].parameters"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [FN], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}}},
     "text.format"),
    ({"store": "yes"}, "store"),
    ({"metadata": {"k": 5}}, "metadata"),
    ({"previous_response_id": "resp_" + "0" * 32}, "previous_response_id"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"model": "other"}, "model"),
])
def test_bad_fields_are_400s_naming_the_field(qwen, change, param):
    status, body = post(qwen, {"model": "tiny", "input": "hi", "max_output_tokens": 4,
                               **change})
    assert refused(status, body, param, 404 if param == "model" else 400), body


def test_hostile_bodies_are_400s(qwen):
    deep = b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert refused(*post(qwen, deep), None)
    nested: object = "x"
    for _ in range(500):  # decodes, but is no content
        nested = [nested]
    status, body = post(qwen, {"input": [{"role": "user", "content": nested}]})
    assert refused(status, body, "input[0].content"), body
    items = [{"role": "user", "content": "hi"}] * 20_000
    assert refused(*post(qwen, {"input": items}), "input")
    long = "the quick brown fox jumps over the lazy dog. " * 60_000  # 2.7 MB
    status, body = post(qwen, {"input": long, "max_output_tokens": 1})
    assert refused(status, body, "input") and body["error"]["code"] == \
        "context_length_exceeded", body


def test_a_small_chat_answers_while_hostile_and_long_responses_run(qwen):
    """A long streamed response and hostile bodies (the largest input list, each item
    long; a 2.7 MB input), read, rendered and refused in worker threads, beside a 1-token
    chat request, which keeps answering within LIVENESS_BOUND_S (measured: 0.4 s)."""
    statuses: list[tuple[int, str | None]] = []
    hostile = [{"input": [{"role": "user", "content": "word " * 700}] * 1024},
               {"input": "the quick brown fox jumps over the lazy dog. " * 60_000}]

    def abuse(body: dict) -> None:
        for _ in range(2):
            status, got = post(qwen, {**body, "max_output_tokens": 1}, timeout=300)
            statuses.append((status, got.get("error", {}).get("param")))

    def long_stream() -> None:
        body = {"input": "Go on.", "max_output_tokens": 150, "stream": True}
        statuses.append((post_stream(qwen, body), None))

    threads = [threading.Thread(target=abuse, args=(b,), daemon=True) for b in hostile]
    threads.append(threading.Thread(target=long_stream, daemon=True))
    for t in threads:
        t.start()
    slowest, rounds = 0.0, 0
    while rounds < 3 or any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        status, _ = post(qwen, {"messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 1}, "/v1/chat/completions", timeout=300)
        assert status == 200
        slowest = max(slowest, time.monotonic() - t0)
        rounds += 1
        assert rounds < 2000, "the heavy requests did not finish"
    for t in threads:
        t.join(300)
    assert slowest < LIVENESS_BOUND_S, slowest
    assert sorted(statuses, key=str) == [(200, None)] + [(400, "input")] * 4, statuses


def post_stream(srv, body: dict) -> int:
    """Read a whole streamed response; 200 when it ended with its terminal event."""
    u = urlparse(srv.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    conn.request("POST", "/v1/responses", body=json.dumps(body).encode(),
                 headers={"Authorization": AUTH, "Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    return resp.status if "event: response.incomplete" in text else 0


def test_a_stream_whose_client_leaves_is_aborted_and_not_stored(bounded):
    """The client closes the connection after the first delta of a 1,000-token stream: its
    engine request is aborted (chat's disconnect handling) and the response not stored."""
    m = metrics(bounded)
    before = m.get("vllm:request_success_total{finished_reason=abort}", 0)
    tokens = m.get("vllm:generation_tokens_total", 0)
    u = urlparse(bounded.url)
    body = json.dumps({"input": "hi", "max_output_tokens": 1000, "stream": True}).encode()
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while b"response.output_text.delta" not in seen:
        chunk = sock.recv(1 << 16)
        assert chunk, seen
        seen += chunk
    rid = re.search(rb'"id": "(resp_[0-9a-f]{32})"', seen).group(1).decode()
    sock.close()

    def aborted() -> dict | None:
        m = metrics(bounded)
        return m if m.get("vllm:request_success_total{finished_reason=abort}", 0) > before \
            and m["astrai:num_requests_in_flight"] == 0 else None

    m = wait_until(aborted, timeout=60, what="the abort")
    # aborted when the client left, not once its unread outputs passed the backlog bound
    # (jobs.MAX_BACKLOG_STEPS = 256 steps), which would also abort it
    assert m["vllm:generation_tokens_total"] - tokens < 200
    assert not _stored(bounded, rid)


# -- the store's bounds ------------------------------------------------------------------
def _create(srv, **kw) -> str:
    status, body = post(srv, {"input": "hi", "max_output_tokens": 1, **kw})
    assert status == 200 and body["store"] is kw.get("store", True), body
    return body["id"]


def _stored(srv, rid: str) -> bool:
    return post(srv, b"", f"/v1/responses/{rid}", "GET")[0] == 200


def test_the_store_evicts_the_oldest_by_count_and_bytes_and_expires(bounded):
    ids = [_create(bounded) for _ in range(4)]
    assert [_stored(bounded, i) for i in ids] == [False, True, True, True]
    # 16 metadata values of 512 characters: ~9 KB an entry, so two fit in 24,000 bytes
    big = {f"k{i}": chr(ord("a") + i) * 512 for i in range(16)}
    fat = [_create(bounded, metadata=big) for _ in range(3)]
    assert [_stored(bounded, i) for i in fat] == [False, True, True]
    assert not any(_stored(bounded, i) for i in ids)  # evicted for the bytes
    t0 = time.monotonic()
    last = _create(bounded)
    assert _stored(bounded, last)
    wait_until(lambda: not _stored(bounded, last), timeout=60, what="the entry to expire")
    assert time.monotonic() - t0 > STORE_TTL * 0.9
    status, body = post(bounded, {"input": "more", "previous_response_id": last})
    assert refused(status, body, "previous_response_id"), body


def test_the_store_alone_evicts_expires_and_refuses_oversized_entries():
    now = [0.0]
    store = ResponseStore(ResponseStoreConfig(max_responses=3, max_bytes=2000, ttl=10),
                          clock=lambda: now[0])
    small = [{"role": "user", "content": "x" * 300}]  # ~340 bytes an entry
    for i in range(4):
        now[0] = i
        assert store.put(f"r{i}", {"id": f"r{i}"}, small)
    assert store.get("r0") is None and len(store) == 3
    assert store.put("big", {"id": "big"}, [{"content": "y" * 1500}])  # evicts r1 (count)
    # and r2 (bytes: r2 + r3 + big > 2000)
    assert [store.get(f"r{i}") is not None for i in range(4)] == [False, False, False, True]
    assert store.bytes <= 2000
    assert not store.put("huge", {"id": "huge"}, [{"content": "z" * 3000}])
    assert store.get("huge") is None and store.get("big") is not None
    now[0] = 3 + 10.5  # r3 was stored at 3, big at 3 too
    assert store.get("r3") is None and store.get("big") is None and len(store) == 0
    assert store.bytes == 0
    assert store.put("again", {"id": "again"}, small) and store.delete("again")
    assert not store.delete("again") and store.bytes == 0


# -- the event sequence of mixed output, against the non-streamed answer ------------------
def _outputs(pieces: list[str], finish: str):
    from types import SimpleNamespace

    usage = SimpleNamespace(prompt_tokens=7, cached_tokens=0)
    return [SimpleNamespace(delta_text=p, delta_token_ids=[0] * len(p), usage=usage,
                            finished=i == len(pieces) - 1,
                            finish_reason=finish if i == len(pieces) - 1 else None)
            for i, p in enumerate(pieces)]


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_text_then_calls_stream_as_items_one_after_another(finish):
    """Hermes output with text, two calls and text again, streamed one character at a time:
    the items open and close in order (a message, two function_calls, a message), each
    item's deltas join to what the non-streamed answer of the same text holds, and the
    sequence numbers count up."""
    from astrai.serve.responses_api import ResponseHead, ResponsesBuilder
    from astrai.serve.tool_parsers import HermesParser
    from astrai.serve.tools import ToolPlan

    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
            '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": '
            '{"a": 2, "b": 3}}\n</tool_call>\nDone.')
    plan = ToolPlan([], "auto", None, True, HermesParser())

    def builder() -> ResponsesBuilder:
        return ResponsesBuilder(ResponseHead("resp_x", "tiny", {}, None, None, True), plan)

    streamed = builder()
    events = streamed.start_events()
    for out in _outputs(list(text), finish):
        events += streamed.events(out)
    events += streamed.end_events()
    whole = builder()
    for out in _outputs([text], finish):
        whole.add(out)
    want = whole.final()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    got = events[-1]["response"]
    kinds = [(i["type"], i.get("name")) for i in got["output"]]
    assert kinds == [("message", None), ("function_call", "get_weather"),
                     ("function_call", "add"), ("message", None)]
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]
    for index, item in enumerate(got["output"]):
        deltas = "".join(e["delta"] for e in events if e.get("output_index") == index
                         and e["type"].endswith(".delta"))
        assert deltas == (item["content"][0]["text"] if item["type"] == "message"
                          else item["arguments"])
    calls = [(i["name"], json.loads(i["arguments"])) for i in got["output"]
             if i["type"] == "function_call"]
    assert calls == [(i["name"], json.loads(i["arguments"])) for i in want["output"]
                     if i["type"] == "function_call"]
    texts = [i["content"][0]["text"] for i in got["output"] if i["type"] == "message"]
    assert "".join(texts) == want["output"][0]["content"][0]["text"]
    assert got["usage"] == want["usage"] and got["usage"]["output_tokens"] == len(text)
    assert got["status"] == ("completed" if finish == "stop" else "incomplete")
    assert events[-1]["type"] == ("response.completed" if finish == "stop"
                                  else "response.incomplete")
