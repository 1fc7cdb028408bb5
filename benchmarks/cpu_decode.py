"""CPU decode against llama.cpp, CTranslate2 and HF generate, beside the bandwidth floor.

    pip install llama-cpp-python ctranslate2     # peers (llama-cpp-python builds llama.cpp
                                                 # from source: a few minutes, C++ and CMake)
    python benchmarks/cpu_decode.py              # ~6 min at 2 threads
    python benchmarks/cpu_decode.py --only astrai --threads 1

The model: the `125m` preset with random weights (init_std 0.1; 32,000-token vocabulary,
tied embeddings), saved with a small byte-level BPE so its GGUF export carries a tokenizer
(ids the BPE lacks are placeholders: prompts are token ids). Every peer runs that model:

  astrai       the engine (one request; 16 concurrent), fp32, int8 weights (`--quantize
               int8`) and bf16 where the CPU has bf16 hardware (amx_bf16 / avx512_bf16),
               with astrai's CPU decode GEMVs (astrai/kernels/cpu_linear.py, built at first
               use); fp32-torch / int8-torch: the same engine on torch's products alone
  llama.cpp    llama-cpp-python on the GGUFs `astrai export --format gguf` writes: f32,
               f16 and q8_0 (its KV cache f32, so greedy tokens are comparable), each in its
               own process with llama.cpp's default buffers; where that process dies (seen:
               q8_0 with the AMX buffer type on an AMX machine) once more without its extra
               buffer types, and the row says so
  CTranslate2  float32 and int8 from ct2's converter of the HF export (one request; a
               batch of 16)
  HF           transformers generate on the HF export (one request; a batch of 16)

Decode tokens/s is after the prompt (16 tokens), 128 new tokens, greedy, EOS ignored,
`--threads` threads, best of `--repeat`. The floor of a format is the bytes one token must
read — every block and head weight once, plus one embedding row (llama.cpp: its GGUF's
tensor bytes, the tied table read whole as the output) — over the read bandwidth of a
streaming sum over as many bytes with the same threads (best of 8, measured before and
after the runs, the higher kept): the speed a purely bandwidth-bound decoder reaches. The bandwidth is measured at each format's size because
a format that fits the last-level cache (int8 of this model, on a CPU with a large L3) is
read from that cache; the 1 GiB figure printed beside is DRAM. Printed: each figure, its
fraction of its format's floor, the ratios astrai fp32 / llama.cpp f32, astrai int8 /
llama.cpp q8_0, astrai bf16 / llama.cpp f16 and kernels / torch, the load average before
and after (other work on the machine takes bandwidth and cores). Then the GGUF round
trip: llama.cpp's greedy tokens on f32 exports of this model and of HF Llama and Qwen3
directories (random, small) against astrai's own.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.infer.build import EngineOptions, build_engine
from astrai.model import build_model, get_preset
from astrai.model.checkpoint import save_checkpoint
from astrai.model.gguf_export import export_gguf
from astrai.model.hf_export import export_hf
from astrai.model.quant import quantize_model

CORPUS = Path(__file__).resolve().parent.parent / "astrai" / "assets" / "tiny_corpus.txt"
BATCH = 16


def read_bandwidth(nbytes: int) -> float:
    """Bytes/s of a streaming fp32 sum over a buffer of `nbytes` (best of 8) with torch's
    threads (`--threads`): the rate at which a decoder that reads `nbytes`
    per token can read them — DRAM for a buffer far larger than the caches, partly the
    last-level cache for one about its size."""
    x = torch.ones(max(nbytes, 2**20) // 4)
    x.sum()
    best = float("inf")
    for _ in range(8):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def gguf_bytes(path: Path) -> int:
    """The tensor bytes of a GGUF: what llama.cpp reads per token (its output matrix is the
    tied table, read whole; the lookup's one row is within it)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def bytes_per_token(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: every weight of the blocks and the head once
    (int8: the int8 values and one scale per row), the gains, and one embedding row (a
    tied fp32 head reads the whole table as the head)."""
    total = 0
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for name, t in tensors:
        if "rope" in name or name.endswith("scale_bf16"):
            continue
        if name.endswith("embed_tokens.weight"):
            head_reads_it = getattr(model, "lm_head", None) is None
            total += (t.numel() if head_reads_it else t.shape[1]) * t.element_size()
            continue
        total += t.numel() * t.element_size()
    return total


def formats(model: torch.nn.Module, bf16: bool) -> dict[str, torch.nn.Module]:
    out = {"fp32": model, "int8": quantize_model(copy.deepcopy(model), "int8"),
           "int4": quantize_model(copy.deepcopy(model), "int4")}
    if bf16:
        out["bf16"] = copy.deepcopy(model).to(torch.bfloat16)
    return out


def engine(model: torch.nn.Module, rows: int = 4) -> Engine:
    cache = CacheConfig(page_size=16, max_kv_tokens=rows * 512, max_requests=rows)
    # the builder chat, serve and serve-bench use (huge pages on: the benchmark's own models)
    return build_engine(model, None, EngineOptions(), cache,
                        scheduler=SchedulerConfig(max_step_tokens=1024))


def engine_without_kernels(model: torch.nn.Module) -> Engine:
    """The engine as `engine` builds it, with astrai's CPU kernels off: no native step,
    every product on torch."""
    cache = CacheConfig(page_size=16, max_kv_tokens=BATCH * 512, max_requests=BATCH)
    eng = Engine(model, None, cache, scheduler_config=SchedulerConfig(max_step_tokens=1024),
                 kernels=None)
    assert eng.cpu_kernels is None and eng.stats().decode == "eager"
    return eng


def decode_run(eng: Engine, prompt: list[int], new: int) -> tuple[list[int], float]:
    """(tokens, decode tokens/s): 1 / the median gap between streamed tokens."""
    rid = eng.add_request(prompt, SamplingParams.greedy(new, ignore_eos=True))
    stamps, tokens = [], []
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id == rid and out.token_ids:
                stamps.append(time.perf_counter())
                tokens = list(out.token_ids)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return tokens, 1 / statistics.median(gaps)


def batch_run(eng: Engine, prompts: list[list[int]], new: int) -> float:
    """Aggregate generated tokens/s of `prompts` served together (prefill included)."""
    t0 = time.perf_counter()
    eng.generate(prompts, SamplingParams.greedy(new, ignore_eos=True))
    return len(prompts) * new / (time.perf_counter() - t0)


# -- peers ------------------------------------------------------------------------------------

def llama_cpp_run(gguf: Path, prompt: list[int], new: int, threads: int
                  ) -> tuple[list[int], float]:
    """(greedy tokens, decode tokens/s = 1 / median gap) from llama-cpp-python; f32 KV cache
    (type_k/type_v 0) so the tokens compare with astrai's fp32 ones."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=len(prompt) + new + 8,
                          n_threads=threads, n_threads_batch=threads, verbose=False,
                          type_k=0, type_v=0)
    out, stamps = [], []
    for t in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        stamps.append(time.perf_counter())
        out.append(t)
        if len(out) == new:
            break
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return out, 1 / statistics.median(gaps)


