"""Every benchmark against its peer, in one run, as one markdown table of ratios.

    python benchmarks/run_all.py                      # all, modest sizes -> docs/benchmarks.md
    python benchmarks/run_all.py --only preprocess,inference --out /tmp/bench.md
    python benchmarks/run_all.py --list               # what would run, and how

Each benchmark in benchmarks/ is run as its own process (so one's threads, memory and
imports never touch another's) with modest sizes, its printed figures are parsed, and one
row per measure goes into the table: astrai's figure, the peer's, and the ratio as the
benchmark defines it (its "better" column says which way is good). The kernel benchmark
runs only with CUDA. The machine (CPU, cores, memory, GPU, torch, load average before and
after) heads the report, and every benchmark's full output follows the table, so a figure
that could not be parsed is still there to read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass
class Row:
    benchmark: str
    measure: str
    astrai: str
    peer: str
    ratio: str
    better: str
    """Which way the ratio is good, e.g. '> 1 (target >= 0.70)'."""


@dataclass
class Bench:
    name: str
    script: str
    args: list[str]
    parse: Callable[[str], list[Row]]
    peer: str
    cuda: bool = False
    timeout_s: float = 1800
    extra: list[str] = field(default_factory=list)
    """Arguments appended at run time (e.g. a JSON output path)."""
    cpu_flags: tuple[str, ...] = ()
    """CPU features it needs (e.g. bf16 matrix units); skipped on a CPU without them."""

    def skip_reason(self, flags: set[str], cuda: bool) -> str | None:
        if self.cuda and not cuda:
            return "needs CUDA"
        missing = [f for f in self.cpu_flags if f not in flags]
        return f"needs a CPU with {', '.join(missing)}" if missing else None


# -- parsers: one per benchmark's printed format --------------------------------------------

NUM = r"([\d,]+(?:\.\d+)?)"


def _f(s: str) -> float:
    return float(s.replace(",", ""))


def _fmt(x: float, unit: str = "") -> str:
    s = f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}" if abs(x) >= 1 else f"{x:.3g}"
    return f"{s} {unit}".strip()


def parse_preprocess(out: str) -> list[Row]:
    rows = []
    ours = re.search(r"astrai preprocess .*?:\s*" + NUM + " tokens/s", out)
    peer = re.search(r"tokenizers encode_batch\s+:\s*" + NUM + " tokens/s", out)
    ratio = re.search(r"throughput ratio vs encode_batch\s*:\s*([\d.]+)", out)
    if ours and peer and ratio:
        rows.append(Row("preprocess", "throughput, start-up excluded",
                        _fmt(_f(ours[1]), "tok/s"), _fmt(_f(peer[1]), "tok/s"), ratio[1],
                        "> 1 faster (target ≥ 0.70)"))
    mem = re.search(r"peak RSS 1x: (\d+) MB, (\d+)x: (\d+) MB, ratio ([\d.]+)", out)
    if mem:
        rows.append(Row("preprocess", f"peak RSS, {mem[2]}x corpus vs 1x", f"{mem[3]} MB",
                        f"{mem[1]} MB (1x)", mem[4], "< 1.30 flat memory"))
    return rows


def parse_train(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"(\S+): astrai " + NUM + r" tok/s \(MFU ([\d.]+%)\) \| HF Llama "
                         + NUM + r" tok/s.*?\| plain loop " + NUM + " tok/s", out):
        preset = m[1]
        r = re.search(re.escape(preset) + r": ratio astrai/HF = ([\d.]+), astrai/plain = "
                      r"([\d.]+)", out)
        if r:
            rows.append(Row("training", f"{preset}: tokens/s vs HF LlamaForCausalLM (MFU {m[3]})",
                            _fmt(_f(m[2]), "tok/s"), _fmt(_f(m[4]), "tok/s"), r[1], "> 1 faster"))
            rows.append(Row("training", f"{preset}: tokens/s vs a plain torch loop",
                            _fmt(_f(m[2]), "tok/s"), _fmt(_f(m[5]), "tok/s"), r[2], "> 1 faster"))
    return rows


def parse_distributed(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"(\S+) compile=(\S+): (.*)\n\s+(.*ddp/1-process.*)", out):
        cells = dict(re.findall(r"([^|]+?) " + NUM + r" tok/s", m[3]))
        cells = {k.strip(): _f(v) for k, v in cells.items()}
        ddp = next((k for k in cells if k.startswith("astrai ddp")), None)
        plain = next((k for k in cells if k.startswith("plain DDP")), None)
        one = cells.get("1 process")
        r = re.search(r"astrai-ddp/plain-DDP ([\d.]+)", m[4])
        if ddp and plain and r:
            rows.append(Row("training, distributed", f"{m[1]}: {ddp} vs {plain} (CPU, gloo)",
                            _fmt(cells[ddp], "tok/s"), _fmt(cells[plain], "tok/s"), r[1],
                            "> 1 faster"))
        s = re.search(r"ddp/1-process ([\d.]+)", m[4])
        if ddp and one and s:
            rows.append(Row("training, distributed", f"{m[1]}: {ddp} vs 1 process (scaling)",
                            _fmt(cells[ddp], "tok/s"), _fmt(one, "tok/s"), s[1],
                            "> 1 scales (2 CPU cores: well below 2)"))
    return rows


def parse_checkpoints(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"(\S+) \(([\d.]+)M parameters\):\n(.*?)\n\s+ratio dcp/full: save time "
                         r"([\d.]+), rank-0 peak memory ([\d.]+); async step time / no "
                         r"checkpoints ([\d.]+)", out, re.S):
        cells = dict(re.findall(r"^\s+(\S+)\s+([\d.]+) s save", m[3], re.M))
        mem = dict(re.findall(r"^\s+(\S+)\s+[\d.]+ s save \[[^]]*\] \| ([\d.]+) MiB", m[3],
                              re.M))
        if "dcp" in cells and "full" in cells:
            rows.append(Row("checkpoints", f"{m[1]} ({m[2]}M), fsdp x2: save time, DCP vs full",
                            _fmt(_f(cells["dcp"]), "s"), _fmt(_f(cells["full"]), "s"), m[4],
                            "< 1 faster"))
            rows.append(Row("checkpoints", f"{m[1]} ({m[2]}M): rank-0 memory during the save",
                            _fmt(_f(mem["dcp"]), "MiB"), _fmt(_f(mem["full"]), "MiB"), m[5],
                            "< 1 less"))
            rows.append(Row("checkpoints", f"{m[1]}: step time with async DCP saves vs none",
                            "", "", m[6], "~1 hidden"))
    return rows


def parse_inference(out: str) -> list[Row]:
    rows = []
    for block in re.split(r"\n== preset ", out)[1:]:
        preset = block.split()[0]
        a = re.search(r"\(a\) one request at a time: engine ([\d.]+) tok/s, HF ([\d.]+) tok/s "
                      r"-> ([\d.]+)x HF", block)
        if a:
            rows.append(Row("inference", f"{preset}: one request, greedy decode",
                            f"{a[1]} tok/s", f"{a[2]} tok/s", a[3], "> 1 faster"))
        b = re.search(r"\(b\) 64 mixed requests: engine ([\d.]+) tok/s, HF static batches of "
                      r"16 ([\d.]+) tok/s -> ([\d.]+)x HF", block)
        if b:
            rows.append(Row("inference", f"{preset}: 64 mixed requests (continuous batching "
                            "vs static batches of 16)", f"{b[1]} tok/s", f"{b[2]} tok/s", b[3],
                            "> 1 faster"))
        c = re.search(r"\(c\) shared prefix: TTFT p50 (\d+) ms with radix vs (\d+) ms without "
                      r"-> ([\d.]+)x", block)
        if c:  # printed as radix / none; the table's ratios are peer / astrai for speed
            rows.append(Row("inference", f"{preset}: shared-prefix TTFT p50, radix cache vs none",
                            f"{c[1]} ms", f"{c[2]} ms", f"{_f(c[2]) / _f(c[1]):.2f}",
                            "> 1 faster"))
    return rows


def parse_speculative(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"\(s\) speculative (\w+(?: k=\d+)?): ([\d.]+) tok/s vs plain ([\d.]+) tok/s "
                         r"-> ([\d.]+)x .*?acceptance ([\d.]+)%", out):
        rows.append(Row("inference", f"one request, speculative {m[1]} vs plain decoding "
                        f"(acceptance {m[5]}%)", f"{m[2]} tok/s", f"{m[3]} tok/s", m[4],
                        "> 1 faster"))
    return rows


def parse_rollout(out: str) -> list[Row]:
    ours = re.search(r"astrai RolloutRunner\s*:\s*" + NUM + " tokens/s", out)
    peer = re.search(r"HF generate \(TRL\)\s*:\s*" + NUM + " tokens/s", out)
    r = re.search(r"ratio astrai / HF\s*:\s*([\d.]+)x wall, ([\d.]+)x cpu", out)
    if not (ours and peer and r):
        return []
    return [Row("GRPO rollouts", f"sampled tokens/s with log-probs (CPU time {r[2]}x)",
                _fmt(_f(ours[1]), "tok/s"), _fmt(_f(peer[1]), "tok/s"), r[1], "> 1 faster")]


def parse_eval(out: str) -> list[Row]:
    ours = re.search(r"astrai \(lm-eval model 'astrai'\) :.*?in the model\s+" + NUM + " s wall",
                     out)
    peer = re.search(r"lm-eval hf \(HFLM.*?in the model\s+" + NUM + " s wall", out)
    r = re.search(r"ratio hf / astrai \(model time\) : ([\d.]+)x wall, ([\d.]+)x cpu", out)
    if not (ours and peer and r) or "metrics: equal" not in out:
        return []
    return [Row("eval (lm-eval)", f"multiple-choice + generate_until tasks, time in the model "
                f"(CPU time {r[2]}x)", _fmt(_f(ours[1]), "s"), _fmt(_f(peer[1]), "s"), r[1],
                "> 1 faster (target ≥ 2.0)")]


def parse_inspect(out: str) -> list[Row]:
    ours = re.search(r"inspect-weights: peak RSS (\d+) MiB \(([\d.]+) of budget, (\w+)\)", out)
    peer = re.search(r"peer .*?: peak RSS (\d+) MiB.*?ratio peer / ours = ([\d.]+)x", out)
    size = re.search(r"file ([\d.]+) GB", out)
    if not (ours and peer):
        return []
    what = f"peak RSS scanning a {size[1]} GB checkpoint" if size else "peak RSS"
    return [Row("inspect-weights", f"{what} (budget: {ours[2]} of 2x largest + 500 MiB, "
                f"{ours[3]})", f"{ours[1]} MiB", f"{peer[1]} MiB", peer[2], "> 1 less memory")]


def parse_quickstart(out: str) -> list[Row]:
    rows = []
    for label, where in (("idle", "idle machine"), ("loaded", "beside a CPU burner")):
        tag = rf"\[{label}\] "
        wall = re.search(tag + r"quickstart wall: (\d+) s .*target <= 300 s: (\w+)", out)
        if wall:
            rows.append(Row("quickstart", f"wall seconds, whole command, {where} ({wall[2]})",
                            f"{wall[1]} s", "300 s (target)", f"{int(wall[1]) / 300:.2f}",
                            "≤ 1 within 5 minutes"))
        ours = re.search(tag + r"astrai val_bpb: ([\d.]+) .*target <= ([\d.]+): (\w+)", out)
        peer = re.search(tag + r"HF val_bpb: ([\d.]+) \((\w+), same recipe\) after the same "
                         r"(\d+) steps", out)
        r = re.search(tag + r"ratio HF/astrai: bits per byte ([\d.]+).*training time ([\d.]+)",
                      out)
        if ours and peer and r:
            rows.append(Row("quickstart", f"val bits per byte, {where}, after {peer[3]} steps "
                            f"vs HF {peer[2]} (target ≤ {ours[2]}: {ours[3]})", ours[1],
                            peer[1], r[1], "≥ 1 as good or better"))
            t = re.search(tag + r"training seconds: astrai ([\d.]+) s .*HF ([\d.]+) s", out)
            if t:
                rows.append(Row("quickstart", f"training seconds for those steps, {where}",
                                f"{t[1]} s", f"{t[2]} s", r[2], "> 1 faster"))
    return rows


def parse_precision(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(rf"(\w+): fp32 {NUM} tok/s \| bf16-mixed {NUM} tok/s \| bf16-true "
                         rf"{NUM} tok/s", out):
        r = re.search(rf"{m[1]}: ratio bf16-mixed/fp32 = ([\d.]+), bf16-true/fp32 = ([\d.]+)",
                      out)
        if r:
            rows.append(Row("training precision", f"{m[1]}: bf16-mixed vs fp32 tok/s, CPU",
                            f"{m[3]} tok/s", f"{m[2]} tok/s", r[1], "> 1 faster"))
            rows.append(Row("training precision", f"{m[1]}: bf16-true vs fp32 tok/s, CPU",
                            f"{m[4]} tok/s", f"{m[2]} tok/s", r[2], "> 1 faster"))
    return rows


def parse_bf16_update(out: str) -> list[Row]:
    """bf16_update.py's table: each bf16-true mode's val bits per byte and bytes per
    parameter against bf16-mixed (paired by seed)."""
    rows = []
    mixed = re.search(r"\nbf16-mixed\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+%\s+([\d.]+)",
                      out)
    for m in re.finditer(r"\n(bf16-true \w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+"
                         r"([\d.]+)%\s+([\d.]+)\s+([\d.]+)", out):
        if not mixed:
            break
        rows.append(Row("bf16 updates", f"{m[1]}: val bits per byte vs bf16-mixed "
                        f"(± {m[4]} s.e.; {m[6]}% unmoved in the 2nd half)", m[2], mixed[1],
                        m[3], "≤ 1.01 (nearest: measurably worse)"))
        rows.append(Row("bf16 updates", f"{m[1]}: bytes per parameter vs bf16-mixed", m[7],
                        mixed[2], m[8], "stochastic ≤ 0.50, kahan ≤ 0.67"))
    return rows


def parse_cpu_decode(out: str) -> list[Row]:
    """cpu_decode.py: astrai / llama.cpp (llama-bench) per matched format, medians of
    interleaved rounds; the contention fractions; int4 / int8 on 1b; int4's bits per byte."""
    rows = []
    for m in re.finditer(r"ratio (\S+) (pp512|tg128) ([^:]+): astrai (\S+) / llama\.cpp (\S+) "
                         r"= ([\d.]+) / ([\d.]+) = ([\d.]+) \(target ≥ ([\d.]+)\)", out):
        rows.append(Row("CPU decode", f"{m[1]} {m[2]}, {m[3]}: astrai {m[4]} vs llama-bench "
                        f"{m[5]} (median of rounds)", f"{m[6]} tok/s", f"{m[7]} tok/s", m[8],
                        f"≥ {m[9]}"))
    for m in re.finditer(r"ratio (\S+) (pp512|tg128) ([^:]+): astrai (\S+) / llama\.cpp (\S+)"
                         r": no ratio \(BROKEN: ([^)]*)", out):
        rows.append(Row("CPU decode", f"{m[1]} {m[2]}, {m[3]}: astrai {m[4]} vs llama-bench "
                        f"{m[5]}", "", f"BROKEN: {m[6]}", "—", "no ratio"))
    for m in re.finditer(r"contention (\S+) tg128 astrai (\S+): ([\d.]+) / ([\d.]+) idle = "
                         r"([\d.]+) \(target ≥ ([\d.]+)\)", out):
        rows.append(Row("CPU decode", f"{m[1]} tg128 astrai {m[2]} beside one busy process, vs "
                        "idle", f"{m[3]} tok/s", f"{m[4]} tok/s (idle)", m[5], f"≥ {m[6]}"))
    m = re.search(r"target (\S+) tg128 astrai int4 / int8 = ([\d.]+) / ([\d.]+) = ([\d.]+)", out)
    if m:
        rows.append(Row("CPU decode", f"{m[1]} tg128: astrai int4 vs astrai int8",
                        f"{m[2]} tok/s", f"{m[3]} tok/s", m[4], "≥ 1.7"))
    m = re.search(r"target int4 bpb within 3% of fp32: ([\d.]+)", out)
    if m:
        rows.append(Row("CPU decode", "quickstart model: bits per byte, int4 vs fp32", "", "",
                        m[1], "≤ 1.03"))
    return rows


