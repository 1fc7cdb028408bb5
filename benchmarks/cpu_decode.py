"""One-request CPU decode: tokens/s of the engine in fp32, int8 weights and bf16, and of
the CPU peers llama.cpp and CTranslate2 on the same random ~120M Llama.

    python benchmarks/cpu_decode.py --only astrai            # this repository alone
    python benchmarks/cpu_decode.py [--preset 125m] [--threads 2] [--new-tokens 128]

Workload: one request, a 16-token prompt, greedy, `--new-tokens` new tokens with EOS
ignored, `--threads` intra-op threads. Reported: decode tokens/s (1 / the median gap
between streamed tokens; prefill apart, as llama-bench reports `tg`) and CPU ms per token,
the best of `--repeat` runs interleaved across formats so drifting load on a shared
machine hits each alike, and the greedy tokens each format shares with fp32. The weights
are random (init_std 0.1): a deep random network amplifies any rounding, so the token
counts of int8 and bf16 say little about quality — bits per byte on a trained model does
(docs/engine.md "Weight formats").

Peers (not installed by astrai; each runs only when importable):
  llama.cpp    pip install llama-cpp-python   and a GGUF of the same model (`--gguf FILE`;
               `astrai export CKPT --format gguf` where that exporter exists, else llama.cpp's
               convert_hf_to_gguf.py on the HF export this script writes to --workdir/hf)
               quantized with `llama-quantize model.gguf model-q8_0.gguf q8_0`.
  CTranslate2  pip install ctranslate2 transformers
               ct2-transformers-converter --model WORKDIR/hf --output_dir WORKDIR/ct2
                   --quantization int8      (then `--ct2 WORKDIR/ct2`)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.model import build_model, get_preset
from astrai.model.quant import quantize_model


def formats(model: torch.nn.Module, names: list[str]) -> dict[str, torch.nn.Module]:
    """fp32 | int8 (fp32 activations, int8 weights) | bf16 | bf16-int8 copies of `model`."""
    out = {}
    for name in names:
        m = copy.deepcopy(model)
        if name.startswith("bf16"):
            m = m.to(torch.bfloat16)
        if name.endswith("int8"):
            quantize_model(m, "int8")
        out[name] = m.eval()
    return out


def engine(model: torch.nn.Module) -> Engine:
    cache = CacheConfig(page_size=16, max_kv_tokens=4096, max_requests=4)
    return Engine(model, None, cache, scheduler_config=SchedulerConfig(max_step_tokens=512))


def decode_run(eng: Engine, prompt: list[int], new_tokens: int) -> tuple[list[int], float, float]:
    """(tokens, decode tokens/s, CPU ms per token): tokens/s is 1 / the median gap between
    streamed tokens after the first (robust to another process's burst on a shared
    machine); CPU time is the process's over the decode steps."""
    params = SamplingParams.greedy(new_tokens, ignore_eos=True)
    rid = eng.add_request(prompt, params)
    stamps, tokens, c0 = [], [], None
    while True:
        for out in eng.step():
            if out.request_id != rid or not out.token_ids:
                continue
            stamps.append(time.perf_counter())
            if c0 is None:
                c0 = time.process_time()
            tokens = list(out.token_ids)
            if out.finished:
                gaps = [b - a for a, b in zip(stamps, stamps[1:])]
                cpu_ms = (time.process_time() - c0) / max(len(gaps), 1) * 1e3
                return tokens, 1 / statistics.median(gaps), cpu_ms


def bench_astrai(model, names, prompt, new_tokens, repeat) -> dict[str, dict]:
    engines = {n: engine(m) for n, m in formats(model, names).items()}
    for eng in engines.values():
        decode_run(eng, prompt, 8)  # warm-up
    best = {n: 0.0 for n in engines}
    cpu = {n: float("inf") for n in engines}
    toks: dict[str, list[int]] = {}
    for _ in range(repeat):
        for n, eng in engines.items():
            toks[n], tps, cpu_ms = decode_run(eng, prompt, new_tokens)
            best[n], cpu[n] = max(best[n], tps), min(cpu[n], cpu_ms)
    ref = toks.get("fp32")
    return {n: {"tok_s": best[n], "cpu_ms": cpu[n], "same_as_fp32": None if ref is None else
                sum(a == b for a, b in zip(toks[n], ref))} for n in engines}


def bench_llama_cpp(gguf: Path, prompt, new_tokens, threads) -> float | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(gguf), n_threads=threads, n_ctx=512, verbose=False)
    llm.reset()
    llm.eval(prompt)
    t0, n = time.perf_counter(), 0
    for _ in llm.generate(prompt, top_k=1, reset=False):
        n += 1
        if n == new_tokens:
            break
    return (n - 1) / (time.perf_counter() - t0)


def bench_ct2(ct2_dir: Path, prompt, new_tokens, threads) -> float | None:
    try:
        import ctranslate2
    except ImportError:
        return None
    gen = ctranslate2.Generator(str(ct2_dir), device="cpu", intra_threads=threads)
    toks = [str(t) for t in prompt]  # the converter's vocabulary is the id strings' tokens
    t0 = time.perf_counter()
    gen.generate_batch([toks], max_length=new_tokens, sampling_topk=1,
                       include_prompt_in_result=False)
    return new_tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--formats", default="fp32,int8,bf16,bf16-int8")
    ap.add_argument("--only", choices=("astrai",), default=None)
    ap.add_argument("--gguf", type=Path, default=None, help="llama.cpp model of the weights")
    ap.add_argument("--ct2", type=Path, default=None, help="CTranslate2 model directory")
    ap.add_argument("--workdir", type=Path, default=None, help="where the HF export goes")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    config = get_preset(a.preset, init_std=0.1)
    model = build_model(config, seed=0).eval()
    prompt = torch.randint(3, config.vocab_size, (16,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    print(f"{a.preset}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, "
          f"{a.threads} threads, {a.new_tokens} new tokens, CPU "
          f"{torch.backends.cpu.get_cpu_capability()}")
    for name, r in bench_astrai(model, a.formats.split(","), prompt, a.new_tokens,
                                a.repeat).items():
        print(f"  astrai {name:10s} {r['tok_s']:7.1f} tok/s  {r['cpu_ms']:6.1f} CPU ms/token  "
              f"greedy tokens equal to fp32: {r['same_as_fp32']}/{a.new_tokens}")
    if a.only == "astrai":
        return
    work = a.workdir or Path(tempfile.mkdtemp(prefix="cpu_decode_"))
    if not (work / "hf").is_dir():
        from peers import hf_twin  # benchmarks/peers.py: writes work/ckpt and work/hf

        hf_twin(model, work)
        print(f"  HF export for the peers' converters: {work / 'hf'}")
    for name, path, fn in (("llama.cpp", a.gguf, bench_llama_cpp), ("ctranslate2", a.ct2,
                                                                     bench_ct2)):
        tps = None if path is None else fn(path, prompt, a.new_tokens, a.threads)
        print(f"  {name:17s} " + ("not run (see this script's docstring)" if tps is None
                                   else f"{tps:7.1f} tok/s"))


if __name__ == "__main__":
    main()