def ct2_model(hf_dir: Path, out: Path, quantization: str) -> Path:
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(hf_dir)).convert(str(out), quantization=quantization,
                                               force=True)
    return out


def ct2_run(model_dir: Path, prompts: list[list[int]], new: int, threads: int) -> float:
    """Generated tokens/s of ct2's generate_batch over `prompts` (prompt time included;
    for one request the prompt is 16 tokens of 144)."""
    import ctranslate2

    gen = ctranslate2.Generator(str(model_dir), device="cpu", intra_threads=threads)
    vocab = ct2_vocabulary(model_dir)
    toks = [[vocab[i] for i in p] for p in prompts]
    gen.generate_batch(toks[:1], max_length=4, sampling_topk=1)  # warm-up
    t0 = time.perf_counter()
    gen.generate_batch(toks, max_length=new, min_length=new, sampling_topk=1,
                       include_prompt_in_result=False, end_token=[])
    return len(prompts) * new / (time.perf_counter() - t0)


def ct2_vocabulary(model_dir: Path) -> list[str]:
    """The token strings ct2 wrote for the model's ids (its prompts are strings)."""
    import json

    f = model_dir / "vocabulary.json"
    if f.is_file():
        return json.loads(f.read_text())
    return (model_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")


def hf_run(hf, prompts: list[list[int]], new: int) -> float:
    """Generated tokens/s of transformers generate (greedy, KV cache, a static batch)."""
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        hf.generate(ids[:1], max_new_tokens=4, min_new_tokens=4, do_sample=False)
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                    attention_mask=torch.ones_like(ids))
    return len(prompts) * new / (time.perf_counter() - t0)