def parse_serve(out: str) -> list[Row]:
    rows = []
    tp = r": ([\d.]+) output tok/s, median TTFT ([\d.]+) ms"
    local = re.search(r"astrai in-process" + tp, out)
    http = re.search(r"astrai serve \(HTTP /v1/completions\)" + tp, out)
    r = re.search(r"astrai HTTP / in-process output throughput: ([\d.]+)", out)
    if local and http and r:
        rows.append(Row("serving (HTTP)", "astrai serve vs in-process engine, output tok/s "
                        "(same workload)", f"{http[1]} tok/s", f"{local[1]} tok/s", r[1],
                        "≥ 0.90 HTTP costs < 10%"))
    chat = re.search(r"astrai serve \(HTTP /v1/chat/completions\)" + tp, out)
    peer = re.search(r"transformers serve --continuous-batching \(HTTP [^)]*\)" + tp, out)
    pr = re.search(r"ratio astrai/peer \(chat\): output throughput ([\d.]+)x.*?median TTFT "
                   r"([\d.]+)x", out)
    if chat and peer and pr:
        rows.append(Row("serving (HTTP)", "output tok/s vs transformers serve "
                        "--continuous-batching (target ≥ 2.0)", f"{chat[1]} tok/s",
                        f"{peer[1]} tok/s", pr[1], "> 1 faster"))
        rows.append(Row("serving (HTTP)", "median TTFT vs transformers serve (target ≤ 0.5)",
                        f"{chat[2]} ms", f"{peer[2]} ms", pr[2], "< 1 faster"))
    for m in re.finditer(r"structured outputs \(([^)]*)\), \d+ requests in-process: "
                         r"unconstrained ([\d.]+) tok/s .*?constrained ([\d.]+) tok/s", out):
        ratio = float(m[3]) / float(m[2])
        rows.append(Row("structured outputs", f"half JSON-schema-constrained vs free ({m[1]})",
                        f"{m[3]} tok/s", f"{m[2]} tok/s", f"{ratio:.2f}", "≥ 0.8"))
    return rows


