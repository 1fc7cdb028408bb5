"""benchmarks/run_all.py: each parser reads its benchmark's printed format, and the report
is one table with the machine and every benchmark (fast: no benchmark is run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mod():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_all"] = mod  # dataclasses look their module up while being created
    spec.loader.exec_module(mod)
    return mod


RA = _mod()

PREPROCESS = """corpus: 3x sample = 3.0 MB, 618 records, 801,234 text tokens (...), vocab 4096, workers 1
tokenizers encode_batch        :    1,234,567 tokens/s
tokenizers encode_batch_fast   :    1,300,000 tokens/s
astrai preprocess (start-up excluded, read+parse+tokenize+pack+write):    1,000,000 tokens/s
throughput ratio vs encode_batch     : 0.81  (target >= 0.70)
throughput ratio vs encode_batch_fast: 0.77
peak RSS 1x: 210 MB, 3x: 230 MB, ratio 1.10  (target <= 1.30)
"""

TRAIN = """threads 2; fp32 matmul peak 120.0 GFLOP/s; batch 4 x 256
tiny: astrai 4,100 tok/s (MFU 55.0%) | HF Llama 3,900 tok/s (MFU 52.0%) | plain loop 4,200 tok/s
tiny: ratio astrai/HF = 1.05, astrai/plain = 0.98
"""

DIST = """device cpu, 2 threads, fp32; matmul peak 0.120 TFLOP/s per device; global batch 8 x 256
tiny compile=none: 1 process 4,000 tok/s (MFU 50.0%) | astrai ddp x2 5,000 tok/s (MFU 31.0%) | astrai fsdp x2 4,800 tok/s (MFU 30.0%) | plain DDP x2 5,100 tok/s (MFU 31.5%)
  ddp/1-process 1.25, fsdp/1-process 1.20, astrai-ddp/plain-DDP 0.98
"""

INFER = """torch 2.13.0, threads 1, fp32, CPU

