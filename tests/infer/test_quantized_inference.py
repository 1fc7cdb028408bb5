"""`quantize='int8'` end to end on a tiny model trained for a few steps (the `trained`
fixture of conftest.py): bits per byte
within 1% of fp32 (astrai checkpoint and its HF export), the engine's greedy tokens equal
to a model holding the dequantized weights in fp32, a request's tokens the same whatever
requests share its batches (with and without the CPU kernels), and the loading errors and
warnings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai.errors import ConfigError
from astrai.eval.perplexity import evaluate_perplexity
from astrai.infer import CacheConfig, Engine, SamplingParams, SchedulerConfig
from astrai.infer.loading import dtype_warning, load_model
from astrai.kernels import cpu_linear
from astrai.model import build_model
from astrai.model.quant import Int8Linear, quantize_model

from .conftest import random_prompts, small_config


@pytest.mark.parametrize("which", ["ckpt", "hf"])
def test_bits_per_byte_within_one_percent_of_fp32(trained, which):
    ckpt, hf, held, _ = trained
    path = ckpt if which == "ckpt" else hf
    ref = evaluate_perplexity(path, held, device="cpu")
    got = evaluate_perplexity(path, held, device="cpu", quantize="int8")
    assert ref.bpb < 1.5  # the model learnt the text: the comparison means something
    assert abs(got.bpb - ref.bpb) / ref.bpb < 0.01
    assert got.bpb != ref.bpb  # the weights did change


def dequantized_twin(q: nn.Module) -> nn.Module:
    """A plain fp32 model holding the weights the int8 model multiplies by."""
    twin = build_model(q.config, seed=0).eval()
    int8 = (".qweight", ".scale", ".scale_bf16")
    state = {k: v for k, v in q.state_dict().items() if not k.endswith(int8)}
    state.update({f"{name}.weight": m.dequantized() for name, m in q.named_modules()
                  if isinstance(m, Int8Linear)})
    twin.load_state_dict(state)  # strict: every weight of the plain model is there
    return twin


def greedy(model: nn.Module, prompt: list[int], n: int = 32) -> list[int]:
    eng = Engine(model, None, CacheConfig(page_size=16, max_kv_tokens=512, max_requests=2))
    return eng.generate(prompt, SamplingParams.greedy(n, ignore_eos=True))[0].token_ids


def test_engine_greedy_tokens_equal_the_dequantized_fp32_model(trained):
    ckpt, _, _, ids = trained
    q = load_model(ckpt, device="cpu", quantize="int8")
    twin = dequantized_twin(q)
    # the prompt whose reference continuation is best separated (top-1 minus top-2 logit)
    best = None
    for start in (0, 100, 200, 300, 400):
        prompt = ids[start:start + 8].tolist()
        ref = greedy(twin, prompt)
        with torch.no_grad():
            logits = twin(torch.tensor([prompt + ref])).logits[0, len(prompt) - 1:-1]
        top2 = logits.topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        if best is None or margin > best[0]:
            best = (margin, prompt, ref)
    margin, prompt, ref = best
    assert margin > 0.2, "the fixture's model should continue its text with clear choices"
    assert greedy(q, prompt) == ref


@pytest.mark.parametrize("kernels", ["cpu kernels", "torch"])
def test_a_requests_tokens_do_not_depend_on_its_batch(kernels, monkeypatch):
    """16 prompts x 64 greedy tokens in one batch equal each prompt run alone: every int8
    product quantizes each row by its own values, the same way whichever of the kernel
    (a few rows: decode, short prompts) and torch (the batch's prefill) serves it. The
    sharp random model of conftest.py (top-1/top-2 gaps far above fp32 noise)."""
    if kernels == "torch":
        monkeypatch.setenv("ASTRAI_CPU_KERNELS", "0")
    elif cpu_linear.cpu_decode_kernels() is None:
        pytest.skip("the CPU decode kernels do not build here")
    else:  # the kernels that quantize the int8 products' activations (VNNI's and AVX2's)
        import astrai.infer.engine as engine_module

        monkeypatch.setattr(engine_module, "cpu_decode_kernels",
                            lambda: cpu_linear.cpu_decode_kernels(int8_act="int8"))
    model = quantize_model(build_model(small_config(), seed=0).eval())
    prompts = random_prompts([3 + 2 * i for i in range(16)], seed=7)  # 3..33 tokens
    params = SamplingParams.greedy(64, ignore_eos=True)

    def engine() -> Engine:  # no prefix sharing: each run computes its own K/V
        return Engine(model, None, CacheConfig(page_size=16, max_kv_tokens=2048,
                                               max_requests=16, radix=False),
                      scheduler_config=SchedulerConfig(max_step_tokens=2048))

    together = [o.token_ids for o in engine().generate(prompts, params)]
    eng = engine()
    alone = [eng.generate(p, params)[0].token_ids for p in prompts]
    assert sum(a == b for a, b in zip(together, alone)) == 16


def test_load_model_quantizes_after_merging_and_refuses_unknown_formats(trained):
    ckpt = trained[0]
    m = load_model(ckpt, device="cpu", quantize="int8")
    assert isinstance(m.layers[0].mlp.down_proj, Int8Linear) and not m.training
    assert type(load_model(ckpt, device="cpu", quantize="none").lm_head) is nn.Linear
    with pytest.raises(ConfigError, match="--quantize 'int3': use none or int8, int4"):
        load_model(ckpt, device="cpu", quantize="int3")
    eng = Engine.from_checkpoint(ckpt, device="cpu", quantize="int8")
    assert isinstance(eng.model.lm_head, Int8Linear)


def test_bf16_on_a_cpu_without_bf16_instructions_warns(monkeypatch):
    from astrai import device

    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    note = dtype_warning("cpu", "bfloat16")
    assert note is not None and "slower than float32" in note and "\n" not in note
    assert dtype_warning("cpu", None) is None and dtype_warning("cpu", "float32") is None
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: True)
    assert dtype_warning("cpu", "bfloat16") is None
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: None)  # cannot tell: say nothing
    assert dtype_warning("cpu", "bfloat16") is None
