"""benchmarks/cpu_decode.py's pieces that decide what a reader sees: llama.cpp's tools read
through their JSON (a crash is a BROKEN row, not a figure), interleaved seeded rounds, the
sanity floor that keeps a broken peer out of the ratios, the token checks."""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import cpu_decode
import cpu_decode_llama as llama
import cpu_decode_quality as quality
import cpu_decode_report as report
from cpu_decode_astrai import Figures
from cpu_decode_setup import Job, Results, Shape

# two records as llama-bench 0.3.36's `-o json` writes them (fields trimmed)
BENCH_JSON = [
    {"build_commit": "abc", "cpu_info": "AMD EPYC", "backends": "CPU", "n_threads": 2,
     "type_k": "f16", "n_prompt": 512, "n_gen": 0, "avg_ts": 250.5, "load_mode": "mmap"},
    {"build_commit": "abc", "cpu_info": "AMD EPYC", "backends": "CPU", "n_threads": 2,
     "type_k": "f16", "n_prompt": 0, "n_gen": 128, "avg_ts": 45.25, "load_mode": "mmap"}]


def fake_tool(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "tool"
    f.write_text("#!/bin/sh\n" + body + "\n")
    f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return f


def test_llama_bench_json_gives_pp512_tg128_and_its_conditions(tmp_path):
    out = tmp_path / "out.json"
    out.write_text(json.dumps(BENCH_JSON))
    fig, row = llama.bench(fake_tool(tmp_path, f"cat {out}"), tmp_path / "m.gguf", 2)
    assert (fig.pp, fig.tg) == (250.5, 45.25)
    assert "type_k=f16" in llama.conditions(row) and "load_mode=mmap" in llama.conditions(row)


def test_a_crashing_or_silent_tool_is_a_peer_error(tmp_path):
    with pytest.raises(llama.PeerError, match=r"exited with -11: about to crash"):
        llama.bench(fake_tool(tmp_path, "echo about to crash >&2; kill -SEGV $$"),
                    tmp_path / "m.gguf", 2)
    with pytest.raises(llama.PeerError, match="no pp512/tg128 record"):
        llama.bench(fake_tool(tmp_path, "echo '[]'"), tmp_path / "m.gguf", 2)


def test_batched_bench_jsonl_gives_aggregate_pp_and_tg(tmp_path):
    line = ('{"n_kv_max": 2560, "pp": 512, "tg": 128, "pl": 4, "speed_pp": 300.5, '
            '"speed_tg": 120.25, "speed": 200.0}')
    tool = fake_tool(tmp_path, f"echo 'main: loading' >&2; echo '{line}'")
    assert llama.batched(tool, tmp_path / "m.gguf", 2) == Figures(300.5, 120.25)


def test_rounds_run_every_job_once_in_a_seeded_shuffled_order(monkeypatch):
    jobs = [Job("125m", t, f, "b1") for t in ("astrai", "llama.cpp")
            for f in ("fp32", "int8", "int4")]
    seen: list[Job] = []

    def run_job(job, shapes, tools, threads):
        seen.append(job)
        if job == jobs[4]:
            raise llama.PeerError("llama-bench exited with -11")
        return Figures(100.0, float(len(seen)))

    monkeypatch.setattr(cpu_decode, "run_job", run_job)
    res = cpu_decode.run_rounds({}, {}, jobs, 3, 2, 0, lambda m: None)
    rounds = [seen[:6], seen[6:11], seen[11:]]
    assert sorted(rounds[0], key=jobs.index) == jobs  # every job in round 1
    assert jobs[4] not in rounds[1] + rounds[2]  # a crashed peer is not rerun
    assert all(len(res.tg[j]) == 3 for j in jobs if j != jobs[4])
    assert res.errors == {jobs[4]: "llama-bench exited with -11"}
    assert rounds[0] != jobs or rounds[1] != [j for j in jobs if j != jobs[4]]  # shuffled
    again: list[Job] = []
    monkeypatch.setattr(cpu_decode, "run_job", lambda j, *a: again.append(j) or Figures(1, 1))
    cpu_decode.run_rounds({}, {}, jobs, 1, 2, 0, lambda m: None)
    assert again == rounds[0]  # the same seed, the same order


def shape_with_floor(tok_s: float) -> Shape:
    s = Shape("125m", 117_000_000, True, None, engines={"fp32": None})
    s.bytes = {("astrai", "fp32"): 1000, ("llama.cpp", "fp32"): 1000}
    s.bandwidth = {1000: 1000 * tok_s}
    return s


def test_a_peer_under_a_tenth_of_its_floor_is_broken_and_gets_no_ratio():
    s = shape_with_floor(100.0)
    res = Results()
    a, p = Job("125m", "astrai", "fp32", "b1"), Job("125m", "llama.cpp", "fp32", "b1")
    res.pp = {a: [400.0] * 5, p: [300.0] * 5}
    res.tg = {a: [60.0] * 5, p: [9.0, 8.0, 9.5, 50.0, 9.0]}  # median 9 < 10% of 100
    assert "under 10% of its bandwidth floor 100" in report.broken(s, res, p)
    assert report.broken(s, res, a) is None
    res.tg[a] = [60.0, 5.0, 62.0]  # one round slowed by the machine is not a broken tool
    assert report.broken(s, res, a) is None
    lines, missed = report.ratios(s, res, cpu_decode.TARGETS)
    assert all("no ratio (BROKEN: tg128 9.0 tok/s" in ln for ln in lines) and not missed
    res.tg[p] = [40.0, 50.0, 45.0]
    lines, missed = report.ratios(s, res, cpu_decode.TARGETS)
    assert lines[1].endswith("= 60.0 / 45.0 = 1.33 (target ≥ 1.2) PASS")
    assert lines[0].endswith("= 400.0 / 300.0 = 1.33 (target ≥ 1.0) PASS") and not missed
    res.tg[p] = [55.0]
    assert report.ratios(s, res, cpu_decode.TARGETS)[1]


def test_token_checks_assert_f32_and_rate_quantized_agreement():
    assert quality.agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]]) == pytest.approx(4 / 6)
    q = {"checkpoint": "ck", "tokens_scored": 10, "bytes": 40,
         "fp32": {"bpb": 2.0, "tokens": [[1, 2]]}, "int8": {"bpb": 2.01, "tokens": [[1, 2]]},
         "int4": {"bpb": 2.1, "tokens": [[1, 3]]},
         "f32": {"bpb": 2.0, "tokens": [[1, 2]], "agreement": 1.0},
         "q8_0": {"error": "llama-cpp-python exited with -11: x"},
         "q4_0": {"bpb": 2.09, "tokens": [[1, 3]], "agreement": 1.0}}
    text = "\n".join(quality.lines(q))
    assert "tokens astrai fp32 == llama.cpp f32 (greedy, exact formats): PASS" in text
    assert "llama.cpp q8_0  BROKEN (llama-cpp-python exited with -11: x)" in text
    assert "target int4 bpb within 3% of fp32: 1.0500 MISS" in text
    q["f32"]["tokens"] = [[1, 5]]
    assert "exact formats): FAIL" in "\n".join(quality.lines(q))


