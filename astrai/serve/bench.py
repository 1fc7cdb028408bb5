"""`astrai serve-bench --base-url URL`: the serving benchmark against any OpenAI-compatible
server, over streaming HTTP.

Same workloads, arrivals and metric definitions as the in-process mode
(`astrai.infer.bench`); what differs is only where times are taken, exactly as vLLM's
`bench serve` client takes them: a request's start is when it is sent, TTFT runs to the
first streamed chunk carrying output, ITL are the gaps between such chunks, and the output
length is the server's `usage.completion_tokens` when it reports one (else one token per
chunk). Each request runs in its own client thread (stdlib http.client, one connection
each), so a slow stream never delays another's send time.

/v1/completions sends the workload's token ids as the prompt (exact lengths);
/v1/chat/completions sends them detokenized as one user message (the server's template
and tokenizer then decide the prompt length; `usage.prompt_tokens` is what is counted).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlparse

from astrai.errors import ConfigError
from astrai.infer.bench.arrivals import arrival_offsets
from astrai.infer.bench.config import BenchConfig, fit_lengths
from astrai.infer.bench.metrics import RequestRecord, compute_metrics
from astrai.infer.bench.serve import (
    BenchReport,
    BenchRun,
    Target,
    bench_settings,
    build_workload,
    check_fits,
    describe_workload,
    prompt_pool,
)
from astrai.infer.bench.workloads import BenchRequest, warmup_requests
from astrai.model.gguf_file import is_gguf


@dataclass
class Endpoint:
    base_url: str
    path: str
    model: str
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def connection(self, timeout: float = 600.0) -> http.client.HTTPConnection:
        u = urlparse(self.base_url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        return cls(u.hostname, u.port, timeout=timeout)

    def prefix(self) -> str:
        return urlparse(self.base_url).path.rstrip("/")


def get_json(ep: Endpoint, path: str) -> Any:
    conn = ep.connection(timeout=30)
    try:
        conn.request("GET", ep.prefix() + path, headers=ep.headers())
        resp = conn.getresponse()
        data = resp.read()
        if resp.status == 401:
            raise ConfigError(f"{ep.base_url}{path}: HTTP 401 unauthorized: pass the server's "
                              "key with --api-key KEY (or set OPENAI_API_KEY)")
        if resp.status != 200:
            raise ConfigError(f"{ep.base_url}{path}: HTTP {resp.status} "
                              f"{data[:200].decode(errors='replace')}")
        return json.loads(data)
    except OSError as e:
        raise ConfigError(f"--base-url {ep.base_url}: cannot connect ({e}); is the server "
                          "running?") from None
    finally:
        conn.close()


def request_body(ep: Endpoint, req: BenchRequest, tokenizer: Any, temperature: float,
                 ignore_eos: bool, seed: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ep.model, "max_tokens": req.output_len,
                            "temperature": temperature, "seed": seed, "stream": True,
                            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: exactly max_tokens tokens
    if ep.path.endswith("/chat/completions"):
        if tokenizer is None:
            raise ConfigError("--endpoint /v1/chat/completions needs text prompts: give a "
                              "TARGET directory holding tokenizer.json")
        body["messages"] = [{"role": "user", "content": tokenizer.decode(req.prompt_ids)}]
    else:
        body["prompt"] = list(req.prompt_ids)
    return body


def stream_one(ep: Endpoint, body: dict[str, Any], rec: RequestRecord) -> None:
    """Send one streaming request and fill `rec` with what the client saw."""
    chat = "messages" in body
    conn = ep.connection()
    try:
        rec.start = time.perf_counter()
        conn.request("POST", ep.prefix() + ep.path, body=json.dumps(body), headers=ep.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            rec.success, rec.error = False, f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.perf_counter()
            obj = json.loads(data)
            if "error" in obj:
                rec.success, rec.error = False, str(obj["error"])
                break
            choices = obj.get("choices") or []
            if choices and _carries_output(choices[0], chat):
                rec.token_times.append(now)
            usage = obj.get("usage")
            if usage:
                rec.num_output = usage.get("completion_tokens")
                rec.prompt_len = usage.get("prompt_tokens") or rec.prompt_len
        rec.end = time.perf_counter()
        if not rec.token_times:
            rec.success, rec.error = False, "no output"
    except (OSError, ValueError, http.client.HTTPException) as e:
        rec.success, rec.error = False, f"{type(e).__name__}: {e}"
    finally:
        if rec.end is None:
            rec.end = time.perf_counter()
        conn.close()


def _carries_output(choice: dict, chat: bool) -> bool:
    if not chat:
        return True
    delta = choice.get("delta") or {}
    # The first chat chunk announces the role; it carries output only with content.
    return bool(delta.get("content")) or "role" not in delta


def run_http(ep: Endpoint, requests: list[BenchRequest], offsets: list[float], tokenizer: Any,
             config: BenchConfig, progress: Any = None) -> tuple[list[RequestRecord], float]:
    """Send request i at offsets[i] (waiting for a concurrency slot); (records, duration)."""
    records = [RequestRecord(r.prompt_len, 0.0) for r in requests]
    slots = threading.Semaphore(config.max_concurrency or len(requests) or 1)
    done_lock, done = threading.Lock(), [0]
    threads = []

    def one(i: int) -> None:
        try:
            body = request_body(ep, requests[i], tokenizer, config.temperature,
                                config.ignore_eos, config.seed + i)
            stream_one(ep, body, records[i])
        finally:
            slots.release()
            with done_lock:
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(requests))

    t0 = time.perf_counter()
    for i, off in enumerate(offsets):
        wait = t0 + off - time.perf_counter()
        if wait > 0:
            time.sleep(wait)  # the arrival process: send times, not synchronisation
        slots.acquire()
        th = threading.Thread(target=one, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    return records, time.perf_counter() - t0


def _scrape(ep: Endpoint) -> dict[str, float]:
    """Prefix-cache counters from the server's /metrics (vLLM names), when it has them."""
    conn = ep.connection(timeout=10)
    try:
        conn.request("GET", "/metrics", headers=ep.headers())
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace") if resp.status == 200 else ""
    except OSError:
        return {}
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                    "vllm:num_preemptions_total"):
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _model_config(path: Path) -> dict[str, Any]:
    cfg = path / "config.json"
    if not cfg.is_file():
        return {}
    data = json.loads(cfg.read_text())
    return data if isinstance(data, dict) else {}


