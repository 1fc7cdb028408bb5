"""The native decode step (astrai.infer.native_step, csrc/cpu/decode_layers.h): the tokens
and logits of the eager ragged path and of full recomputation, across model families, int8
and bf16 weights, prefix sharing, preemption and speculative verification (several query
rows per request); the models it cannot serve fall back to the eager path."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astrai.infer import SamplingParams
from astrai.infer.config import SpeculativeConfig
from astrai.infer.native_step import unsupported
from astrai.kernels import cpu_build
from astrai.kernels.cpu_linear import cpu_decode_kernels, load_ops
from astrai.model import build_model
from astrai.model.lora import LoraSpec, apply_lora
from astrai.model.quant import quantize_model

from .conftest import (
    EAGER_CASES,
    assert_equals_full_recompute,
    assert_equals_the_eager_path,
    assert_same_outputs,
    random_prompts,
    small_config,
)
from .conftest import (
    paged_engine as engine,
)

pytestmark = pytest.mark.skipif(cpu_decode_kernels() is None,
                                reason="astrai's CPU decode kernels are not available here")

NEW = 10
FAMILIES = {  # llama, qwen2 (q/k/v biases), qwen3 (QK-norm), tied embeddings, mistral's window
    "llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True},
    "tied": {"tie_embeddings": True}, "window-beyond-context": {"sliding_window": 4096},
    # widths no vector length divides: the norms' and SwiGLU's tails
    "odd-widths": {"dim": 76, "ffn_dim": 100},
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_native_step_equals_full_recompute(family):
    model = build_model(small_config(**FAMILIES[family]), seed=3).eval()
    assert assert_equals_full_recompute(model, "auto").stats().decode == "native"


@pytest.mark.parametrize("case", list(EAGER_CASES))
def test_native_step_equals_the_eager_path(model, case):
    assert assert_equals_the_eager_path(model, "auto", case).stats().decode == "native"


def test_verify_rows_equal_the_ragged_forward(model):
    """Every native step of a speculating engine (decodes, and verifies of 1 + k rows per
    request beside them) gives the logits the eager runner gives for the same batch."""
    eng = engine(model, rows=4, speculative=SpeculativeConfig(method="ngram",
                                                             num_speculative_tokens=8))
    native_run, seen = eng.decode_path.fast.run, []

    def both(batch):
        ours = native_run(batch)
        theirs = eng.runner.run(batch, eng.backend())  # rewrites the same K/V
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
        seen.append(max(len(c.draft) for c in batch.chunks))
        return ours

    eng.decode_path.fast.run = both
    prompts = [p * 3 for p in random_prompts((8, 5, 11), seed=8)]
    eng.generate(prompts, SamplingParams.greedy(16, ignore_eos=True))
    assert max(seen) > 0 and min(seen) == 0  # verify steps and plain ones


@pytest.mark.parametrize("kv", ["float16", "bfloat16"])
def test_a_16_bit_kv_pool_under_fp32_activations(model, kv):
    """fp32 activations over a 16-bit KV pool (llama.cpp's default cache is f16): the native
    step writes each K/V row rounded to the pool's dtype and attends in fp32 — the eager
    path's tokens and log-probabilities, prefix pages read back from the pool."""
    prompts = random_prompts((5, 17, 33, 1, 40, 9), seed=5)
    prompts = [prompts[2][:20] + p for p in prompts]
    params = SamplingParams.greedy(NEW, logprobs=True)
    eng = engine(model, kv_dtype=kv)
    assert_same_outputs(eng.generate(prompts, params),
                        engine(model, "eager", kv_dtype=kv).generate(prompts, params))
    assert eng.stats().decode == "native" and eng.pool.storage.k.dtype == getattr(torch, kv)
    assert eng.stats().pool.prefix_hit_rate > 0


def test_the_plan_sees_weights_updated_in_place():
    """The step's plan reads the weights' own storage: after an in-place update (an
    optimizer step), the same engine decodes what an eager engine decodes on the new
    weights, not what it decoded before."""
    model = build_model(small_config(qkv_bias=True), seed=5).eval()
    prompts, params = random_prompts((6, 9), seed=2), SamplingParams.greedy(NEW, ignore_eos=True)
    eng = engine(model, radix=False)
    before = [o.token_ids for o in eng.generate(prompts, params)]
    with torch.no_grad():
        for block in model.layers:
            block.mlp.down_proj.weight.mul_(-4)
            block.attn.k_proj.bias.add_(1.5)
    after = [o.token_ids for o in eng.generate(prompts, params)]
    eager = [o.token_ids for o in engine(model, "eager", radix=False).generate(prompts, params)]
    assert eng.stats().decode == "native"
    assert after == eager and after != before


def test_row_limit_follows_the_weight_format(model):
    """fp32 and int8 blocks take the kernels' 16 rows (a verify of 8 proposals runs native),
    bf16 blocks 8."""
    k = cpu_decode_kernels()
    assert engine(model).decode_path.fast.max_rows == k.fp32_rows[1] == 16
    q = quantize_model(copy.deepcopy(model), "int8")
    assert engine(q).decode_path.fast.max_rows == k.int8_rows[1]
    assert engine(copy.deepcopy(model).bfloat16()).decode_path.fast.max_rows == k.bf16_rows[1] == 8


def test_speculative_greedy_equals_plain(model):
    """Prompts that repeat themselves: ngram proposals are accepted, the verify steps run
    native, and the tokens equal plain decoding's."""
    base = random_prompts((12, 7), seed=9)
    prompts = [p * 4 for p in base]
    params = SamplingParams.greedy(24, ignore_eos=True)
    spec = engine(model, speculative=SpeculativeConfig(method="ngram",
                                                       num_speculative_tokens=4))
    a = spec.generate(prompts, params)
    b = engine(model, "eager").generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    st = spec.stats()
    assert st.decode == "native" and st.spec_draft_tokens > 0


def test_native_step_with_int8_weights(model):
    q = quantize_model(copy.deepcopy(model), "int8")
    prompts = random_prompts((7, 3, 12), seed=6)
    params = SamplingParams.greedy(NEW)
    eng = engine(q)
    assert eng.stats().decode == "native"
    a, b = eng.generate(prompts, params), engine(q, "eager").generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_native_step_in_bf16():
    """bf16 weights and KV: each step's log-probabilities within bf16 rounding of the eager
    path's (the same ops, rounded at the same points; tiny shapes)."""
    model = build_model(small_config(qk_norm=True, init_std=0.1), seed=4).eval().bfloat16()
    prompts = random_prompts((6, 11), seed=10)
    params = SamplingParams.greedy(6, logprobs=True)
    eng = engine(model)
    assert eng.stats().decode == "native"
    native_run, logits = eng.decode_path.fast.run, []
    eng.decode_path.fast.run = lambda batch: logits.append(native_run(batch)) or logits[-1]
    a, b = eng.generate(prompts, params), engine(model, "eager").generate(prompts, params)
    # fp32 logits holding the bf16 head's values, as the eager path's .float() gives them
    assert logits and all(x.dtype == torch.float32 for x in logits)
    assert all(torch.equal(x, x.bfloat16().float()) for x in logits)
    for x, y in zip(a, b):
        assert x.token_ids[0] == y.token_ids[0]  # the prefill's token: no native step yet
        n = next((i for i, (s, t) in enumerate(zip(x.token_ids, y.token_ids)) if s != t),
                 len(x.token_ids))
        torch.testing.assert_close(x.logprobs[:n], y.logprobs[:n], atol=0.05, rtol=0.05)


def test_models_it_cannot_serve_fall_back(model, window_model):
    k = cpu_decode_kernels()
    eng = engine(model)
    assert unsupported(model, eng.pool, None) == "no CPU decode kernels"
    assert "sliding_window=" in unsupported(window_model, engine(window_model).pool, k)
    assert engine(window_model).stats().decode == "eager"
    lora = apply_lora(copy.deepcopy(model), LoraSpec(rank=2, alpha=4.0))
    assert "LoRALinear" in unsupported(lora, eng.pool, k)
    hooked = copy.deepcopy(model)
    hooked.layers[0].register_forward_hook(lambda *a: None)
    assert "hooks" in unsupported(hooked, eng.pool, k)
    assert engine(model, "eager").stats().decode == "eager"
    assert engine(model, "static").stats().decode == "static"


@pytest.mark.slow
@pytest.mark.skipif(cpu_build.best_isa() != "avx512" or "ASTRAI_CPU_ISA" in os.environ,
                    reason="an AVX-512 CPU: its engine takes the AVX-512 build, so the AVX2 "
                    "build's native step (an AMD Zen 3's) is run here on purpose")
def test_the_native_step_and_int4_on_the_avx2_build():
    """This file, the native-step features and the int4 engine with ASTRAI_CPU_ISA=avx2, in
    a process of their own (the engine picks its build once per process)."""
    try:  # its own op namespace: loading it here too is harmless
        load_ops("avx2")
    except cpu_build.CpuKernelUnavailable as e:
        pytest.skip(f"no AVX2 build here: {e}")
    here = Path(__file__).parent
    env = {**os.environ, "ASTRAI_CPU_ISA": "avx2"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p",
                        "no:cacheprovider", str(here / "test_native_step.py"),
                        str(here / "test_native_features.py"),
                        str(here / "test_int4_inference.py")],
                       cwd=here.parents[1], env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
