"""Reasoning output over the API: `reasoning_content` on chat messages and stream deltas
(vLLM's field), the split decided by the prompt (a DeepSeek-R1-style template opens the
thinking itself), and `chat_template_kwargs` allow-listed."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest

from astrai.infer.reasoning import reasoning_parser
from astrai.serve.protocol import Job
from astrai.serve.responses import ResponseBuilder

from .conftest import API_KEY, ServeProcess

R1_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
               "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
               "<think>\n{% endif %}")


def _out(text: str, finished: bool = False) -> SimpleNamespace:
    return SimpleNamespace(delta_text=text, delta_token_ids=[1], delta_logprobs=None,
                           finished=finished, finish_reason="stop" if finished else None,
                           usage=SimpleNamespace(prompt_tokens=3, cached_tokens=0))


def _job(stream: bool, opened: bool = False) -> Job:
    return Job("chat", None, [[1, 2, 3]], [SimpleNamespace()], 1, stream, False, None,
               reasoning=reasoning_parser("qwen3"), thinking_open=opened)


PIECES = ["<th", "ink>\nweigh", " it</thi", "nk>\n\nYes", "."]


def test_message_and_stream_deltas_carry_the_thinking_apart():
    whole = ResponseBuilder(_job(False), "id", "m", None)
    for i, p in enumerate(PIECES):
        whole.add(0, _out(p, i == len(PIECES) - 1))
    msg = whole.final()["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("\nweigh it", "Yes.")
    streamed = ResponseBuilder(_job(True), "id", "m", None)
    deltas = [c["choices"][0]["delta"] for i, p in enumerate(PIECES)
              for c in streamed.chunks(0, _out(p, i == len(PIECES) - 1))]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "\nweigh it"
    assert "".join(d.get("content", "") for d in deltas) == "Yes."
    assert not any("<" in d.get("content", "") + d.get("reasoning_content", "") for d in deltas)


def test_a_prompt_that_opens_the_thinking_starts_the_reply_inside_it():
    b = ResponseBuilder(_job(False, opened=True), "id", "m", None)
    b.add(0, _out("plan</think>ok", True))
    msg = b.final()["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("plan", "ok")


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {API_KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def r1_server(ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("r1")
    (root / "r1.jinja").write_text(R1_TEMPLATE)
    srv = ServeProcess([str(ckpt), "--api-key", API_KEY, "--chat-template",
                        str(root / "r1.jinja"), "--reasoning-parser", "deepseek_r1",
                        "--max-kv-tokens", "2048"], root / "stderr.txt")
    yield srv
    srv.stop()


def test_a_real_server_returns_the_thinking_as_reasoning_content(r1_server):
    """The template opens the thinking, the tiny model never closes it: the whole reply is
    reasoning, the content empty, streamed or not; chat_template_kwargs is allow-listed."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=r1_server.url + "/v1", api_key=API_KEY, max_retries=0)
    msgs = [{"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(model="ckpt", messages=msgs, max_tokens=12, temperature=0)
    m = r.choices[0].message
    thinking = m.model_extra["reasoning_content"]
    assert thinking and not m.content and r.usage.completion_tokens == 12
    got = ["", ""]
    for chunk in client.chat.completions.create(model="ckpt", messages=msgs, max_tokens=12,
                                                temperature=0, stream=True):
        if chunk.choices:
            d = chunk.choices[0].delta
            got[0] += (d.model_extra or {}).get("reasoning_content") or ""
            got[1] += d.content or ""
    assert got == [thinking, ""]
    ok, body = _post(r1_server.url, {"messages": msgs, "max_tokens": 2,
                                     "chat_template_kwargs": {"enable_thinking": False}})
    assert ok == 200, body
    for kw, param in (({"foo": True}, "chat_template_kwargs.foo"),
                      ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking"),
                      ([1], "chat_template_kwargs")):
        status, body = _post(r1_server.url, {"messages": msgs, "chat_template_kwargs": kw})
        assert status == 400 and body["error"]["param"] == param, body


def test_the_responses_api_returns_a_reasoning_item(r1_server):
    """/v1/responses on the same server: the thinking is a `reasoning` output item before the
    (empty) message, equal to chat's reasoning_content, streamed as reasoning_text events,
    counted in reasoning_tokens; passed back as input, the item is accepted."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=r1_server.url + "/v1", api_key=API_KEY, max_retries=0)
    chat = client.chat.completions.create(model="ckpt", messages=[{"role": "user",
                                                                   "content": "Hi"}],
                                          max_tokens=12, temperature=0)
    want = chat.choices[0].message.model_extra["reasoning_content"]
    r = client.responses.create(model="ckpt", input="Hi", max_output_tokens=12,
                                temperature=0)
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"], kinds
    assert r.output[0].content[0].text == want and r.output_text == ""
    assert r.usage.output_tokens_details.reasoning_tokens == 12
    events = list(client.responses.create(model="ckpt", input="Hi", max_output_tokens=12,
                                          temperature=0, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == want and done == [want]
    again = client.responses.create(model="ckpt", input=[
        {"role": "user", "content": "Hi"}, *[o.model_dump(exclude_none=True) for o in r.output],
        {"role": "user", "content": "And?"}], max_output_tokens=2)
    assert again.status == "incomplete"  # cut at 2 tokens: it ran