def _context(path: Path, server_max_len: Any) -> int | None:
    """The context requests must fit: the server's max_model_len (vLLM and astrai serve list
    it in /v1/models), else the model directory's config.json (astrai's max_seq_len, HF's
    max_position_embeddings), else unknown."""
    if isinstance(server_max_len, int) and server_max_len > 0:
        return server_max_len
    cfg = _model_config(path)
    for key in ("max_seq_len", "max_position_embeddings"):
        if isinstance(cfg.get(key), int) and cfg[key] > 0:
            return cfg[key]
    return None


def _vocab(path: Path, tokenizer: Any) -> int:
    v = _model_config(path).get("vocab_size")
    if isinstance(v, int):
        return v
    if tokenizer is None:
        raise ConfigError(f"{path}: neither config.json nor tokenizer.json; give the model "
                          "directory the server serves")
    return tokenizer.vocab_size


def http_serve_bench(config: BenchConfig, progress: Any = None) -> BenchReport:
    """The serving benchmark against config.base_url (see the module doc)."""
    from astrai.infer.loading import load_tokenizer

    config.validate()
    path = Path(config.target)
    if not path.is_dir() and not is_gguf(path):
        raise ConfigError(f"'{config.target}': with --base-url give the model directory the "
                          "server serves (its tokenizer builds the prompts)")
    tok = load_tokenizer(path)
    ep = Endpoint(config.base_url.rstrip("/"), config.endpoint, config.model or "",
                  config.api_key)
    listing = get_json(ep, "/v1/models")
    models = listing.get("data") or []
    if not ep.model:
        if not models:
            raise ConfigError(f"{ep.base_url}/v1/models lists no model: give --model")
        ep.model = models[0]["id"]
    max_len = next((m.get("max_model_len") for m in models if m.get("id") == ep.model), None)
    target = Target(SimpleNamespace(config=SimpleNamespace(vocab_size=_vocab(path, tok))), tok,
                    {})
    config = fit_lengths(config, _context(path, max_len))
    name, requests = build_workload(config, target)
    if max_len:  # the model directory's own length is only a guess at the server's
        check_fits(requests, int(max_len))
    offsets = arrival_offsets(len(requests), config.request_rate, config.burstiness,
                              config.seed)
    warm = warmup_requests(config.warmup, prompt_pool(target), config.seed)
    if warm:
        run_http(ep, warm, [0.0] * len(warm), tok, config)
    before = _scrape(ep)
    label = f"{ep.base_url}{ep.path}"
    cb = None if progress is None else (lambda d, t: progress(label, d, t))
    records, duration = run_http(ep, requests, offsets, tok, config, cb)
    after = _scrape(ep)
    metrics = compute_metrics(records, duration, config.slos or None)
    q = after.get("vllm:prefix_cache_queries_total", 0) - before.get(
        "vllm:prefix_cache_queries_total", 0)
    h = after.get("vllm:prefix_cache_hits_total", 0) - before.get(
        "vllm:prefix_cache_hits_total", 0)
    metrics.update(
        prefix_cache_hit_rate=(h / q if q else None) if after else None,
        num_preemptions=int(after["vllm:num_preemptions_total"]
                            - before.get("vllm:num_preemptions_total", 0))
        if "vllm:num_preemptions_total" in after else None,
        kv_pool_utilization_mean=None, kv_pool_utilization_peak=None, num_steps=None,
        errors=sorted({r.error for r in records if not r.success})[:5])
    settings = bench_settings(config)
    for key in ("threads", "cache", "scheduler"):  # the server's, not ours
        settings.pop(key)
    settings.update(base_url=ep.base_url, endpoint=ep.path)
    # dtype and device are the server's own and not reported: left out, not guessed.
    model = {"kind": "server", "name": ep.model, "path": str(path), "base_url": ep.base_url}
    return BenchReport(model, describe_workload(name, requests, config), settings, [BenchRun(label, metrics, records)])