== preset tiny (7.3M params)
(a) one request at a time: engine 210.5 tok/s, HF 120.2 tok/s -> 1.75x HF (CPU time 1.70x); matmul floor 400.0 tok/s -> engine at 0.53 of the floor (CPU time 0.55); same tokens 2/2
(b) 64 mixed requests: engine 900.0 tok/s, HF static batches of 16 300.0 tok/s -> 3.00x HF (CPU time 2.90x) (peak running 64, preemptions 0); same tokens 64/64
(c) shared prefix: TTFT p50 120 ms with radix vs 480 ms without -> 0.25x (hit rate 0.80; wall 1.0s vs 3.0s); same tokens 64/64
"""

EVAL = """preset small (25.7M params), 32 questions x 4 choices (3-shot) + 8 generations, 1 threads
astrai (lm-eval model 'astrai') :   24.45 s wall; in the model   18.05 s wall,    3.04 s cpu
lm-eval hf (HFLM, batch  16)  :   62.19 s wall; in the model   54.12 s wall,    8.95 s cpu
metrics: equal
ratio hf / astrai (model time) : 3.00x wall, 2.95x cpu
ratio hf / astrai (whole run)  : 2.54x wall
"""

ROLLOUT = """preset tiny: 8 prompts x 4 samples x 16 new tokens, threads 2
astrai RolloutRunner :     800.0 tokens/s  (wall 0.64 s, cpu 1.20 s)
HF generate (TRL)    :     400.0 tokens/s  (wall 1.28 s, cpu 2.40 s)
ratio astrai / HF    : 2.00x wall, 2.00x cpu
"""

INSPECT = """file 0.50 GB, 12 tensors, largest 128 MiB (written in 2 s)
budget: 2 x largest + 500 MiB = 756 MiB
inspect-weights: peak RSS 300 MiB (0.40 of budget, PASS), 1.0 s = 0.50 GB/s; verdict locked, locked 10, overflow 1, non-finite 2
peer (load_file + fp32 stats per tensor): peak RSS 1100 MiB, 2.0 s; ratio peer / ours = 3.67x
"""

QUICKSTART = """machine: 2 CPUs, torch 2.13.0+cpu
[idle] quickstart: 2,098,432 parameters (dim 256, 2 layers), 696 steps of 8 x 256 tokens, 1,422,336 tokens, muon, 2 threads
[idle] quickstart wall: 234 s (summary total 234 s; stages tokenizer 0, train 225); target <= 300 s: met
[idle] astrai val_bpb: 2.4140 (the quickstart reported 2.4140) on 115,583 bytes; target <= 2.30: MISSED
[idle] HF val_bpb: 2.4304 (LlamaForCausalLM, same recipe) after the same 696 steps
[idle] training seconds: astrai 224.5 s (with validation), HF 209.1 s
[idle] ratio HF/astrai: bits per byte 1.007 (> 1: astrai lower), training time 0.93 (> 1: astrai faster)
[loaded] quickstart wall: 280 s (summary total 278 s; stages tokenizer 0, train 260); target <= 300 s: met
[loaded] astrai val_bpb: 2.5000 (the quickstart reported 2.5000) on 115,583 bytes; target <= 2.60: met
[loaded] HF val_bpb: 2.5100 (LlamaForCausalLM, same recipe) after the same 400 steps
[loaded] training seconds: astrai 250.0 s (with validation), HF 240.0 s
[loaded] ratio HF/astrai: bits per byte 1.004 (> 1: astrai lower), training time 0.96 (> 1: astrai faster)
"""

SERVE = """== preset tiny, 64 requests, input 32:128, output 16:64, Poisson 8.0 req/s, 1 thread(s), CPU fp32
structured outputs (tiny, byte-level vocabulary), 64 requests in-process: unconstrained 5000.0 tok/s (3566 tokens), half JSON-schema-constrained 4400.0 tok/s (2796 tokens)
astrai in-process: 300.5 output tok/s, median TTFT 70.1 ms, median ITL 20.0 ms, 64 completed, 0 failed
astrai serve (HTTP /v1/completions): 290.0 output tok/s, median TTFT 90.0 ms, median ITL 21.0 ms, 64 completed, 0 failed
astrai serve (HTTP /v1/chat/completions): 280.0 output tok/s, median TTFT 95.0 ms, median ITL 21.0 ms, 64 completed, 0 failed
astrai HTTP / in-process output throughput: 0.97 (target >= 0.90)
transformers serve --continuous-batching (HTTP /v1/chat/completions): 100.0 output tok/s, median TTFT 900.0 ms, median ITL 90.0 ms, 64 completed, 0 failed
ratio astrai/peer (chat): output throughput 2.80x (target >= 2.0), median TTFT 0.11x (target <= 0.5)
"""


PRECISION = """threads 2; 2048^3 matmul: fp32 149.0 GFLOP/s, bf16 347.0 GFLOP/s (2.33x)
tiny: fp32 1,000 tok/s | bf16-mixed 1,500 tok/s | bf16-true 2,000 tok/s   (median of 12 steps each)
tiny: ratio bf16-mixed/fp32 = 1.50, bf16-true/fp32 = 2.00
"""


def test_precision_parser_and_cpu_gate():
    rows = RA.parse_precision(PRECISION)
    assert [(r.astrai, r.peer, r.ratio) for r in rows] == [
        ("1,500 tok/s", "1,000 tok/s", "1.50"), ("2,000 tok/s", "1,000 tok/s", "2.00")]
    b = {x.name: x for x in RA.BENCHES}["precision"]
    assert b.skip_reason({"avx2", "fma"}, cuda=False) == "needs a CPU with amx_bf16"
    assert b.skip_reason({"avx2", "amx_bf16"}, cuda=False) is None
    assert "CPU extensions" in RA.machine()


def test_parsers_read_each_format():
    rows = RA.parse_preprocess(PREPROCESS)
    assert [(r.astrai, r.peer, r.ratio) for r in rows] == [
        ("1,000,000 tok/s", "1,234,567 tok/s", "0.81"), ("230 MB", "210 MB (1x)", "1.10")]
    rows = RA.parse_train(TRAIN)
    assert [r.ratio for r in rows] == ["1.05", "0.98"] and "MFU 55.0%" in rows[0].measure
    rows = RA.parse_distributed(DIST)
    assert [(r.astrai, r.peer, r.ratio) for r in rows] == [
        ("5,000 tok/s", "5,100 tok/s", "0.98"), ("5,000 tok/s", "4,000 tok/s", "1.25")]
    rows = RA.parse_inference(INFER)
    assert [r.ratio for r in rows] == ["1.75", "3.00", "4.00"]
    assert all(r.measure.startswith("tiny:") for r in rows)
    rows = RA.parse_rollout(ROLLOUT)
    assert (rows[0].astrai, rows[0].peer, rows[0].ratio) == ("800 tok/s", "400 tok/s", "2.00")
    rows = RA.parse_eval(EVAL)
    assert (rows[0].astrai, rows[0].peer, rows[0].ratio) == ("18.05 s", "54.12 s", "3.00")
    assert RA.parse_eval(EVAL.replace("metrics: equal", "metrics: DIFFER")) == []
    rows = RA.parse_inspect(INSPECT)
    assert (rows[0].astrai, rows[0].peer, rows[0].ratio) == ("300 MiB", "1100 MiB", "3.67")
    assert "0.50 GB" in rows[0].measure and "PASS" in rows[0].measure
    rows = RA.parse_quickstart(QUICKSTART)
    assert [(r.astrai, r.peer, r.ratio) for r in rows] == [
        ("234 s", "300 s (target)", "0.78"), ("2.4140", "2.4304", "1.007"),
        ("224.5 s", "209.1 s", "0.93"), ("280 s", "300 s (target)", "0.93"),
        ("2.5000", "2.5100", "1.004"), ("250.0 s", "240.0 s", "0.96")]
    assert "met" in rows[0].measure and "696 steps" in rows[1].measure
    assert "MISSED" in rows[1].measure and "2.30" in rows[1].measure
    assert "CPU burner" in rows[4].measure and "400 steps" in rows[4].measure
    rows = RA.parse_serve(SERVE)
    assert [(r.astrai, r.peer, r.ratio) for r in rows] == [
        ("290.0 tok/s", "300.5 tok/s", "0.97"), ("280.0 tok/s", "100.0 tok/s", "2.80"),
        ("95.0 ms", "900.0 ms", "0.11"), ("4400.0 tok/s", "5000.0 tok/s", "0.88")]


def test_parsers_return_nothing_on_other_text():
    for parse in (RA.parse_preprocess, RA.parse_train, RA.parse_distributed,
                  RA.parse_inference, RA.parse_rollout, RA.parse_inspect,
                  RA.parse_quickstart, RA.parse_serve, RA.parse_eval, RA.parse_precision,
                  RA.parse_cpu_decode):
        assert parse("Traceback (most recent call last):\n  boom\n") == []


def test_kernels_json(tmp_path):
    p = tmp_path / "k.json"
    p.write_text(json.dumps({
        "decode": [{"B": 8, "L": 4096, "H": 32, "K": 8, "D": 128, "ms": 0.1, "gbs": 900,
                    "pct_copy": 80.0, "x_ref": 20.0, "x_gather_sdpa": 5.0, "x_sdpa_only": 1.2,
                    "x_flash": float("nan")}],
        "prefill": [{"B": 4, "q": 1024, "kv": 1024, "ms": 1.0, "tflops": 200.0,
                     "sdpa_tflops": 100.0, "x_sdpa": 2.0}],
        "rotary": [{"N": 4096, "heads": 8, "D": 64, "ms": 0.01, "torch_ms": 0.03,
                    "x_torch": 3.0}]}))
    rows = RA.parse_kernels_json(p)
    assert [r.ratio for r in rows] == ["5.00", "2.00", "3.00"]  # NaN flash row left out


def test_report_has_machine_table_and_every_benchmark():
    b = {x.name: x for x in RA.BENCHES}
    results = [(b["preprocess"], RA.parse_preprocess(PREPROCESS), PREPROCESS, 12.0, 0),
               (b["rollout"], [], "Traceback: boom", 3.0, 1),
               (b["kernels"], [], "", 0.0, None)]
    text = RA.report(results, {"CPU": "test cpu, 2 logical cores"}, "1.0 1.0 1.0",
                     "2.0 2.0 2.0", "2025-01-01 00:00")
    assert "| CPU | test cpu, 2 logical cores |" in text
    assert "before 1.0 1.0 1.0; after 2.0 2.0 2.0" in text
    assert "| preprocess | throughput, start-up excluded | 1,000,000 tok/s | 1,234,567 tok/s " \
           "| **0.81** |" in text
    assert "| rollout | vs HF generate (TRL path) | — | — | — | failed" in text
    assert "| kernels | vs torch SDPA / flash-attn | — | — | — | skipped: needs CUDA |" in text
    assert "Traceback: boom" in text  # the output of a failed benchmark is kept


def test_list_names_every_script():
    scripts = {b.script for b in RA.BENCHES}
    for s in scripts:
        assert (ROOT / "benchmarks" / s).is_file(), s
    assert {"preprocess.py", "train_throughput.py", "inference.py", "cuda_kernels.py"} <= scripts


def test_no_script_shadows_a_module_a_benchmark_imports():
    """`python benchmarks/X.py` puts benchmarks/ first on sys.path: a script named like an
    installed module (HF's `kernels`, which transformers imports when present) breaks every
    benchmark that imports transformers."""
    taken = {"kernels", "transformers", "torch", "peft", "trl", "gguf", "llama_cpp",
             "ctranslate2", "tokenizers", "datasets", "lm_eval", "openai", "safetensors"}
    taken |= set(sys.stdlib_module_names)
    clashes = [f.name for f in (ROOT / "benchmarks").glob("*.py") if f.stem in taken]
    assert not clashes


LORA = """small rank 8 all-linear, batch 4 x 256, 1 threads, 4 timed steps per run
small: trainable parameters LoRA 155,648 | full 7,342,336 | ratio 0.0212
small: optimizer state LoRA 1,245,184 B | full 58,738,688 B | ratio 0.0212
small: step time LoRA 0.471 s | full 0.639 s | ratio 0.73 (LoRA/full, each over its run's HF+PEFT steps)
small: astrai LoRA 1,086 tok/s | HF+PEFT 953 tok/s | ratio astrai/HF+PEFT = 1.14 (median of per-step ratios)
"""


def test_lora_parser():
    rows = RA.parse_lora(LORA)
    assert [(r.astrai, r.peer, r.ratio) for r in rows] == [
        ("155,648", "7,342,336", "0.0212"), ("1,245,184 B", "58,738,688 B", "0.0212"),
        ("0.471 s", "0.639 s", "0.73"), ("1,086 tok/s", "953 tok/s", "1.14")]


CPU_DECODE = """== 125m: 117M parameters, random weights ==
ratio 125m pp512 1 request: astrai fp32 / llama.cpp f32 = 310.2 / 250.0 = 1.24 (target ≥ 1.0) PASS
ratio 125m tg128 1 request: astrai fp32 / llama.cpp f32 = 50.0 / 45.0 = 1.11 (target ≥ 1.2) MISS
ratio 125m pp512 1 request: astrai int8 / llama.cpp q8_0: no ratio (BROKEN: llama-bench exited with -11: boom)
contention 125m tg128 astrai fp32: 30.0 / 50.0 idle = 0.60 (target ≥ 0.4) PASS
contention 125m tg128 llama.cpp f32: 20.0 / 45.0 idle = 0.44
target 1b tg128 astrai int4 / int8 = 30.0 / 16.0 = 1.88 (target ≥ 1.7) PASS
target int4 bpb within 3% of fp32: 1.0210 PASS
"""


def test_cpu_decode_parser_reads_ratios_broken_peers_and_targets():
    rows = RA.parse_cpu_decode(CPU_DECODE)
    assert [(r.astrai, r.peer, r.ratio, r.better) for r in rows] == [
        ("310.2 tok/s", "250.0 tok/s", "1.24", "≥ 1.0"),
        ("50.0 tok/s", "45.0 tok/s", "1.11", "≥ 1.2"),
        ("", "BROKEN: llama-bench exited with -11: boom", "—", "no ratio"),
        ("30.0 tok/s", "50.0 tok/s (idle)", "0.60", "≥ 0.4"),
        ("30.0 tok/s", "16.0 tok/s", "1.88", "≥ 1.7"),
        ("", "", "1.0210", "≤ 1.03")]
    assert "astrai fp32 vs llama-bench f32" in rows[0].measure
    assert "cpu_decode" in {b.name for b in RA.BENCHES}
