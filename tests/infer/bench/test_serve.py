"""serve_bench end to end on a tiny checkpoint and on the tiny preset (a few requests)."""

import json
import math

import pytest

from astrai.errors import ConfigError, DataError
from astrai.infer.bench import BenchConfig, serve_bench
from astrai.infer.config import CacheConfig

LATENCY_KEYS = [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                for s in ("mean", "median", "std", "p90", "p99")]
RUN_KEYS = ["backend", "duration", "completed", "failed", "total_input_tokens",
            "total_output_tokens", "request_throughput", "request_goodput", "input_throughput",
            "output_throughput", "total_token_throughput", "peak_concurrency",
            "mean_concurrency", "prefix_cache_hit_rate", "kv_pool_utilization_mean",
            "kv_pool_utilization_peak", "num_preemptions", "num_steps", *LATENCY_KEYS]


def cfg(target, **kw):
    kw.setdefault("cache", CacheConfig(max_kv_tokens=2048, max_requests=8))
    kw.setdefault("warmup", 1)
    return BenchConfig(str(target), **kw)


def test_random_workload_reports_every_metric(tiny_ckpt):
    rep = serve_bench(cfg(tiny_ckpt, num_prompts=5, input_len=(8, 20), output_len=(3, 6),
                          slos={"ttft": 1e6}))
    d = json.loads(json.dumps(rep.to_dict()))  # JSON-serializable as written by --json
    (run,) = d["runs"]
    assert sorted(set(RUN_KEYS) - set(run)) == []
    assert run["backend"] == "auto (torch_native)"
    assert run["completed"] == 5 and run["failed"] == 0
    recs = rep.runs[0].records
    # EOS is ignored: every request produced exactly the output length it asked for.
    assert run["total_output_tokens"] == sum(r.output_len for r in recs)
    assert 5 * 3 <= run["total_output_tokens"] <= 5 * 6
    assert d["workload"]["num_prompts"] == 5 and d["workload"]["name"] == "random"
    assert run["total_input_tokens"] == pytest.approx(5 * d["workload"]["mean_input_len"])
    assert run["request_goodput"] == pytest.approx(run["request_throughput"])  # lax SLO
    assert all(r.ttft > 0 and r.latency >= r.ttft for r in recs)
    assert 0 < run["kv_pool_utilization_peak"] <= 1
    assert run["peak_concurrency"] == 5  # rate inf, no limit: all in flight at once
    assert d["settings"]["request_rate"] == "inf"
    assert d["model"]["kind"] == "checkpoint"


def test_same_seed_same_workload(tiny_ckpt):
    a = serve_bench(cfg(tiny_ckpt, num_prompts=3, input_len=(5, 30), output_len=(2, 4),
                        warmup=0))
    b = serve_bench(cfg(tiny_ckpt, num_prompts=3, input_len=(5, 30), output_len=(2, 4),
                        warmup=0))
    ka = [(r.prompt_len, r.output_len) for r in a.runs[0].records]
    assert ka == [(r.prompt_len, r.output_len) for r in b.runs[0].records]


def test_shared_prefix_hits_the_radix_cache(tiny_ckpt):
    # One request at a time: every request after its group's first reuses the 2 full
    # prefix pages (32 tokens) and nothing else (the questions are random).
    kw = {"workload": "shared-prefix", "num_prompts": 6, "prefix_groups": 2, "prefix_len": 32,
              "input_len": (3, 5), "output_len": (2, 2), "max_concurrency": 1}
    run = serve_bench(cfg(tiny_ckpt, **kw)).runs[0].metrics
    assert run["prefix_cache_hit_tokens"] == (6 - 2) * 32
    assert run["prefix_cache_hit_rate"] == pytest.approx(
        128 / run["prefix_cache_query_tokens"])
    assert run["peak_concurrency"] == 1
    off = serve_bench(cfg(tiny_ckpt, cache=CacheConfig(max_kv_tokens=2048, radix=False),
                          **kw)).runs[0].metrics
    assert off["prefix_cache_hit_rate"] == 0.0