# -- the run ----------------------------------------------------------------------------------

def build(work: Path, preset: str) -> tuple[torch.nn.Module, Path, Path]:
    """(model, astrai checkpoint with a tokenizer, its HF export)."""
    from astrai.data.bpe import train_tokenizer

    train_tokenizer([CORPUS], 512, work / "tok")
    config = get_preset(preset, init_std=0.1)
    model = build_model(config, seed=0).eval()
    save_checkpoint(work / "ckpt", model, config, tokenizer_dir=work / "tok", meta={"step": 0})
    export_hf(work / "ckpt", work / "hf")
    return model, work / "ckpt", work / "hf"


def has_bf16_hardware() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return "amx_bf16" in flags or "avx512_bf16" in flags


def run_astrai(models, prompt, prompts, new, repeat) -> dict[str, dict]:
    """Each format with astrai's CPU decode kernels, and fp32 / int8 once more on torch's
    products alone (`<format>-torch`: the engine without the kernels)."""
    out = {}
    plain = {f"{k}-torch": m for k, m in models.items() if k in ("fp32", "int8")}
    for name, m in {**models, **plain}.items():
        torch_only = name.endswith("-torch")
        eng = engine_without_kernels(m) if torch_only else engine(m, rows=BATCH)
        decode_run(eng, prompt, 8)  # warm-up
        runs = [decode_run(eng, prompt, new) for _ in range(repeat)]
        out[name] = {"tokens": runs[-1][0], "tok_s": max(r[1] for r in runs)}
        if not torch_only:
            out[name]["batch_tok_s"] = batch_run(eng, prompts, new)
    return out


LLAMA_FORMATS = (("f32", {"dtype": torch.float32}), ("f16", {"dtype": torch.float16}),
                 ("q8_0", {"quantize": "q8_0"}), ("q4_0", {"quantize": "q4_0"}))


def run_llama_cpp(ckpt: Path, work: Path, prompt, new, threads, repeat) -> dict[str, dict]:
    """Each GGUF in its own process, with llama.cpp's default buffers (AMX, repacked
    weights) first; where that process dies (seen: q8_0 on an AMX machine, whose AMX buffer
    type llama-cpp-python's native build enables), once more without them
    (`use_extra_bufts` off), the row saying so."""
    if importlib.util.find_spec("llama_cpp") is None:
        return {}
    out, first_rc = {}, None
    for name, kw in LLAMA_FORMATS:
        f = export_gguf(ckpt, work / f"model-{name}.gguf", overwrite=True, **kw)
        for extra in (True, False):
            job = json.dumps({"gguf": str(f), "prompt": prompt, "new": new,
                              "threads": threads, "repeat": repeat, "extra_bufts": extra})
            r = subprocess.run([sys.executable, __file__, "--llama-worker", job],
                               capture_output=True, text=True)
            if r.returncode == 0:
                out[name] = json.loads(r.stdout.strip().splitlines()[-1])
                out[name]["bytes"] = gguf_bytes(f)
                if not extra:
                    out[name]["note"] = "(extra buffers off: the default exited with " \
                                        f"{first_rc})"
                break
            first_rc = r.returncode
            out[name] = {"error": f"llama.cpp exited with {r.returncode}"}
    return out


def llama_worker(job: str) -> None:
    j = json.loads(job)
    if not j.get("extra_bufts", True):
        import llama_cpp.llama_cpp as lc

        defaults = lc.llama_model_default_params

        def params():
            p = defaults()
            p.use_extra_bufts = False
            return p

        lc.llama_model_default_params = params  # what Llama() reads its defaults from
    runs = [llama_cpp_run(Path(j["gguf"]), j["prompt"], j["new"], j["threads"])
            for _ in range(j["repeat"])]
    print(json.dumps({"tokens": runs[-1][0], "tok_s": max(r[1] for r in runs)}))


def run_ct2(hf_dir: Path, work: Path, prompt, prompts, new, threads, repeat) -> dict[str, dict]:
    if importlib.util.find_spec("ctranslate2") is None:
        return {}
    out = {}
    for q in ("float32", "int8"):
        d = ct2_model(hf_dir, work / f"ct2-{q}", q)
        out[q] = {"tok_s": max(ct2_run(d, [prompt], new, threads) for _ in range(repeat)),
                  "batch_tok_s": ct2_run(d, prompts, new, threads)}
    return out