def parse_kernels_json(path: Path) -> list[Row]:
    data = json.loads(path.read_text())
    rows = []
    for r in data.get("decode", []):
        shape = f"B{r['B']} L{r['L']} H{r['H']}/{r['K']} D{r['D']}"
        rows.append(Row("CUDA kernels", f"paged decode {shape} vs gather + SDPA "
                        f"({r['pct_copy']:.0f}% of copy bandwidth)", f"{r['ms']:.3f} ms",
                        f"{r['ms'] * r['x_gather_sdpa']:.3f} ms", f"{r['x_gather_sdpa']:.2f}",
                        "> 1 faster"))
        if r.get("x_flash") == r.get("x_flash") and r.get("x_flash") is not None:  # not NaN
            rows.append(Row("CUDA kernels", f"paged decode {shape} vs flash-attn",
                            f"{r['ms']:.3f} ms", f"{r['ms'] * r['x_flash']:.3f} ms",
                            f"{r['x_flash']:.2f}", "> 1 faster"))
    for r in data.get("prefill", []):
        rows.append(Row("CUDA kernels", f"ragged paged prefill B{r['B']} q{r['q']} kv{r['kv']} "
                        f"vs SDPA per request", f"{r['tflops']:.1f} TFLOP/s",
                        f"{r['sdpa_tflops']:.1f} TFLOP/s", f"{r['x_sdpa']:.2f}", "> 1 faster"))
    for r in data.get("rotary", []):
        rows.append(Row("CUDA kernels", f"rotary N{r['N']} x {r['heads']} heads vs torch",
                        f"{r['ms']:.4f} ms", f"{r['torch_ms']:.4f} ms", f"{r['x_torch']:.2f}",
                        "> 1 faster"))
    return rows


