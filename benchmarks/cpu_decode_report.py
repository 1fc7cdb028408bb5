"""What cpu_decode.py prints: the machine, then per shape a table of medians [min–max], the
ratios astrai / llama.cpp per matched format with PASS / MISS against the targets, the
contention fractions, the quality table; BROKEN peers named with their error."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from cpu_decode_setup import LLAMA_FORMAT, Job, read_bandwidth

ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
       "amx_tile", "amx_int8", "amx_bf16")
SETTINGS = {"b1": "1 request", "b1-4k": "1 request, 4 KiB pages", "b4": "4 concurrent",
            "contended": "1 request + 1 busy process"}


def cpu_lines(threads: int, load_before: tuple, bf16: bool, isa_path: str) -> list[str]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                  if ln.startswith("model name")), platform.processor())
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                      if ln.startswith("flags")), []))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent, check=False).stdout.strip()
    from astrai.kernels.cpu_linear import cpu_decode_kernels

    k = cpu_decode_kernels()
    kern = k.name if k else "none (torch)"
    isa = " ".join(f for f in ISA if f in flags) or "none of " + "/".join(ISA)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    bw = read_bandwidth(2**30) / 1e9
    pages = ("page policy: astrai moves its weights into 2 MiB transparent huge pages (as chat "
             "and serve do); llama.cpp mmaps the GGUF (4 KiB pages of the page cache); the "
             "'4 KiB pages' rows run astrai with its weights left in ordinary pages")
    bf = ("bf16: this CPU has bf16 instructions (avx512_bf16/amx_bf16): bf16 ↔ bf16 runs"
          if bf16 else "bf16 ↔ bf16: skipped (this CPU has no avx512_bf16/amx_bf16)"
          if isa_path == "native" else "bf16 ↔ bf16: skipped (--isa avx2)")
    path = ("instruction path: native (llama.cpp -DGGML_NATIVE=ON, astrai's best build)"
            if isa_path == "native" else
            "instruction path: AVX2 + FMA on both (--isa avx2: llama.cpp -DGGML_NATIVE=OFF "
            "-DGGML_AVX2=ON -DGGML_AVX512=OFF, astrai ASTRAI_CPU_ISA=avx2)")
    return [f"date {now}, astrai commit {commit or '?'}, torch {torch.__version__}",
            f"CPU {model}, {os.cpu_count()} logical cores; ISA: {isa}",
            f"threads {threads} (both tools); astrai CPU decode kernels: {kern}", path,
            f"read bandwidth (streaming sum, {threads} threads, 1 GiB): {bw:.1f} GB/s",
            f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}",
            pages, bf]


def fmt_figure(xs: list[float] | None) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs):8.1f} [{min(xs):.1f}–{max(xs):.1f}]"


def median(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


SANITY = 0.1  # of a format's bandwidth floor: below it a peer is BROKEN


def broken(s, res, job) -> str | None:
    """Why a figure cannot be used: the tool failed, or it ran under the sanity floor."""
    if job in res.errors:
        return res.errors[job]
    floor = s.floor(job.tool, job.fmt)
    if job.setting in ("b1", "b1-4k") and floor:
        for kind, xs in (("tg128", res.tg.get(job)), ("pp512", res.pp.get(job))):
            if xs and statistics.median(xs) < SANITY * floor:
                return (f"{kind} {statistics.median(xs):.1f} tok/s is under {SANITY:.0%} of its "
                        f"bandwidth floor {floor:.0f} tok/s")
    return None


def table(s, res) -> list[str]:
    cols = (f"  {'tool format':22s} {'setting':28s} {'pp512 tok/s':>28s} "
            f"{'tg128 tok/s':>28s}  floor")
    out = [f"== {s.name}: {s.params / 1e6:.0f}M parameters, random weights ==", cols]
    for fmt in s.engines:
        for tool, name in (("astrai", fmt), ("llama.cpp", LLAMA_FORMAT[fmt][0])):
            for st, label in SETTINGS.items():
                job = Job(s.name, tool, fmt, st)
                if job not in res.tg and job not in res.errors:
                    continue
                why = broken(s, res, job)
                floor = s.floor(tool, fmt)
                head = f"  {tool + ' ' + name:22s} {label:28s}"
                figs = (f" {fmt_figure(res.pp.get(job)):>28s} "
                        f"{fmt_figure(res.tg.get(job)):>28s}  {floor or 0:5.0f}")
                out.append(head + (f" BROKEN: {why}" if why else figs))
    return out


def verdict(x: float | None, target: float) -> str:
    return "—" if x is None else f"{x:.2f} (target ≥ {target}) {'PASS' if x >= target else 'MISS'}"


def ratios(s, res, targets) -> tuple[list[str], bool]:
    """astrai / llama.cpp per matched format (pp512, tg128; 1 request and 4 concurrent), the
    contention fractions and, on 1b, int4 / int8; (lines, any target missed)."""
    out, missed = [], False
    for fmt in s.engines:
        peer = LLAMA_FORMAT[fmt][0]
        for st in ("b1", "b4"):
            a, p = Job(s.name, "astrai", fmt, st), Job(s.name, "llama.cpp", fmt, st)
            if a not in res.tg and a not in res.errors:
                continue
            bad = broken(s, res, a) or broken(s, res, p)
            for kind, d, t in (("pp512", res.pp, targets["pp"]), ("tg128", res.tg, targets["tg"])):
                label = f"ratio {s.name} {kind} {SETTINGS[st]}: astrai {fmt} / llama.cpp {peer}"
                if bad:
                    out.append(f"{label}: no ratio (BROKEN: {bad})")
                    continue
                x, y = median(d.get(a)), median(d.get(p))
                r = x / y if x and y else None
                missed |= r is not None and r < t
                out.append(f"{label} = {x:.1f} / {y:.1f} = {verdict(r, t)}")
    return out + contention(s, res, targets), missed


def contention(s, res, targets) -> list[str]:
    out = []
    for fmt in s.engines:
        for tool, name in (("astrai", fmt), ("llama.cpp", LLAMA_FORMAT[fmt][0])):
            idle, busy = Job(s.name, tool, fmt, "b1"), Job(s.name, tool, fmt, "contended")
            if busy not in res.tg:
                continue
            i, b = median(res.tg.get(idle)), median(res.tg.get(busy))
            if i and b:
                out.append(f"contention {s.name} tg128 {tool} {name}: {b:.1f} / {i:.1f} idle = "
                           + (verdict(b / i, targets["contention"]) if tool == "astrai"
                              else f"{b / i:.2f}"))
    a4, a8 = (median(res.tg.get(Job(s.name, "astrai", f, "b1"))) for f in ("int4", "int8"))
    if s.name == "1b" and a4 and a8:
        out.append(f"target {s.name} tg128 astrai int4 / int8 = {a4:.1f} / {a8:.1f} = "
                   + verdict(a4 / a8, targets["int4_over_int8"]))
    return out


def report(a, shapes, res, quality, bf16, load_before, targets) -> bool:
    """Print everything; True where a token check failed (the run's exit status)."""
    for s in shapes.values():
        s.remeasure()
    print("\n".join(cpu_lines(a.threads, load_before, bf16, a.isa)))
    for s in shapes.values():
        if s.llama_conditions:
            print(f"llama-bench ({s.name}): {s.llama_conditions}")
    print("astrai: KV cache float16 under fp32 / int8 / int4 weights, bf16 under bf16 "
          "(llama.cpp's type_k / type_v above)")
    print(f"rounds: {a.rounds or (3 if a.quick else 5)}, interleaved, seeded order "
          f"(--seed {a.seed}); figures: median [min–max]; floor: weight bytes per token over "
          f"the read bandwidth of as many bytes (tok/s); BROKEN: failed or < {SANITY:.0%} of "
          "its floor")
    for s in shapes.values():
        print("\n".join(table(s, res)))
        lines, _ = ratios(s, res, targets)
        print("\n".join(lines))
    failed = False
    if quality is not None:
        from cpu_decode_quality import lines as quality_lines

        q = quality_lines(quality)
        failed = any(ln.startswith("tokens") and "FAIL" in ln for ln in q)
        print("\n".join(q))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return failed