def run_hf(hf_dir: Path, prompt, prompts, new, repeat) -> dict[str, float]:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
    hf.generation_config.pad_token_id = 0
    hf.generation_config.eos_token_id = None
    return {"tok_s": max(hf_run(hf, [prompt], new) for _ in range(repeat)),
            "batch_tok_s": hf_run(hf, prompts, new)}


def gguf_round_trip(work: Path, threads: int, new: int = 32) -> list[str]:
    """llama.cpp's greedy tokens on the f32 GGUF of a random HF Llama and Qwen3 directory
    (the BPE's files beside them) against astrai's engine on the same directory."""
    import shutil

    from peers import hf_causal_lm  # benchmarks/peers.py

    from astrai.model.config import ModelConfig

    lines = []
    for name, qk in (("llama", False), ("qwen3", True)):
        c = ModelConfig(vocab_size=512, dim=256, n_layers=4, n_heads=8, n_kv_heads=4,
                        ffn_dim=512, max_seq_len=512, qk_norm=qk)
        d = work / f"hf-{name}"
        hf_causal_lm(c, seed=1).save_pretrained(d, safe_serialization=True)
        for f in (work / "tok").iterdir():
            shutil.copy(f, d / f.name)
        prompt = list(range(3, 19))
        ours = Engine.from_checkpoint(d, device="cpu").generate(
            [prompt], SamplingParams.greedy(new, ignore_eos=True))[0].token_ids
        theirs, _ = llama_cpp_run(export_gguf(d, work / f"{name}.gguf", dtype=torch.float32),
                                  prompt, new, threads)
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        lines.append(f"  GGUF f32 of a HF {name} dir: llama.cpp greedy tokens "
                     f"{'equal' if diff is None else f'differ from position {diff}'} "
                     f"({new} tokens)")
    return lines