def parse_lora(out: str) -> list[Row]:
    rows = []
    for m in re.finditer(r"(\S+): (trainable parameters|optimizer state) LoRA " + NUM
                         + r"(?: B)? \| full " + NUM + r"(?: B)? \| ratio ([\d.]+)", out):
        unit = " B" if m[2] == "optimizer state" else ""
        target = "2%" if m[2] == "trainable parameters" else "3%"
        rows.append(Row("lora", f"{m[1]}: {m[2]}, LoRA vs full fine-tuning",
                        _fmt(_f(m[3])) + unit, _fmt(_f(m[4])) + unit, m[5],
                        f"< 1 smaller (target <= {target})"))
    for m in re.finditer(r"(\S+): step time LoRA ([\d.]+) s \| full ([\d.]+) s \| ratio "
                         r"([\d.]+)", out):
        rows.append(Row("lora", f"{m[1]}: step time, LoRA vs full fine-tuning",
                        f"{m[2]} s", f"{m[3]} s", m[4], "<= 1 faster"))
    for m in re.finditer(r"(\S+): astrai LoRA " + NUM + r" tok/s \| HF\+PEFT " + NUM
                         + r" tok/s \| ratio astrai/HF\+PEFT = ([\d.]+)", out):
        rows.append(Row("lora", f"{m[1]}: LoRA tokens/s vs HF transformers + PEFT",
                        _fmt(_f(m[2]), "tok/s"), _fmt(_f(m[3]), "tok/s"), m[4],
                        ">= 1 faster"))
    return rows


