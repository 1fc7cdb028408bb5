"""`astrai serve` driven by the official `openai` client: outputs equal the in-process
engine's, the OpenAI response shapes and usage, sampling controls, and error statuses."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
import torch

from astrai.infer import Engine, SamplingParams
from astrai.infer.build import EngineOptions
from astrai.infer.chat_session import open_chat
from tests.infer.conftest import naive_logprobs
from tests.serve.conftest import API_KEY

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def engine(ckpt):
    return Engine.from_checkpoint(ckpt, device="cpu")


def local(engine, prompt, n, **kw):
    return engine.generate(prompt, SamplingParams.greedy(n, **kw))


def test_chat_greedy_equals_astrai_chat_and_usage_counts_tokens(client, ckpt):
    session = open_chat(ckpt, EngineOptions(device="cpu"), params=SamplingParams.greedy(24),
                        system="Be brief.")
    reply = session.reply("Hello there")
    want = "".join(reply)
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=24,
                                       temperature=0)
    (c,) = r.choices
    assert c.message.role == "assistant" and c.message.content == want
    assert c.finish_reason == reply.finish_reason
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == reply.prompt_tokens
    assert r.usage.completion_tokens == reply.stats().output_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_token_ids_greedy_equals_engine(client, engine):
    prompt = list(range(5, 25))
    (want,) = local(engine, prompt, 16, ignore_eos=True)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})
    (c,) = r.choices
    assert c.text == want.text and c.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (20, 16)
    # The same prompt again: its complete pages come from the prefix cache.
    r2 = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r2.choices[0].text == want.text
    assert r2.usage.prompt_tokens_details.cached_tokens == 16  # one page of 16


def test_streams_equal_non_stream_and_end_with_usage(client, server):
    full = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=20,
                                          temperature=0)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == \
        full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        full.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    comp = list(client.completions.create(model="tiny", prompt="Once upon", max_tokens=12,
                                          temperature=0, stream=True))
    whole = client.completions.create(model="tiny", prompt="Once upon", max_tokens=12,
                                      temperature=0)
    assert "".join(c.choices[0].text for c in comp) == whole.choices[0].text
    assert all(c.usage is None for c in comp) if hasattr(comp[0], "usage") else True
    # The raw bytes: server-sent events ending with data: [DONE].
    req = urllib.request.Request(
        server.url + "/v1/completions", method="POST",
        data=json.dumps({"prompt": "Once", "max_tokens": 3, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


def test_stop_string_cuts_the_text(client):
    base = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=30,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = text[8:11]
    assert stop and text.index(stop) >= 1
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=30,
                                  temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == text[:text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_seed_reproducible_and_n_choices(client):
    kw = {"model": "tiny", "prompt": "The king", "max_tokens": 16, "temperature": 1.0,
          "seed": 7, "n": 2, "extra_body": {"ignore_eos": True}}
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text  # choice i samples with seed + i
    assert a.usage.completion_tokens == 32
    other = client.completions.create(**{**kw, "seed": 8, "n": 1})
    assert other.choices[0].text == a.choices[1].text  # seed 8 is choice 1 of seed 7
    chat = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=8, n=3,
                                          temperature=1.0, seed=1)
    assert len(chat.choices) == 3


def test_logprobs_equal_a_full_forward(client, engine):
    prompt = list(range(30, 45))
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                  logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    (out,) = local(engine, prompt, 6, ignore_eos=True)
    want = naive_logprobs(engine.model, prompt, out.token_ids)
    torch.testing.assert_close(torch.tensor(lp.token_logprobs), torch.tensor(want))
    assert all(len(t) == 3 for t in lp.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert [max(t.values()) for t in lp.top_logprobs] == pytest.approx(lp.token_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    chat = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=5,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token


def test_models_and_health(client, server):
    (m,) = client.models.list().data
    assert m.id == "tiny" and m.object == "model"
    assert server.get("/health")[0] == 200


def test_concurrent_clients_share_the_batch_and_get_what_they_get_alone(client, engine,
                                                                         server):
    prompts = [list(range(40 + i, 60 + 2 * i)) for i in range(8)]
    want = [o.text for o in local(engine, prompts, 150, ignore_eos=True)]
    got: list = [None] * 8
    opened = threading.Barrier(8)

    def one(i: int) -> None:
        stream = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=150,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        parts = []
        for k, ch in enumerate(stream):
            parts.append(ch.choices[0].text)
            if k == 0:
                opened.wait(timeout=120)  # every request has produced a token
        got[i] = "".join(parts)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == want
    peak = [ln for ln in server.get("/metrics")[1].splitlines()
            if ln.startswith("astrai:peak_running_requests")]
    assert float(peak[0].split()[-1]) >= 2  # the requests ran in one continuous batch
