"""check_lockin on live parameters and the LockInGuard callback against a fake context."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from astrai.inspect.guard import (
    HIST_HIGH,
    HIST_LOW,
    GuardConfig,
    LockInGuard,
    check_lockin,
    grad_histograms,
    grad_norms,
)
from astrai.inspect.testing import plant_lockin, tiny_config
from astrai.model import build_model


class FakeLogger:
    def __init__(self):
        self.infos, self.warnings = [], []

    def info(self, msg, *args):
        self.infos.append(msg % args if args else msg)

    def warning(self, msg, *args):
        self.warnings.append(msg % args if args else msg)


def _model(seed=0):
    return build_model(tiny_config(), seed=seed)


def test_check_lockin_on_live_parameters_matches_planted():
    cfg = tiny_config()
    model = _model()
    with torch.no_grad():
        plant_lockin(dict(model.named_parameters()), cfg)
    chk = check_lockin(model.named_parameters(), lr=1e-4)
    c = chk.counts()
    assert c["locked"] == 3 * 2 * 64 + 4 * 60 + 64
    assert c["overflow"] == 4 * 40 and c["nonfinite"] == 3
    assert 0 < c["dead_zone"] < 1
    assert chk.verdict == "found"
    assert check_lockin(_model().named_parameters()).verdict == "healthy"


def test_wrapper_prefixes_are_stripped():
    model = _model()
    wrapped = [(f"module._orig_mod.{n}", p) for n, p in model.named_parameters()]
    chk = check_lockin(wrapped)
    assert {t.param.role for t in chk.scan.tensors} >= {"embedding", "lm_head", "matrix", "gain"}
    assert all(t.name.startswith(("layers.", "embed", "norm", "lm_head"))
               for t in chk.scan.tensors)


def _backward(model):
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    out = model(ids)
    torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 512),
                                      ids[:, 1:].reshape(-1)).backward()


def test_grad_norms_per_layer_against_naive_sum():
    model = _model()
    _backward(model)
    norms = grad_norms(model.named_parameters())
    assert set(norms) == {"embed", "head", "other", "layer_0", "layer_1", "layer_2", "layer_3"}
    want = math.sqrt(sum(float(p.grad.double().square().sum())
                         for n, p in model.named_parameters() if n.startswith("layers.2.")))
    assert norms["layer_2"] == pytest.approx(want, rel=1e-9)
    hists = grad_histograms(model.named_parameters())
    n2 = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers.2."))
    assert len(hists["layer_2"]) == HIST_HIGH - HIST_LOW + 1 and sum(hists["layer_2"]) == n2


class FakeControl:
    """The trainer's StepControl, duck-typed (inspect never imports astrai.train)."""

    def __init__(self):
        self.added = {}

    def add_metric(self, name, value):
        self.added[name] = value


def test_guard_lifecycle_with_fake_context():
    cfg = tiny_config()
    model = _model()
    logger = FakeLogger()
    sink = []
    ctx = SimpleNamespace(model=model, step=0, logger=logger)
    guard = LockInGuard(GuardConfig(every=2, grad_steps=2, histograms=True), log_fn=sink.append)
    guard.on_train_begin(ctx)
    assert sink[-1]["step"] == 0 and sink[-1]["lockin/locked"] == 0
    assert logger.warnings == []
    for step in range(1, 6):
        control = FakeControl()
        _backward(model)
        guard.on_optimizer_step(ctx, control)
        if step <= 2:
            assert "grad_norm/layer_0" in control.added
            assert len(control.added["grad_hist/layer_0"]) == HIST_HIGH - HIST_LOW + 1
        else:
            assert not any(k.startswith("grad_") for k in control.added)
        model.zero_grad()
        if step == 3:  # lock-in appears after step 3's update
            with torch.no_grad():
                plant_lockin(dict(model.named_parameters()), cfg)
        ctx.step = step
        guard.on_step_end(ctx, SimpleNamespace(step=step, lr=3e-4), control)
        if step % 2 == 0:
            assert control.added["lockin/locked"] == (0 if step < 3 else 3 * 128 + 240 + 64)
            assert "dead_zone" in {k.split("/")[1] for k in control.added}  # the lr was seen
        else:
            assert "lockin/locked" not in control.added
    assert len(logger.warnings) == 1 and "step 4" in logger.warnings[0]
    assert "k_proj" in logger.warnings[0]
    guard.on_train_end(ctx)  # step 5 not checked yet: checks at the end
    assert sink[-1]["step"] == 5 and "lockin/locked" in sink[-1]
    assert len(logger.warnings) == 1  # nothing grew since step 4: no new warning
    steps = [r["step"] for r in guard.records if "lockin/locked" in r]
    assert steps == [0, 2, 4, 5]
    assert guard.state_dict() == {"locked": 3 * 128 + 240 + 64, "bad": 160 + 3, "warned": [],
                                  "past_warmup": False}
    resumed = LockInGuard()
    resumed.load_state_dict({**guard.state_dict(), "past_warmup": True})
    assert resumed.state_dict()["past_warmup"] is True  # a resume past warmup stays past it


def test_guard_works_with_trainer_style_state_and_python_logging(caplog):
    model = _model()
    with torch.no_grad():
        model.layers[0].attn.k_proj.weight[3] = 1.0
    ctx = SimpleNamespace(model=model, state=SimpleNamespace(step=10))
    guard = LockInGuard(GuardConfig(every=5))
    with caplog.at_level(logging.WARNING, logger="astrai.inspect.guard"):
        guard.on_step_end(ctx)
    assert guard.records[-1]["step"] == 10 and guard.records[-1]["lockin/locked"] == 64
    assert "dead_zone" not in str(guard.records[-1])  # no lr known
    assert "64 locked" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_check_lockin_on_cuda_matches_cpu():
    cfg = tiny_config()
    model = _model()
    with torch.no_grad():
        plant_lockin(dict(model.named_parameters()), cfg)
    cpu = check_lockin(model.named_parameters(), lr=1e-4)
    gpu = check_lockin(model.cuda().named_parameters(), lr=1e-4)
    assert gpu.counts() == cpu.counts()
    assert [p.describe() for p in gpu.scan.patterns] == [p.describe() for p in cpu.scan.patterns]
