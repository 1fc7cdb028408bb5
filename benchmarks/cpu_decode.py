"""CPU decode: astrai against llama.cpp's own llama-bench, interleaved, formats matched.

    python benchmarks/cpu_decode.py            # the full run: ~40 min at 2 threads, 25 of
                                               # them training the quality model (AMD EPYC)
    python benchmarks/cpu_decode.py --quick    # 125m only, 3 rounds, no contention
    python benchmarks/cpu_decode.py --isa avx2 # both tools on their AVX2 code (an AVX-512
                                               # machine standing in for one without it)

llama.cpp: `llama-bench` and `llama-batched-bench` built from the llama.cpp vendored in
llama-cpp-python 0.3.36's sdist at first use (benchmarks/llama_bench_build.py; cached under
~/.cache/astrai/), CPU backend, run on GGUFs that `astrai export --format gguf` writes from
the same checkpoint astrai runs (cpu_decode_llama.py). astrai: the engine chat/serve build,
measured the way those tools measure (cpu_decode_astrai.py). Instruction path (`--isa`):
`native`, each tool's best for this CPU (llama.cpp `-DGGML_NATIVE=ON`, astrai's best build);
`avx2`, both on AVX2 + FMA code only (llama.cpp `-DGGML_NATIVE=OFF` with AVX-512 off, astrai
`ASTRAI_CPU_ISA=avx2`), the code a CPU without AVX-512 runs (bf16 ↔ bf16 skipped).

Figures: pp512 and tg128 with one request, and with 4 concurrent requests (512-token prompts,
then 128 tokens each, decoded together) on the smaller shape; tokens/s. Shapes (random weights,
init std 0.1, 32,000-token vocabulary): `125m` (the preset, 117M, tied embeddings) and `1b`
(TinyLlama-1.1B's shape: d2048, 22 layers, 32/4 heads, SwiGLU 5632; its int8 and int4 only by
default: fp32 tg128 of 4.4 GB weights costs ~30 s a run here; `--big-formats fp32,int8,int4`).
Formats matched pairwise: astrai fp32 ↔ llama.cpp f32, bf16 ↔ bf16 (only on a CPU with bf16
instructions), int8 (per-row scales) ↔ q8_0 (blocks of 32), int4 ↔ q4_0 (the same values).

Rounds (`--rounds`, at least 5 for a figure to quote): each runs every (shape, tool, format,
setting) once, in an order shuffled by a seeded generator; printed: median [min–max]. A peer
that fails, or whose median is under a tenth of its format's bandwidth floor (its weight bytes
per token over the measured read bandwidth), is BROKEN with its error and gets no ratio.
Contention: tg128 of one request with one `while True: pass` process beside each measurement
(both tools), printed as the fraction of the idle median. Quality (bits per byte, greedy
tokens) is on a small TRAINED model, the quickstart's (cpu_decode_quality.py), not on the
random-weight speed shapes.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_decode_astrai as ours
import cpu_decode_llama as theirs
from cpu_decode_setup import Job, Results, Shape, build_shape, has_bf16_hardware

TARGETS = {"tg": 1.2, "pp": 1.0, "contention": 0.4, "int4_over_int8": 1.7}


@contextmanager
def spinner(on: bool):
    """One CPU-bound process beside the measurement (`on`), ended by its pid after."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        time.sleep(0.2 if on else 0)
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def run_job(job: Job, shapes: dict[str, Shape], tools: dict, threads: int):
    s = shapes[job.shape]
    batch = 4 if job.setting == "b4" else 1
    pp = job.setting != "contended"
    with spinner(job.setting == "contended"):
        if job.tool == "astrai":
            eng = s.engines_4k[job.fmt] if job.setting == "b1-4k" else s.engines[job.fmt]
            return ours.measure(eng, s.prompts, batch, pp=pp)
        gguf = s.ggufs[job.fmt]
        if batch == 4:
            return theirs.batched(tools["llama-batched-bench"], gguf, threads)
        fig, row = theirs.bench(tools["llama-bench"], gguf, threads, pp=pp)
        s.llama_conditions = s.llama_conditions or theirs.conditions(row)
        return fig


