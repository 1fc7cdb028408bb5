"""One tenant's LoRA adapter cannot break the others (a real `astrai serve` subprocess with
runtime loading open): every broken adapter, an absurd path, a hostile name, one adapter
too many and a rank above --max-lora-rank is a 400 naming the field, while a small victim
request under another adapter keeps getting the in-process engine's answer in bounded
time; afterwards the server serves and lists exactly what it served before."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from astrai.data.testing import tiny_tokenizer
from astrai.infer import Engine, SamplingParams

from ..infer.lora_fixtures import broken_adapters, make_adapters, peft_adapter, tiny_llama
from .conftest import API_KEY, ServeProcess
from .test_multi_lora import post

pytest.importorskip("peft")

PROMPT = "Once upon a time"
MAX_TOKENS = 8
VICTIM_SECONDS = 10.0
"""A victim's bound: it takes well under a second here; a stalled or broken engine makes
it time out (60 s) or fail."""


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-tenants")
    tok = tiny_tokenizer(root)
    base = tiny_llama(root, tokenizer_dir=tok.path)
    adapters = make_adapters(root, base)
    high = peft_adapter(base, root / "high", 16, 16.0, ["q_proj"], False, 5)
    return base, adapters, broken_adapters(root, adapters["sql"]), high


@pytest.fixture(scope="module")
def expected(dirs):
    base, adapters, _, _ = dirs
    eng = Engine.from_checkpoint(base, device="cpu", loras=adapters)
    return {m: eng.generate(PROMPT, SamplingParams.greedy(MAX_TOKENS, ignore_eos=True),
                            lora=None if m == "base" else m)[0].text
            for m in ("base", "sql")}


@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    base, adapters, _, _ = dirs
    log = tmp_path_factory.mktemp("lora-tenants-log") / "stderr.txt"
    srv = ServeProcess([str(base), "--api-key", API_KEY, "--served-model-name", "base",
                        "--enable-lora-loading", "--lora", f"sql={adapters['sql']}",
                        "--max-lora-rank", "8", "--max-loaded-loras", "3"], log)
    yield srv
    srv.stop()


def complete(url: str, model: str) -> tuple[float, str]:
    t0 = time.monotonic()
    status, text = post(url, "/v1/completions", {"model": model, "prompt": PROMPT,
                                                  "max_tokens": MAX_TOKENS, "temperature": 0,
                                                  "ignore_eos": True})
    assert status == 200, text
    return time.monotonic() - t0, json.loads(text)["choices"][0]["text"]


class Victim:
    """Small requests under `sql` and the base, one after another, until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.results = url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for model in ("sql", "base"):
                self.results.append((model, *complete(self.url, model)))

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(120)
        return self.results


def load(url: str, name: str, path: str) -> tuple[int, dict]:
    status, text = post(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
    return status, (json.loads(text)["error"] if status != 200 else {})


def test_broken_adapters_are_400s_and_the_victim_is_served(server, dirs, expected):
    _, _, broken, high = dirs
    victim = Victim(server.url)
    try:
        cases = [(name, str(path), "lora_path", words)
                 for name, (path, words) in broken.items()]
        cases += [("long-path", "a" * 100_000, "lora_path", "100000 characters"),
                  ("high", str(high), "lora_path", "r 16 is above the largest rank served"),
                  ("bad\nname", str(dirs[1]["sql"]), "lora_name", "lora name"),
                  ("x" * 200, str(dirs[1]["sql"]), "lora_name", "lora name")]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda c: load(server.url, c[0], c[1]), cases))
        for (name, _, param, words), (status, err) in zip(cases, got):
            assert status == 400 and err["param"] == param, (name[:20], err)
            assert words in err["message"] and "\n" not in err["message"], (name[:20], err)
    finally:
        results = victim.stop()
    assert len(results) >= 2
    for model, seconds, text in results:
        assert text == expected[model] and seconds < VICTIM_SECONDS, (model, seconds)
    assert server.get("/health")[0] == 200
    models = json.loads(post_get(server, "/v1/models"))
    assert [m["id"] for m in models["data"]] == ["base", "sql"]


def test_one_adapter_too_many_is_refused_until_one_is_unloaded(server, dirs, expected):
    sql = str(dirs[1]["sql"])
    assert load(server.url, "sql-2", sql)[0] == 200
    assert load(server.url, "sql-3", sql)[0] == 200
    status, err = load(server.url, "sql-4", sql)  # --max-loaded-loras 3, sql included
    assert status == 400 and err["param"] == "lora_name"
    assert "--max-loaded-loras" in err["message"]
    assert complete(server.url, "sql-3")[1] == expected["sql"]
    assert post(server.url, "/v1/unload_lora_adapter", {"lora_name": "sql-2"})[0] == 200
    assert load(server.url, "sql-4", sql)[0] == 200
    for name in ("sql-3", "sql-4"):
        assert post(server.url, "/v1/unload_lora_adapter", {"lora_name": name})[0] == 200


def post_get(server: ServeProcess, path: str) -> str:
    import urllib.request

    req = urllib.request.Request(server.url + path,
                                 headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_models_are_listed_and_resolved_while_a_step_holds_the_engine(dirs):
    """A long step holds the engine's lock: /v1/models, /health and a request naming an
    unknown model are still answered at once (the adapter names need no lock)."""
    import urllib.request

    from astrai.serve import ServeConfig
    from astrai.serve.server import Server

    base, adapters, _, _ = dirs
    server = Server.from_config(ServeConfig(str(base), port=0, device="cpu",
                                            served_model_name="base",
                                            loras={"sql": str(adapters["sql"])})).start()
    try:
        with server.engine.lock:  # a step in progress
            t0 = time.monotonic()
            with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as r:
                assert [m["id"] for m in json.loads(r.read())["data"]] == ["base", "sql"]
            assert urllib.request.urlopen(server.url + "/health", timeout=10).status == 200
            status, text = post(server.url, "/v1/completions",
                                {"model": "nope", "prompt": "x", "max_tokens": 2}, key=None)
            assert status == 404 and "model_not_found" in text
            assert time.monotonic() - t0 < VICTIM_SECONDS
    finally:
        server.stop()