def test_report_prints_machine_table_ratios_contention_and_fails_on_unequal_tokens(
        monkeypatch, capsys):
    import argparse

    import cpu_decode_setup

    monkeypatch.setattr(report, "read_bandwidth", lambda n: 20e9)
    monkeypatch.setattr(cpu_decode_setup, "read_bandwidth", lambda n: 1000 * 100.0)
    s = shape_with_floor(100.0)
    s.llama_conditions = "n_threads=2, load_mode=mmap"
    res = Results()
    for tool, idle, busy in (("astrai", 60.0, 30.0), ("llama.cpp", 50.0, 10.0)):
        res.pp[Job("125m", tool, "fp32", "b1")] = [300.0, 310.0, 290.0]
        res.tg[Job("125m", tool, "fp32", "b1")] = [idle, idle + 2, idle - 2]
        res.tg[Job("125m", tool, "fp32", "contended")] = [busy]
    res.errors[Job("125m", "llama.cpp", "fp32", "b4")] = "llama-batched-bench exited with -6"
    res.pp[Job("125m", "astrai", "fp32", "b4")] = [900.0]
    res.tg[Job("125m", "astrai", "fp32", "b4")] = [150.0]
    a = argparse.Namespace(threads=2, rounds=3, quick=True, seed=0, isa="native")
    q = {"checkpoint": "ck", "tokens_scored": 10, "bytes": 40,
         "fp32": {"bpb": 2.0, "tokens": [[1, 2]]}, "int8": {"bpb": 2.0, "tokens": [[1, 2]]},
         "int4": {"bpb": 2.0, "tokens": [[1, 2]]},
         "f32": {"bpb": 2.0, "tokens": [[1, 2]], "agreement": 1.0},
         "q8_0": {"bpb": 2.0, "tokens": [[1, 2]], "agreement": 1.0},
         "q4_0": {"bpb": 2.0, "tokens": [[1, 2]], "agreement": 1.0}}
    assert not report.report(a, {"125m": s}, res, q, False, (0.5, 0.4, 0.3), cpu_decode.TARGETS)
    out = capsys.readouterr().out
    assert "read bandwidth (streaming sum, 2 threads, 1 GiB): 20.0 GB/s" in out
    assert "load average before: 0.50 0.40 0.30" in out and "load average after:" in out
    assert "bf16 ↔ bf16: skipped" in out and "llama-bench (125m): n_threads=2" in out
    assert "instruction path: native (llama.cpp -DGGML_NATIVE=ON" in out
    assert re.search(r"\n  llama\.cpp f32 +4 concurrent +BROKEN: llama-batched-bench exited", out)
    assert re.search(r"\n  astrai fp32 +1 request +300\.0 \[290\.0–310\.0\] +60\.0 \[58\.0–62\.0\]", out)
    assert "tg128 1 request: astrai fp32 / llama.cpp f32 = 60.0 / 50.0 = 1.20" in out
    assert "4 concurrent: astrai fp32 / llama.cpp f32: no ratio (BROKEN: llama-batched" in out
    assert "contention 125m tg128 astrai fp32: 30.0 / 60.0 idle = 0.50 (target ≥ 0.4) PASS" in out
    assert "contention 125m tg128 llama.cpp f32: 10.0 / 50.0 idle = 0.20" in out
    a.isa = "avx2"  # both tools on their AVX2 code: said in the header, bf16 skipped for it
    assert not report.report(a, {"125m": s}, res, q, False, (0.5, 0.4, 0.3), cpu_decode.TARGETS)
    out = capsys.readouterr().out
    assert "instruction path: AVX2 + FMA on both (--isa avx2: llama.cpp -DGGML_NATIVE=OFF" in out
    assert "bf16 ↔ bf16: skipped (--isa avx2)" in out
    q["f32"]["tokens"] = [[1, 3]]
    assert report.report(a, {"125m": s}, res, q, False, (0, 0, 0), cpu_decode.TARGETS)
