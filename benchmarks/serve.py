"""HTTP serving: `astrai serve` vs `transformers serve --continuous-batching`, and astrai
over HTTP vs astrai in-process, all measured by `astrai serve-bench`; and structured
outputs' cost: 64 requests with every other one JSON-schema-constrained against the same
requests free (generated tok/s, target >= 0.8), on the preset's byte-level vocabulary and on
a tiny Qwen3 with its 151k-token vocabulary (`--only structured`: that section alone).

    python benchmarks/serve.py [--preset tiny] [--num-prompts 64] [--rate 8] [--quick]

One HF Llama directory (random weights of the preset, init_std=0.1, with a byte-level BPE
tokenizer trained on the bundled corpus) is served by both servers on 127.0.0.1; the same
workload (random prompts of --input-len tokens, at most --output-len new tokens, greedy,
Poisson arrivals at --rate requests/s, seeded) goes to each through
`astrai serve-bench --base-url`, and once to the in-process engine (`astrai serve-bench`
without --base-url). astrai vs in-process uses /v1/completions with token-id prompts (the
identical workload); astrai vs the peer uses /v1/chat/completions, since the peer takes
only text prompts. The peer refuses vLLM's ignore_eos, so EOS may end requests on every
side alike (same weights, greedy: the same tokens). Both servers get the same torch
thread count. Printed: output tokens/s, median TTFT and median ITL of each, and the
ratios: astrai/peer throughput (target >= 2.0), astrai/peer median TTFT (target <= 0.5),
astrai HTTP/in-process throughput (target >= 0.90: the HTTP layer costs under 10%).
When the peer cannot run here (transformers[serving] missing), its rows say so and the
HTTP-overhead ratio is still measured.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from astrai.infer.bench import BenchConfig, parse_range, serve_bench
from astrai.infer.config import CacheConfig

REPO = Path(__file__).resolve().parents[1]


def make_hf_dir(tmp: Path, preset: str) -> Path:
    from astrai.data.testing import tiny_tokenizer
    from astrai.model import build_model, get_preset
    from astrai.model.checkpoint import save_checkpoint
    from astrai.model.hf_export import export_hf

    tok = tiny_tokenizer(tmp)
    cfg = get_preset(preset, vocab_size=tok.vocab_size, init_std=0.1)
    save_checkpoint(tmp / "ckpt", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)
    export_hf(tmp / "ckpt", tmp / "hf")
    return tmp / "hf"


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    with open(log, "wb") as err:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)


def bench(hf: Path, args: argparse.Namespace, base_url: str | None, model: str | None,
          endpoint: str = "/v1/completions"):
    config = BenchConfig(
        target=str(hf), num_prompts=args.num_prompts,
        input_len=parse_range(args.input_len, "--input-len"),
        output_len=parse_range(args.output_len, "--output-len"),
        request_rate=args.rate, seed=0, warmup=2, threads=args.threads, device="cpu",
        cache=CacheConfig(max_kv_tokens=32768, max_requests=64),
        base_url=base_url, model=model, endpoint=endpoint, ignore_eos=False)
    if base_url is None:
        return serve_bench(config).runs[0].metrics
    from astrai.serve.bench import http_serve_bench

    return http_serve_bench(config).runs[0].metrics


def serve_and_bench(name: str, cmd: list[str], url: str, hf: Path, args, tmp: Path,
                    model: str | None, endpoints: tuple[str, ...]) -> list[dict]:
    log = tmp / f"{name}.log"
    proc = start(cmd, log, args.threads)
    try:
        wait_http(url + "/health", proc, log)
        return [bench(hf, args, url, model, ep) for ep in endpoints]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def show(label: str, m: dict) -> None:
    print(f"{label}: {m['output_throughput']:.1f} output tok/s, median TTFT "
          f"{m['median_ttft_ms']:.1f} ms, median ITL {m['median_itl_ms']:.1f} ms, "
          f"{m['completed']} completed, {m['failed']} failed")


STRUCTURED_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0,
                                              "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 4, "items": {
        "enum": ["red", "green", "blue"]}}, "ok": {"type": "boolean"}},
     "required": ["tags", "ok"], "additionalProperties": False},
    {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["id", "score"], "additionalProperties": False}},
]


def structured_run(hf: Path, n: int, constrained: bool, threads: int) -> tuple[float, int]:
    """(generated tok/s, tokens) of `n` requests in one engine, every other one
    schema-constrained when `constrained` (seeded sampling, at most 64 new tokens)."""
    import json

    import torch

    from astrai.infer import Engine, SamplingParams
    from astrai.infer.structured import StructuredOutputs

    torch.set_num_threads(threads)
    eng = Engine.from_checkpoint(hf, device="cpu", dtype="float32")
    prompts = [f"Record {i}: write it as JSON." for i in range(n)]
    params = []
    for i in range(n):
        so = None
        if constrained and i % 2 == 0:
            so = StructuredOutputs(json=STRUCTURED_SCHEMAS[i // 2 % len(STRUCTURED_SCHEMAS)])
        params.append(SamplingParams(max_tokens=64, temperature=1.0, seed=i,
                                     structured_outputs=so))
    eng.generate(prompts[:2], params[:2])  # warm-up (and llguidance's tokenizer view)
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    dt = time.perf_counter() - t0
    if constrained:
        for o, p in zip(outs, params):
            if p.structured_outputs is not None and o.finish_reason == "stop":
                json.loads(o.text)  # it parses
    tokens = sum(len(o.token_ids) for o in outs)
    return tokens / dt, tokens


def structured_section(hf: Path, label: str, args: argparse.Namespace) -> None:
    free, nf = structured_run(hf, args.num_prompts, False, args.threads)
    mixed, nm = structured_run(hf, args.num_prompts, True, args.threads)
    print(f"structured outputs ({label}), {args.num_prompts} requests in-process: "
          f"unconstrained {free:.1f} tok/s ({nf} tokens), half JSON-schema-constrained "
          f"{mixed:.1f} tok/s ({nm} tokens)")
    print(f"ratio structured ({label}): half constrained / unconstrained = "
          f"{mixed / free:.2f} (target >= 0.8)")


def qwen3_vocab_dir(tmp: Path) -> Path | None:
    """A random tiny HF Qwen3 with Qwen3's real 151k-token tokenizer (the test fixture):
    the grammar's mask over a large vocabulary."""
    sys.path.insert(0, str(REPO))
    try:
        from tests.real_tokenizers import tiny_hf_model
        return tiny_hf_model("qwen3", tmp)
    except ImportError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", default="32:128")
    ap.add_argument("--output-len", default="16:64")
    ap.add_argument("--rate", type=float, default=8.0, help="Poisson arrivals, requests/s")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="16 prompts, short outputs")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--only", choices=["structured"], help="run only this section")
    args = ap.parse_args()
    if args.quick:
        args.num_prompts, args.output_len = 16, "8:24"
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hf = make_hf_dir(tmp, args.preset)
        print(f"== preset {args.preset}, {args.num_prompts} requests, input {args.input_len}, "
              f"output {args.output_len}, Poisson {args.rate} req/s, {args.threads} thread(s), "
              "CPU fp32")
        structured_section(hf, f"{args.preset}, byte-level vocabulary", args)
        q3 = qwen3_vocab_dir(tmp)
        if q3 is not None:
            structured_section(q3, "tiny Qwen3, 151k vocabulary", args)
        if args.only == "structured":
            return
        local = bench(hf, args, None, None)
        show("astrai in-process", local)
        port = free_port()
        ours, ours_chat = serve_and_bench(
            "astrai", [sys.executable, "-m", "astrai_cli.main", "serve", str(hf), "--port",
                       str(port), "--device", "cpu", "--dtype", "float32", "--threads",
                       str(args.threads), "--served-model-name", "bench"],
            f"http://127.0.0.1:{port}", hf, args, tmp, "bench",
            ("/v1/completions", "/v1/chat/completions"))
        show("astrai serve (HTTP /v1/completions)", ours)
        show("astrai serve (HTTP /v1/chat/completions)", ours_chat)
        print(f"astrai HTTP / in-process output throughput: "
              f"{ours['output_throughput'] / local['output_throughput']:.2f} (target >= 0.90)")
        peer_exe = shutil.which("transformers")
        if args.no_peer or peer_exe is None:
            print("transformers serve: not run (--no-peer or transformers CLI missing)")
            return
        port = free_port()
        try:
            (peer,) = serve_and_bench(
                "peer", [peer_exe, "serve", str(hf), "--continuous-batching", "--device", "cpu",
                         "--dtype", "float32", "--port", str(port), "--host", "127.0.0.1"],
                f"http://127.0.0.1:{port}", hf, args, tmp, str(hf), ("/v1/chat/completions",))
        except (RuntimeError, TimeoutError) as e:
            print(f"transformers serve: failed to run ({str(e).splitlines()[0]})")
            return
        if peer["completed"] and peer["output_throughput"]:
            show("transformers serve --continuous-batching (HTTP /v1/chat/completions)", peer)
            print(f"ratio astrai/peer (chat): output throughput "
                  f"{ours_chat['output_throughput'] / peer['output_throughput']:.2f}x "
                  f"(target >= 2.0), median TTFT "
                  f"{ours_chat['median_ttft_ms'] / peer['median_ttft_ms']:.2f}x (target <= 0.5)")
        else:
            errs = re.sub(r"\s+", " ", str(peer.get("errors")))[:300]
            print(f"transformers serve: no request completed ({errs})")


if __name__ == "__main__":
    main()
