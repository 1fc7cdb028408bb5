"""The engine's one decode path (astrai.infer.decode_path): chosen once and named, every step
through one call site, and a fast path checked against the eager step on its first step —
a broken kernel (wrong logits, or an exception) is switched off with one warning and the
engine's tokens stay the eager path's."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.backends.base import mismatch as output_mismatch
from astrai.infer.decode_path import MIN_COSINE
from astrai.infer.decode_step import DecodeStep
from astrai.kernels.cpu_linear import cpu_decode_kernels

from .conftest import random_prompts

KERNELS = cpu_decode_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no CPU decode kernels here")
PROMPTS = random_prompts((5, 9, 3), seed=4)
PARAMS = SamplingParams.greedy(8, ignore_eos=True)


def engine(model, decode="auto", kernels="auto"):
    return Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4),
                  decode=decode, kernels=kernels)


@pytest.fixture(scope="module")
def eager_tokens(model):
    return [o.token_ids for o in engine(model, "eager").generate(PROMPTS, PARAMS)]


def mismatch(fast, ref):
    """The decode path's first-step comparison."""
    return output_mismatch(fast, ref, "logits", "the eager step's", MIN_COSINE)


def test_mismatch_tolerates_rounding_and_catches_wrong_logits():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 50, generator=g) * 5
    assert mismatch(ref + 1e-3 * torch.randn(3, 50, generator=g), ref) is None
    assert mismatch(ref.bfloat16().float(), ref) is None  # bf16 rounding
    assert "cosine" in mismatch(ref[[1, 0, 2]], ref)  # rows swapped: a slot misread
    assert "cosine" in mismatch(-ref, ref)
    assert "cosine" in mismatch(torch.zeros_like(ref), ref)  # nothing computed
    nan = ref.clone()
    nan[1, 3] = float("nan")
    assert mismatch(nan, ref) == "non-finite logits"
    assert "shape" in mismatch(ref[:2], ref)
    assert MIN_COSINE > 0.9


@needs_kernels
def test_a_working_native_path_stays_on_after_its_first_step(model, eager_tokens, caplog):
    eng = engine(model)
    assert eng.decode_path.name == "native" and not eng.decode_path.checked
    with caplog.at_level(logging.WARNING, logger="astrai.infer"):
        out = eng.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in out] == eager_tokens
    assert eng.decode_path.checked and eng.decode_path.failure is None
    assert eng.stats().decode == "native"
    assert "switched off" not in caplog.text


def wrong_rows(f):
    """A native kernel that reads the wrong rows: its logits come back row-rotated (one
    request's logits for another) and shifted."""
    def g(*args):
        out = f(*args)
        return out.roll(1, dims=0) + out.roll(7, dims=1) if out.shape[0] > 1 else -out
    return g


def raising(f):
    def g(*args):
        raise RuntimeError("index 4097 out of range for the K/V pool")
    return g


@needs_kernels
@pytest.mark.parametrize("breakage", [wrong_rows, raising])
def test_a_broken_native_kernel_is_switched_off_with_one_warning(model, eager_tokens, caplog,
                                                                 breakage):
    broken = dataclasses.replace(KERNELS, decode_layers=breakage(KERNELS.decode_layers))
    eng = engine(model, kernels=broken)
    assert eng.decode_path.name == "native"
    with caplog.at_level(logging.WARNING, logger="astrai.infer"):
        out = eng.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in out] == eager_tokens
    warnings = [r.getMessage() for r in caplog.records if "switched off" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("decode path native switched off")
    assert eng.stats().decode == "eager" and eng.decode_path.failure.startswith("native: ")


def test_a_broken_static_step_is_switched_off_too(model, eager_tokens, monkeypatch, caplog):
    real = DecodeStep.run
    monkeypatch.setattr(DecodeStep, "run", lambda self, batch: real(self, batch) * -1)
    eng = engine(model, "static")
    assert eng.decode_path.name == "static"
    with caplog.at_level(logging.WARNING, logger="astrai.infer"):
        out = eng.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in out] == eager_tokens
    assert eng.stats().decode == "eager"
    assert "decode path static switched off" in caplog.text


def test_the_path_is_chosen_once_and_named(model):
    assert engine(model, "eager").decode_path.name == "eager"
    assert engine(model, "static").decode_path.name == "static"
    assert engine(model, "auto", kernels=None).decode_path.name == "eager"  # no kernels
    if KERNELS is not None:
        assert engine(model, "native").decode_path.name == "native"


def test_a_fast_step_failing_after_its_check_switches_off_too(model, eager_tokens, monkeypatch,
                                                              caplog):
    """A CUDA graph is captured per batch bucket at its first use: a capture failing on a
    later step (here: the static step raising from its fourth call) goes eager the same way,
    and the step that failed is answered by the eager runner."""
    real, calls = DecodeStep.run, []

    def flaky(self, batch):
        calls.append(len(batch.chunks))
        if len(calls) >= 4:
            raise RuntimeError("CUDA graph capture failed")
        return real(self, batch)

    monkeypatch.setattr(DecodeStep, "run", flaky)
    eng = engine(model, "static")
    with caplog.at_level(logging.WARNING, logger="astrai.infer"):
        out = eng.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in out] == eager_tokens
    assert len(calls) == 4 and eng.stats().decode == "eager"
    assert "capture failed" in eng.decode_path.failure
