"""`astrai serve-bench`: the table, --json FILE with every field, and bad input (exit 2)."""

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from astrai.data.testing import tiny_tokenizer
from astrai.model import ModelConfig, build_model
from astrai.model.checkpoint import save_checkpoint
from astrai_cli.commands.serve_bench_cmd import SECTIONS, render
from astrai_cli.main import app

runner = CliRunner()
FAST = ["--num-prompts", "3", "--input-len", "4:12", "--output-len", "2:3", "--warmup", "1",
        "--max-kv-tokens", "1024", "--max-requests", "8", "--device", "cpu"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-bench")
    tok = tiny_tokenizer(root)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn_dim=128, max_seq_len=128)
    path = save_checkpoint(root / "ckpt", build_model(cfg, seed=0), cfg, tokenizer_dir=tok.path)
    return path


def test_tiny_preset_json_file_holds_every_field_and_the_table_every_row(tmp_path):
    out = tmp_path / "res" / "bench.json"
    r = runner.invoke(app, ["serve-bench", "tiny", *FAST, "--request-rate", "100",
                            "--burstiness", "0.5", "--max-concurrency", "2", "--seed", "3",
                            "--goodput", "ttft:100000", "--threads", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert set(d) == {"model", "workload", "settings", "runs"}
    (run,) = d["runs"]
    want = {key for _, rows in SECTIONS for _, key, _ in rows
            if not key.startswith("spec_")}  # speculation rows: only when it speculates
    assert want <= set(run), sorted(want - set(run))
    assert run["completed"] == 3 and run["request_goodput"] == run["request_throughput"]
    assert run["peak_concurrency"] <= 2
    s = d["settings"]
    assert (s["request_rate"], s["burstiness"], s["max_concurrency"], s["seed"]) == (
        100.0, 0.5, 2, 3)
    assert s["threads"] == 1
    assert d["workload"]["input_len"][0] >= 4 and d["workload"]["output_len"][1] <= 3
    assert d["model"]["kind"] == "preset" and d["model"]["params"] > 7_000_000
    # The table (stdout) has a row per metric and a column for the backend.
    for label in ("Request throughput", "Output token throughput", "Time to first token",
                  "Time per output token", "Inter-token latency", "End-to-end latency",
                  "P99", "Most requests in flight", "Prefix cache hit rate", "KV pool utilization",
                  "Request goodput", "auto (torch_native)"):
        assert label in r.stdout, label


def test_json_to_stdout_and_shared_prefix_hits(ckpt):
    r = runner.invoke(app, ["serve-bench", str(ckpt), *FAST, "--workload", "shared-prefix",
                            "--prefix-len", "32", "--prefix-groups", "1", "--input-len", "2",
                            "--max-concurrency", "1", "--compare-backends", "torch_native",
                            "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)  # only JSON on stdout
    (run,) = d["runs"]
    assert run["backend"] == "torch_native"
    assert run["prefix_cache_hit_tokens"] == 2 * 32  # requests 2 and 3 reuse the prefix
    assert d["workload"]["prefix_len"] == 32


def test_quantize_int8_is_in_the_report(ckpt):
    r = runner.invoke(app, ["serve-bench", str(ckpt), *FAST, "--quantize", "int8",
                            "--compare-backends", "torch_native", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"]["quantize"] == "int8"


def test_a_16_bit_kv_cache_is_in_the_report(ckpt):
    r = runner.invoke(app, ["serve-bench", str(ckpt), *FAST, "--kv-cache-dtype", "float16",
                            "--compare-backends", "torch_native"])
    assert r.exit_code == 0, r.output
    assert "KV cache float16" in r.stdout


def test_one_table_one_column_per_backend():
    base = {"completed": 3, "failed": 0, "duration": 1.0, "mean_ttft_ms": 5.0,
            "prefix_cache_hit_rate": 0.5, "request_goodput": None}
    report = {"model": {"kind": "preset", "name": "tiny", "dtype": "float32", "device": "cpu"},
              "workload": {"name": "random", "num_prompts": 3, "input_len": [1, 2],
                           "output_len": [3, 4]},
              "settings": {"request_rate": "inf", "max_concurrency": None},
              "runs": [{"backend": "torch_native", **base},
                       {"backend": "cuda", **base, "mean_ttft_ms": 2.5}]}
    console = Console(width=200, record=True)
    render(report, console)
    text = console.export_text()
    assert text.count("torch_native") == 1 and text.count("cuda") == 1
    row = next(line for line in text.splitlines() if "Mean" in line and "5.00" in line)
    assert "2.50" in row  # both backends' TTFT on one row
    assert "50.0" in text and "goodput" not in text  # no SLOs: no goodput row


@pytest.mark.parametrize("args, why", [
    (["--input-len", "9:3"], "--input-len '9:3'"),
    (["--request-rate", "0"], "--request-rate 0"),
    (["--burstiness", "-1"], "--burstiness"),
    (["--goodput", "speed:3"], "goodput SLO 'speed:3'"),
    (["--max-concurrency", "0"], "--max-concurrency 0"),
    (["--backend", "gpu"], "backend 'gpu'"),
    (["--backend", "torch_native", "--compare-backends", "all"], "exclude each other"),
    (["--compare-backends", "torch_native,torch_native"], "names a backend twice"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--threads", "0"], "--threads 0"),
    (["--input-len", "200"], "exceed the context of 128"),
    (["--workload", "nope.jsonl"], "workload 'nope.jsonl': no such file"),
    (["--quantize", "int3"], "--quantize 'int3': use none or int8, int4"),
    (["--kv-cache-dtype", "fp8"], "'fp8': use auto, float32, bfloat16 or float16"),
])
def test_bad_options_exit_2(ckpt, args, why):
    r = runner.invoke(app, ["serve-bench", str(ckpt), *FAST, *args])
    assert r.exit_code == 2, r.output
    assert why in r.stderr and "Traceback" not in r.output


def test_bad_workload_file_and_target_exit_2(ckpt, tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": "hi"}\n\n{"prompt_ids": [1, 2], "output_len": -4}\n')
    r = runner.invoke(app, ["serve-bench", str(ckpt), *FAST, "--workload", str(f)])
    assert r.exit_code == 2
    assert f"{f}:3: 'output_len' must be an integer >= 1" in r.stderr
    r = runner.invoke(app, ["serve-bench", "huge", *FAST])
    assert r.exit_code == 2 and "neither a checkpoint directory nor a preset" in r.stderr
    out = tmp_path / "never.json"
    runner.invoke(app, ["serve-bench", str(ckpt), *FAST, "--request-rate", "x", "--json",
                        str(out)])
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("workload", ["random", "shared-prefix"])
def test_default_lengths_fit_a_short_context(ckpt, workload):
    # The 128-token model cannot hold the defaults (64:256 in, 32:128 out, prefix 256):
    # with no length given they are scaled down to fit instead of failing.
    r = runner.invoke(app, ["serve-bench", str(ckpt), "--num-prompts", "2", "--warmup", "0",
                            "--device", "cpu", "--workload", workload, "--json"])
    assert r.exit_code == 0, r.output
    w = json.loads(r.stdout)["workload"]
    assert w["input_len"][1] + w["output_len"][1] <= 128  # prompt lengths hold the prefix


def test_table_labels_say_what_each_concurrency_counts():
    run = {"backend": "b", "completed": 3, "max_concurrent_requests": 9, "peak_concurrency": 4,
           "mean_concurrency": 2.0, "kv_pool_utilization_mean": None, "num_steps": None}
    report = {"model": {"kind": "server", "name": "tiny", "path": "/m",
                        "base_url": "http://127.0.0.1:8000"},
              "workload": {"name": "random", "num_prompts": 3, "input_len": [1, 2],
                           "output_len": [3, 4]},
              "settings": {"request_rate": "inf", "max_concurrency": None}, "runs": [run]}
    console = Console(width=300, record=True)
    render(report, console)
    text = console.export_text()
    assert "model 'tiny' served at http://127.0.0.1:8000" in text
    assert "Busiest second: requests active (vLLM)" in text
    assert "Most requests in flight at once" in text
    assert " - " not in text and "KV pool" not in text  # not measured: no row, no "-"


def test_requests_spread_over_lora_adapters(ckpt, tmp_path):
    from astrai.model.adapter import write_adapter
    from astrai.model.checkpoint import load_checkpoint
    from astrai.model.lora import LoraSpec, apply_lora

    dirs = []
    for i, (rank, targets) in enumerate([(4, ["all-linear"]), (8, ["q_proj", "v_proj"])]):
        model, _, _ = load_checkpoint(ckpt)
        spec = LoraSpec.build(rank, targets=targets)
        apply_lora(model, spec, seed=i)
        dirs.append(write_adapter(tmp_path / f"a{i}", model, spec, str(ckpt)))
    out = tmp_path / "bench.json"
    r = runner.invoke(app, ["serve-bench", str(ckpt), *FAST, "--threads", "1",
                            "--lora", f"a0={dirs[0]}", "--lora", f"a1={dirs[1]}",
                            "--max-loras", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["workload"]["loras"] == ["a0", "a1"] and d["runs"][0]["completed"] == 3
    r = runner.invoke(app, ["serve-bench", str(ckpt), "--lora", f"a0={dirs[0]}",
                            "--base-url", "http://127.0.0.1:1"])
    assert r.exit_code == 2 and "--lora loads adapters into the in-process" in r.output