class Floors:
    """Bytes per token of each format, the bandwidth of reading as many bytes (a streaming
    sum over a buffer of that size, so a format whose weights fit the last-level cache is
    measured against that cache), and the speed that allows."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.bw: dict[int, float] = {}

    def add(self, name: str, nbytes: int) -> None:
        self.bytes[name] = nbytes
        if nbytes not in self.bw:
            self.bw[nbytes] = read_bandwidth(nbytes)

    def remeasure(self) -> None:
        """Measure every size again and keep the higher figure (the machine's load moves
        its bandwidth; a floor is the best the memory gave)."""
        for n in self.bw:
            self.bw[n] = max(self.bw[n], read_bandwidth(n))

    def tok_s(self, name: str) -> float | None:
        n = self.bytes.get(name)
        return None if n is None else self.bw[n] / n

    def lines(self) -> list[str]:
        return [f"  {k:22s} {n / 1e6:6.0f} MB at {self.bw[n] / 1e9:5.1f} GB/s = "
                f"{self.bw[n] / n:6.0f} tok/s" for k, n in self.bytes.items()]


def cell(name: str, tps: float, floor: float | None) -> str:
    frac = f" ({tps / floor:.2f} of its floor {floor:.0f})" if floor else ""
    return f"  {name:22s} {tps:8.1f} tok/s{frac}"


def report_one(a, floors: Floors, ours, llama, ct2, hf) -> None:
    print(f"one request, {a.new_tokens} new tokens (decode tok/s = 1 / median gap):")
    for k, r in ours.items():
        same = sum(x == y for x, y in zip(r["tokens"], ours["fp32"]["tokens"]))
        print(cell(f"astrai {k}", r["tok_s"], floors.tok_s(f"astrai {k.split('-')[0]}"))
              + f"  tokens = fp32: {same}")
    for k, r in llama.items():
        if "error" in r:
            print(f"  {'llama.cpp ' + k:22s} {r['error']}")
            continue
        same = sum(x == y for x, y in zip(r["tokens"], ours["fp32"]["tokens"]))
        print(cell(f"llama.cpp {k}", r["tok_s"], floors.tok_s(f"llama.cpp {k}"))
              + f"  tokens = astrai fp32: {same} {r.get('note', '')}".rstrip())
    for k, r in ct2.items():
        fmt = "fp32" if k == "float32" else "int8"
        print(cell(f"CTranslate2 {k}", r["tok_s"], floors.tok_s(f"astrai {fmt}")))
    if hf:
        print(cell("HF generate fp32", hf["tok_s"], floors.tok_s("astrai fp32")))
    for ours_k, peer_k in (("fp32", "f32"), ("int8", "q8_0"), ("int4", "q4_0"),
                           ("bf16", "f16")):
        if "tok_s" in llama.get(peer_k, {}) and ours_k in ours:
            print(f"ratio astrai {ours_k} / llama.cpp {peer_k} = "
                  f"{ours[ours_k]['tok_s'] / llama[peer_k]['tok_s']:.2f}")
    for k in ("fp32", "int8"):
        print(f"ratio astrai {k} kernels / torch products = "
              f"{ours[k]['tok_s'] / ours[k + '-torch']['tok_s']:.2f}")
    if ct2:
        print(f"ratio astrai fp32 / CTranslate2 float32 = "
              f"{ours['fp32']['tok_s'] / ct2['float32']['tok_s']:.2f}; astrai int8 / "
              f"CTranslate2 int8 = {ours['int8']['tok_s'] / ct2['int8']['tok_s']:.2f}")


def report_batch(ours, ct2, hf) -> None:
    print(f"{BATCH} concurrent requests (aggregate generated tok/s, prefill included):")
    for k, r in ours.items():
        if "batch_tok_s" in r:
            print(f"  astrai {k:15s} {r['batch_tok_s']:8.1f} tok/s")
    for k, r in ct2.items():
        print(f"  CTranslate2 {k:10s} {r['batch_tok_s']:8.1f} tok/s (one static batch)")
    if hf:
        print(f"  HF generate fp32     {hf['batch_tok_s']:8.1f} tok/s (one static batch)")
    if ct2 and hf:
        print(f"ratio {BATCH} concurrent: astrai fp32 / CTranslate2 float32 = "
              f"{ours['fp32']['batch_tok_s'] / ct2['float32']['batch_tok_s']:.2f}; astrai fp32 /"
              f" HF = {ours['fp32']['batch_tok_s'] / hf['batch_tok_s']:.2f}")
    if ct2:
        print(f"ratio {BATCH} concurrent: astrai int8 / CTranslate2 int8 = "
              f"{ours['int8']['batch_tok_s'] / ct2['int8']['batch_tok_s']:.2f}")


def header(a, model, floors: Floors) -> None:
    from astrai.kernels.cpu_linear import cpu_decode_kernels

    k = cpu_decode_kernels()
    print(f"{a.preset}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, "
          f"{a.threads} threads, torch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, astrai CPU decode kernels: "
          f"{k.name if k else 'none (torch)'}; load average {os.getloadavg()[0]:.2f}")
    print(f"read bandwidth (streaming sum, {a.threads} threads): "
          f"{read_bandwidth(2**30) / 1e9:.1f} GB/s over 1 GiB; floors, weight bytes per "
          "token over the bandwidth of reading as many:")
    print("\n".join(floors.lines()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("astrai",), default=None)
    ap.add_argument("--llama-worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llama_worker:
        return llama_worker(a.llama_worker)
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="cpu_decode_") as tmp:
        work = Path(tmp)
        model, ckpt, hf_dir = build(work, a.preset)
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(3, model.config.vocab_size, (BATCH, 16), generator=g).tolist()
        prompt = prompts[0]
        models = formats(model, has_bf16_hardware())
        floors = Floors()
        for k, m in models.items():
            floors.add(f"astrai {k}", bytes_per_token(m))
        ours = run_astrai(models, prompt, prompts, a.new_tokens, a.repeat)
        llama = ct2 = hf = {}
        if a.only is None:
            llama = run_llama_cpp(ckpt, work, prompt, a.new_tokens, a.threads, a.repeat)
            ct2 = run_ct2(hf_dir, work, prompt, prompts, a.new_tokens, a.threads, a.repeat)
            hf = run_hf(hf_dir, prompt, prompts, a.new_tokens, a.repeat)
        for k, r in llama.items():
            if "bytes" in r:
                floors.add(f"llama.cpp {k}", r["bytes"])
        floors.remeasure()
        header(a, model, floors)
        report_one(a, floors, ours, llama, ct2, hf)
        report_batch(ours, ct2, hf)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        if "tokens" in llama.get("f32", {}):
            print("\n".join(gguf_round_trip(work, a.threads)))


if __name__ == "__main__":
    main()