def parse_multi_lora(out: str) -> list[Row]:
    m = re.search(r"(\S+): multi-lora (\d+) requests: base " + NUM + r" tok/s \| (\d+) "
                  r"adapters " + NUM + r" tok/s \| ratio adapters/base = ([\d.]+)", out)
    if not m:
        return []
    return [Row("multi-LoRA serving", f"{m[1]}: {m[2]} requests over {m[4]} adapters in one "
                "batch vs the base alone, output tok/s", _fmt(_f(m[5]), "tok/s"),
                _fmt(_f(m[3]), "tok/s"), m[6], "≥ 0.8 (target)")]


BENCHES = [
    Bench("preprocess", "preprocess.py", ["--repeat", "3", "--runs", "2", "--vocab-size", "4096"],
          parse_preprocess, "HF tokenizers encode_batch"),
    Bench("training", "train_throughput.py",
          ["--presets", "tiny", "--rounds", "2", "--batch", "4", "--seq", "256"],
          parse_train, "HF transformers LlamaForCausalLM, plain loop"),
    Bench("lora", "lora.py", ["--preset", "small", "--steps", "4"], parse_lora,
          "full fine-tuning; HF transformers + PEFT loop"),
    Bench("precision", "train_precision.py",
          ["--presets", "tiny", "small", "--steps", "6", "--rounds", "2"], parse_precision,
          "the same Trainer in fp32", cpu_flags=("amx_bf16",)),
    Bench("cpu_decode", "cpu_decode.py", [], parse_cpu_decode,
          "llama.cpp's llama-bench (built from source at first use)", timeout_s=3600),
    Bench("bf16_update", "bf16_update.py", ["--seeds", "3"], parse_bf16_update,
          "bf16-mixed (fp32 master weights)", cpu_flags=("avx512_bf16",)),
    Bench("distributed", "train_distributed.py",
          ["--presets", "tiny", "--nprocs", "2", "--steps", "4", "--warmup", "1"],
          parse_distributed, "plain torch DDP"),
    Bench("checkpoints", "checkpoint_save.py", ["--presets", "tiny", "small", "--rounds", "2"],
          parse_checkpoints, "astrai's full-state save (gathered to rank 0)"),
    Bench("inference", "inference.py", ["--presets", "tiny", "--quick", "--repeat", "1"],
          parse_inference, "HF transformers generate"),
    Bench("speculative", "inference.py", ["--only", "s", "--quick", "--repeat", "2"],
          parse_speculative, "plain decoding of the same engine"),
    Bench("rollout", "rollout.py", ["--prompts", "8", "--group", "4", "--new", "16",
                                    "--repeat", "2"], parse_rollout, "HF generate (TRL path)"),
    Bench("eval", "eval.py", ["--questions", "32", "--gen", "8", "--repeat", "2"], parse_eval,
          "lm-eval hf model (HFLM)"),
    Bench("inspect", "inspect_memory.py", ["--gb", "0.5"], parse_inspect,
          "safetensors load_file"),
    Bench("multi_lora", "multi_lora.py", ["--rounds", "2"], parse_multi_lora,
          "the same requests on the base alone"),
    Bench("serve", "serve.py", [], parse_serve,
          "transformers serve --continuous-batching (HTTP)"),
    Bench("quickstart", "quickstart.py", [], parse_quickstart,
          "HF transformers (Llama / Qwen3), same recipe"),
    Bench("kernels", "cuda_kernels.py", ["--quick"], lambda out: [], "torch SDPA / flash-attn",
          cuda=True),
]