def jobs_of(shapes: dict[str, Shape], contention: bool) -> list[Job]:
    out = []
    for name, s in shapes.items():
        for fmt in s.engines:
            settings = ["b1"] + (["b4"] if s.concurrent else [])
            settings += ["contended"] if contention and s.concurrent else []
            for st in settings:
                out += [Job(name, "astrai", fmt, st), Job(name, "llama.cpp", fmt, st)]
            if fmt in s.engines_4k:
                out.append(Job(name, "astrai", fmt, "b1-4k"))
    return out


def run_rounds(shapes, tools, jobs: list[Job], rounds: int, threads: int, seed: int,
               log) -> Results:
    res = Results()
    for r in range(rounds):
        order = list(jobs)
        random.Random(seed * 1000 + r).shuffle(order)
        t0 = time.perf_counter()
        for job in order:
            if job in res.errors:
                continue  # a crashed peer is not rerun each round
            try:
                fig = run_job(job, shapes, tools, threads)
            except theirs.PeerError as e:
                res.errors[job] = str(e)
                continue
            if fig.pp is not None:
                res.pp.setdefault(job, []).append(fig.pp)
            res.tg.setdefault(job, []).append(fig.tg)
        log(f"round {r + 1}/{rounds}: {time.perf_counter() - t0:.0f} s")
    return res


def main(argv: list[str] | None = None) -> int:
    from cpu_decode_report import report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="125m only, 3 rounds, no contention, a shorter-trained quality model")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (--quick: 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--big-formats", default="int8,int4",
                    help="formats of the 1b shape (fp32 costs ~30 s a run)")
    ap.add_argument("--quality-steps", type=int, default=None,
                    help="quickstart steps of the quality model (default 300; --quick 100)")
    ap.add_argument("--quality-checkpoint", type=Path, default=None,
                    help="a quickstart checkpoint already trained (skips the training)")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="native: each tool's best code for this CPU; avx2: both on AVX2 + FMA")
    a = ap.parse_args(argv)
    rounds = a.rounds or (3 if a.quick else 5)
    steps = a.quality_steps or (100 if a.quick else 300)
    torch.set_num_threads(a.threads)
    # before astrai's kernels load (the quality run's subprocesses inherit it): native is the
    # best build for this CPU whatever the shell set
    if a.isa == "avx2":
        os.environ["ASTRAI_CPU_ISA"] = "avx2"
    else:
        os.environ.pop("ASTRAI_CPU_ISA", None)
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    from llama_bench_build import llama_binding, llama_tools

    log("llama.cpp tools (built once, cached)")
    tools = llama_tools(isa=a.isa)
    bf16 = has_bf16_hardware() and a.isa == "native"
    with tempfile.TemporaryDirectory(prefix="cpu_decode_") as tmp:
        work = Path(tmp)
        quality = None
        if not a.no_quality:
            import cpu_decode_quality

            log("llama-cpp-python for the quality columns (installed once)")
            if (note := llama_binding()) is not None:
                log(note)
            log(f"quality model: {a.quality_checkpoint or f'astrai quickstart --steps {steps}'}"
                ", bits per byte, greedy tokens")
            quality = cpu_decode_quality.measure(work, steps, a.threads, a.quality_checkpoint)
        shapes = {}
        for name in (("125m",) if a.quick else ("125m", "1b")):
            log(f"shape {name}: model, GGUF exports, engines")
            fmts = ["fp32", "int8", "int4"] + (["bf16"] if bf16 else [])
            if name == "1b":
                fmts = [f for f in a.big_formats.split(",") if f != "bf16" or bf16]
            shapes[name] = build_shape(name, fmts, work, concurrent=name == "125m")
        jobs = jobs_of(shapes, contention=not a.quick)
        log(f"{len(jobs)} measurements a round, {rounds} rounds")
        res = run_rounds(shapes, tools, jobs, rounds, a.threads, a.seed, log)
        failed = report(a, shapes, res, quality, bf16, load_before, TARGETS)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
