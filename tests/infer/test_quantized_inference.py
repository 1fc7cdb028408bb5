"""`quantize='int8'` end to end on a tiny model trained for a few steps (the `trained`
fixture of conftest.py): bits per byte
within 1% of fp32 (astrai checkpoint and its HF export), the engine's greedy tokens equal
to a model holding the dequantized weights in fp32, and the loading errors and warnings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai.errors import ConfigError
from astrai.eval.perplexity import evaluate_perplexity
from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.loading import dtype_warning, load_model
from astrai.model import build_model
from astrai.model.quant import Int8Linear


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


def test_load_model_quantizes_after_merging_and_refuses_unknown_formats(trained):
    ckpt = trained[0]
    m = load_model(ckpt, device="cpu", quantize="int8")
    assert isinstance(m.layers[0].mlp.down_proj, Int8Linear) and not m.training
    assert type(load_model(ckpt, device="cpu", quantize="none").lm_head) is nn.Linear
    with pytest.raises(ConfigError, match="--quantize 'int4': use none or int8"):
        load_model(ckpt, device="cpu", quantize="int4")
    eng = Engine.from_checkpoint(ckpt, device="cpu", quantize="int8")
    assert isinstance(eng.model.lm_head, Int8Linear)


def test_bf16_on_a_cpu_without_bf16_instructions_warns(monkeypatch):
    import astrai.device as device

    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    note = dtype_warning("cpu", "bfloat16")
    assert note is not None and "slower than float32" in note and "\n" not in note
    assert dtype_warning("cpu", None) is None and dtype_warning("cpu", "float32") is None
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: True)
    assert dtype_warning("cpu", "bfloat16") is None
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: None)  # cannot tell: say nothing
    assert dtype_warning("cpu", "bfloat16") is None