# -- the machine -----------------------------------------------------------------------------

# Vector and matrix extensions that decide fp32/bf16 speed (Linux /proc/cpuinfo names).
EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sme")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo does not say)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine() -> dict[str, str]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines()
                      if x.startswith("MemTotal")).split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        pass
    gpu = "none"
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=False,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    ext = [f for f in EXTENSIONS if f in cpu_flags()]
    return {"CPU": f"{cpu}, {os.cpu_count()} logical cores",
            "CPU extensions": ", ".join(ext) or "-", "memory": mem, "GPU": gpu,
            "torch": f"{torch.__version__} ({torch.get_num_threads()} threads)",
            "python": platform.python_version(), "OS": platform.platform(),
            "astrai commit": commit or "-"}


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "-"


# -- running -----------------------------------------------------------------------------------

def run_one(b: Bench, tmp: Path) -> tuple[list[Row], str, float, int]:
    extra = list(b.extra)
    json_path = None
    if b.name == "kernels":
        json_path = tmp / "kernels.json"
        extra += ["--json", str(json_path)]
    cmd = [sys.executable, str(HERE / b.script), *b.args, *extra]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=b.timeout_s,
                           check=False)
        out, rc = p.stdout + ("\n" + p.stderr if p.returncode else ""), p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}\n(timed out after {b.timeout_s:.0f} s)", -1
    elapsed = time.perf_counter() - t
    rows = []
    if rc == 0:
        rows = parse_kernels_json(json_path) if json_path and json_path.is_file() \
            else b.parse(out)
    return rows, out, elapsed, rc