def test_poisson_arrivals_respect_max_concurrency(tiny_ckpt):
    rep = serve_bench(cfg(tiny_ckpt, num_prompts=6, input_len=(4, 8), output_len=(2, 3),
                          request_rate=200.0, burstiness=0.5, max_concurrency=2))
    run = rep.runs[0].metrics
    assert run["completed"] == 6 and 1 <= run["peak_concurrency"] <= 2
    assert rep.settings["request_rate"] == 200.0 and rep.settings["burstiness"] == 0.5


def test_jsonl_workload_and_too_long_requests(tiny_ckpt, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "To be, or not to be", "output_len": 3}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    rep = serve_bench(cfg(tiny_ckpt, workload=str(f), output_len=(2, 2)))
    assert rep.workload["name"] == "jsonl" and rep.workload["num_prompts"] == 2
    assert rep.runs[0].metrics["total_output_tokens"] == 5
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt_ids": [5] * 250, "output_len": 10}) + "\n")
    with pytest.raises(DataError, match=r"long\.jsonl:1: prompt 250 \+ output 10 tokens "
                                        r"exceed the context of 256"):
        serve_bench(cfg(tiny_ckpt, workload=str(long)))


def test_preset_target_and_bad_targets(tmp_path):
    rep = serve_bench(BenchConfig("tiny", num_prompts=2, input_len=(4, 4), output_len=(2, 2),
                                  warmup=0, cache=CacheConfig(max_kv_tokens=1024)))
    assert rep.model["kind"] == "preset" and "BPE" in rep.model["tokenizer"]
    assert rep.runs[0].metrics["total_output_tokens"] == 4
    with pytest.raises(ConfigError, match="neither a checkpoint directory nor a preset"):
        serve_bench(BenchConfig("nope"))
    with pytest.raises(ConfigError, match="--max-concurrency"):
        serve_bench(BenchConfig("tiny", max_concurrency=0))
    with pytest.raises(ConfigError, match="backend 'gpu'"):
        serve_bench(BenchConfig("tiny", backends=["gpu"]))
    assert math.isinf(BenchConfig("tiny").request_rate)


def test_checkpoint_without_tokenizer_runs_token_ids_only(tiny_ckpt, tmp_path):
    from astrai.model.checkpoint import load_checkpoint, save_checkpoint

    model, config, _ = load_checkpoint(tiny_ckpt)
    bare = save_checkpoint(tmp_path / "bare", model, config)
    rep = serve_bench(cfg(bare, num_prompts=2, input_len=(4, 4), output_len=(3, 3)))
    assert rep.model["tokenizer"] is None and rep.runs[0].metrics["total_output_tokens"] == 6
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt_ids": [7, 8, 9], "output_len": 2}) + "\n"
                 + json.dumps({"prompt": "text"}) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl:2: a text prompt needs a tokenizer"):
        serve_bench(cfg(bare, workload=str(f)))


def test_speculative_decoding_reports_its_acceptance(tiny_ckpt):
    from astrai.infer.config import SpeculativeConfig

    base = dict(num_prompts=3, input_len=(8, 20), output_len=(6, 10), warmup=0)
    plain = serve_bench(cfg(tiny_ckpt, **base))
    spec = serve_bench(cfg(tiny_ckpt, speculative=SpeculativeConfig(num_speculative_tokens=3),
                           **base))
    run, d = spec.runs[0].metrics, spec.to_dict()
    assert run["spec_draft_tokens"] >= run["spec_accepted_tokens"] >= 0
    assert run["spec_acceptance_rate"] == pytest.approx(
        run["spec_accepted_tokens"] / max(run["spec_draft_tokens"], 1))
    assert d["settings"]["speculative"]["method"] == "ngram"
    assert "spec_draft_tokens" not in plain.runs[0].metrics
    assert plain.runs[0].metrics["decode_path"] in ("native", "eager")
    assert run["total_output_tokens"] == plain.runs[0].metrics["total_output_tokens"]
