"""`astrai serve BASE --lora NAME=DIR ...` through the official openai client: /v1/models
lists the base and its adapters (parent = the base), concurrent requests for each model
share the batch and answer what the in-process engine answers, an unknown model is a 404
model_not_found, and vLLM's load/unload routes work at runtime only with
--enable-lora-loading and an API key (404 / 403 otherwise)."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from astrai.data.testing import tiny_tokenizer
from astrai.infer import Engine, SamplingParams

from ..infer.lora_fixtures import make_adapters, tiny_llama
from .conftest import API_KEY, ServeProcess

openai = pytest.importorskip("openai")
pytest.importorskip("peft")

PROMPTS = ["The quick brown fox", "Once upon a time", "In the beginning"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-mlora")
    tok = tiny_tokenizer(root)
    base = tiny_llama(root, tokenizer_dir=tok.path)
    return base, make_adapters(root, base)


@pytest.fixture(scope="module")
def expected(dirs):
    """(prompt, model) -> the in-process engine's greedy text."""
    base, adapters = dirs
    eng = Engine.from_checkpoint(base, device="cpu", loras=adapters)
    out = {}
    for model in ("base", *adapters):
        outs = eng.generate(PROMPTS, SamplingParams.greedy(MAX_TOKENS, ignore_eos=True),
                            lora=None if model == "base" else model)
        out.update({(p, model): o.text for p, o in zip(PROMPTS, outs)})
    return out


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    base, adapters = dirs
    log = tmp_path_factory.mktemp("serve-mlora-log") / "stderr.txt"
    args = [str(base), "--api-key", API_KEY, "--served-model-name", "base",
            "--enable-lora-loading", "--max-kv-tokens", "2048", "--max-running", "16"]
    for name, path in adapters.items():
        args += ["--lora", f"{name}={path}"]
    srv = ServeProcess(args, log)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=120)


def post(url: str, path: str, body: dict, key: str | None = API_KEY) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def complete(client, model: str, prompt: str) -> str:
    r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.model == model
    return r.choices[0].text


def test_models_lists_the_base_and_its_adapters(client):
    cards = {m.id: m for m in client.models.list().data}
    assert list(cards) == ["base", "sql", "poet"]
    assert cards["sql"].parent == "base" and cards["poet"].parent == "base"
    assert cards["base"].parent is None


def test_concurrent_requests_per_adapter_match_the_engine(client, expected):
    jobs = [(p, m) for p in PROMPTS for m in ("base", "sql", "poet")] * 2
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda j: complete(client, j[1], j[0]), jobs))
    for job, text in zip(jobs, texts):
        assert text == expected[job], job
    assert len({expected[PROMPTS[0], m] for m in ("base", "sql", "poet")}) == 3


def test_chat_under_an_adapter(client):
    r = client.chat.completions.create(model="poet", max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.model == "poet" and r.usage.completion_tokens >= 1


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert e.value.code == "model_not_found"
    assert "'nope' does not exist" in e.value.message


def test_load_and_unload_at_runtime(server, client, dirs, expected):
    _, adapters = dirs
    url = server.url
    assert post(url, "/v1/load_lora_adapter", {"lora_name": "sql2",
                                                "lora_path": str(adapters["sql"])},
                key=None)[0] == 401
    status, text = post(url, "/v1/load_lora_adapter", {"lora_name": "sql2",
                                                        "lora_path": str(adapters["sql"])})
    assert status == 200 and "sql2" in text
    assert [m.id for m in client.models.list().data] == ["base", "sql", "poet", "sql2"]
    assert complete(client, "sql2", PROMPTS[1]) == expected[PROMPTS[1], "sql"]
    status, text = post(url, "/v1/load_lora_adapter", {"lora_name": "sql2",
                                                        "lora_path": str(adapters["sql"])})
    assert status == 400 and json.loads(text)["error"]["param"] == "lora_name"
    assert post(url, "/v1/unload_lora_adapter", {"lora_name": "sql2"})[0] == 200
    with pytest.raises(openai.NotFoundError):
        complete(client, "sql2", PROMPTS[1])
    status, text = post(url, "/v1/unload_lora_adapter", {"lora_name": "sql2"})
    assert status == 400 and "not loaded" in text


@pytest.mark.parametrize("body,param", [
    ({"lora_name": "x"}, "lora_path"),
    ({"lora_name": "", "lora_path": "/tmp"}, "lora_name"),
    ({"lora_name": "x", "lora_path": "/nonexistent/adapter"}, "lora_path"),
    ({"lora_name": "x", "lora_path": "/tmp", "extra": 1}, "extra"),
    ({"lora_name": "base", "lora_path": "/tmp"}, "lora_name"),
])
def test_bad_load_requests_are_400s_naming_the_field(server, body, param):
    status, text = post(server.url, "/v1/load_lora_adapter", body)
    err = json.loads(text)["error"]
    assert status == 400 and err["param"] == param, err


@pytest.mark.parametrize("flags,status", [((), 404), (("--enable-lora-loading",), 403)])
def test_runtime_loading_is_closed_unless_enabled_with_a_key(dirs, tmp_path, flags, status):
    from astrai.serve import ServeConfig
    from astrai.serve.server import Server

    base, adapters = dirs
    config = ServeConfig(str(base), port=0, device="cpu", served_model_name="base",
                         loras={"sql": str(adapters["sql"])},
                         enable_lora_loading=bool(flags))
    server = Server.from_config(config).start()
    try:
        code, text = post(server.url, "/v1/load_lora_adapter",
                          {"lora_name": "x", "lora_path": str(adapters["poet"])}, key=None)
        assert code == status
        assert ("--enable-lora-loading" if status == 404 else "--api-key") in text
        models = json.loads(urllib.request.urlopen(server.url + "/v1/models").read())
        assert [m["id"] for m in models["data"]] == ["base", "sql"]
    finally:
        server.stop()