def report(results: list[tuple[Bench, list[Row], str, float, int]], info: dict[str, str],
           load_before: str, load_after: str, started: str) -> str:
    lines = ["# astrai benchmarks against their peers", "",
             (f"Run by `python benchmarks/run_all.py` on {started}. Each benchmark ran in its "
             "own process, one after another; wall-clock figures on a shared machine move "
             "with its load (below), so ratios measured in the same run are what to compare."),
             "", "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    lines += [f"| load average (1, 5, 15 min) | before {load_before}; after {load_after} |", ""]
    lines += ["| benchmark | measure | astrai | peer | ratio | better |",
              "|---|---|---|---|---|---|"]
    for b, rows, _, _, rc in results:
        if rows:
            lines += [f"| {r.benchmark} | {r.measure} | {r.astrai} | {r.peer} | **{r.ratio}** "
                      f"| {r.better} |" for r in rows]
        else:
            why = (f"skipped: {b.skip_reason(set(), False)}" if rc is None else
                   "failed (see output below)" if rc else "no figures parsed (see output below)")
            lines.append(f"| {b.name} | vs {b.peer} | — | — | — | {why} |")
    lines += ["", "## Output of each benchmark", ""]
    for b, _, out, elapsed, rc in results:
        if rc is None:
            continue
        cmd = " ".join(["python", f"benchmarks/{b.script}", *b.args])
        lines += [(f"<details><summary>{b.name}: <code>{cmd}</code> ({elapsed:.0f} s, exit "
                  f"{rc})</summary>"), "", "```", out.strip(), "```", "", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated benchmark names (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md",
                    help="markdown report to write")
    ap.add_argument("--list", action="store_true", help="print the commands and exit")
    args = ap.parse_args(argv)
    names = [b.name for b in BENCHES]
    chosen = BENCHES
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in wanted if n not in names]
        if bad:
            ap.error(f"unknown benchmark {', '.join(bad)}; choose from {', '.join(names)}")
        chosen = [b for b in BENCHES if b.name in wanted]
    if args.list:
        for b in chosen:
            print(f"{b.name:12} python benchmarks/{b.script} {' '.join(b.args)}"
                  + ("   (CUDA only)" if b.cuda else "")
                  + (f"   (needs CPU {', '.join(b.cpu_flags)})" if b.cpu_flags else ""))
        return 0
    import torch

    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    info, before = machine(), load()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        flags, cuda = cpu_flags(), torch.cuda.is_available()
        for b in chosen:
            why = b.skip_reason(flags, cuda)
            if why:
                print(f"{b.name}: skipped ({why})", file=sys.stderr)
                results.append((b, [], "", 0.0, None))
                continue
            print(f"{b.name}: running python benchmarks/{b.script} {' '.join(b.args)}",
                  file=sys.stderr, flush=True)
            rows, out, elapsed, rc = run_one(b, Path(tmp))
            print(f"{b.name}: {len(rows)} figures in {elapsed:.0f} s (exit {rc})",
                  file=sys.stderr, flush=True)
            results.append((b, rows, out, elapsed, rc))
    text = report(results, info, before, load(), started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_name(f".{args.out.name}.tmp")
    tmp_out.write_text(text)
    tmp_out.replace(args.out)
    print(text.split("\n## Output")[0])
    return 0 if all(rc in (0, None) for *_, rc in results) else 1


if __name__ == "__main__":
    sys.exit(main())
