"""Precision modes: fp32, bf16-mixed, bf16-true;
AdamW moments fp32 unless asked otherwise ("End-to-End Training of a 1.2B Transformer with AstrAI", "Solution").
bf16 is ~100x slower on this CPU, so the bf16 runs use tiny shapes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from safetensors.torch import load_file

from astrai.errors import ConfigError
from astrai.model.checkpoint import load_checkpoint
from astrai.train import train
from astrai.train.adamw import AdamW
from astrai.train.optim import build_adamw
from astrai.train.precision import resolve_precision

from .conftest import make_config, make_data


def test_resolve_precision():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu).name == "fp32"  # auto: fp32 off CUDA
    p = resolve_precision("bf16-true", cpu)
    assert p.param_dtype == torch.bfloat16 and p.state_dtype == torch.float32
    p = resolve_precision("bf16-mixed", cpu, "bf16")
    assert p.param_dtype == torch.float32 and p.state_dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="precision: unknown 'fp8'"):
        resolve_precision("fp8", cpu)
    with pytest.raises(ConfigError, match="optimizer_state_dtype"):
        resolve_precision("fp32", cpu, "fp16")


def _steps(opt, params, grads):
    for g in grads:
        for p, gi in zip(params, g):
            p.grad = gi.to(p.dtype)
        opt.step()


def test_adamw_equals_torch_adamw_in_fp32():
    """Same algorithm as torch.optim.AdamW, op for op: bit-identical in fp32, and the two
    load each other's state dicts."""
    torch.manual_seed(0)
    init = [torch.randn(6, 5), torch.randn(5)]
    grads = [[torch.randn_like(p) for p in init] for _ in range(6)]
    a = [p.clone() for p in init]
    b = [p.clone() for p in init]
    groups = lambda ps: [{"params": ps[:1], "weight_decay": 0.1},
                         {"params": ps[1:], "weight_decay": 0.0}]
    ta = torch.optim.AdamW(groups(a), lr=1e-2, betas=(0.9, 0.95))
    ob = AdamW(groups(b), lr=1e-2, betas=(0.9, 0.95))
    _steps(ta, a, grads)
    _steps(ob, b, grads)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    sa, sb = copy.deepcopy(ta.state_dict()), copy.deepcopy(ob.state_dict())
    ta.load_state_dict(sb)
    ob.load_state_dict(sa)
    _steps(ta, a, grads[:2])
    _steps(ob, b, grads[:2])
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("param_dtype,state,cls,moment", [
    (torch.float32, torch.float32, torch.optim.AdamW, torch.float32),
    (torch.bfloat16, torch.float32, AdamW, torch.float32),   # bf16-true: fp32 moments
    (torch.float32, torch.bfloat16, AdamW, torch.bfloat16),  # --optimizer-state-dtype bf16
    (torch.bfloat16, torch.bfloat16, torch.optim.AdamW, torch.bfloat16),
])
def test_build_adamw_moment_dtype(param_dtype, state, cls, moment):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to(param_dtype)
    opt = build_adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8,
                      state_dtype=state)
    assert type(opt) is cls
    model(torch.randn(2, 4, dtype=param_dtype)).sum().backward()
    opt.step()
    for p in model.parameters():
        assert p.dtype == param_dtype
        assert opt.state[p]["exp_avg"].dtype == moment
        assert opt.state[p]["exp_avg_sq"].dtype == moment


def test_fp32_moments_keep_what_bf16_moments_lose():
    """The paper's point: with bf16 weights, fp32 moments follow the exact (fp64) moment
    recurrence; bf16 moments drift by ~1e-3 relative (7-bit mantissa)."""
    torch.manual_seed(0)
    grads = [1.0 + 0.01 * torch.randn(256, dtype=torch.float64) for _ in range(50)]
    m_ref = torch.zeros(256, dtype=torch.float64)
    for g in grads:
        m_ref = 0.9 * m_ref + 0.1 * g
    err = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        p = torch.zeros(256, dtype=torch.bfloat16, requires_grad=True)
        opt = AdamW([p], lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0, state_dtype=dtype)
        for g in grads:
            p.grad = g.to(torch.bfloat16)
            opt.step()
        g_bf16 = [g.to(torch.bfloat16).double() for g in grads]
        m_exact = torch.zeros(256, dtype=torch.float64)
        for g in g_bf16:  # the recurrence on the gradients the optimizer actually saw
            m_exact = 0.9 * m_exact + 0.1 * g
        err[name] = float(((opt.state[p]["exp_avg"].double() - m_exact).abs() / m_exact).max())
    assert err["fp32"] < 1e-6 and err["bf16"] > 1e-4, err


@pytest.mark.parametrize("precision,state,parallel", [
    ("bf16-true", "fp32", "none"),
    ("bf16-mixed", "fp32", "none"),
    ("bf16-true", "fp32", "fsdp"),
    pytest.param("bf16-true", "bf16", "none", marks=pytest.mark.slow),
])
def test_bf16_training_is_finite_and_keeps_moment_dtype(precision, state, parallel, tmp_path):
    """Reliability (d): a few steps on tiny shapes, finite losses; the checkpoint holds the
    weights in their training dtype and the moments in the asked dtype (fsdp: gathered)."""
    cfg = make_config(tmp_path, precision=precision, optimizer_state_dtype=state,
                      parallel=parallel, max_steps=3, batch_size=2, checkpoint_format="full")
    s = train(cfg, data=make_data("pretrain", n=8, T=8))
    assert s.steps == 3 and math.isfinite(s.final_loss)
    ckpt = tmp_path / "run" / "checkpoints" / "step_3"
    w = load_file(ckpt / "model.safetensors")
    weight_dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    assert {v.dtype for v in w.values()} == {weight_dtype}
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    moment = torch.float32 if state == "fp32" else torch.bfloat16
    assert {s["exp_avg"].dtype for s in opt["state"].values()} == {moment}
    assert {s["exp_avg_sq"].dtype for s in opt["state"].values()} == {moment}


def test_resumed_adamw_keeps_fp32_moments_of_bf16_weights():
    """torch's Optimizer.load_state_dict casts state to the parameter dtype; a resumed
    bf16-true run must get its fp32 moments back exactly, not rounded to bf16."""
    torch.manual_seed(0)
    p = torch.zeros(64, dtype=torch.bfloat16, requires_grad=True)
    opt = AdamW([p], lr=1e-3, betas=(0.9, 0.95), state_dtype=torch.float32)
    for _ in range(3):
        p.grad = (1 + 0.01 * torch.randn(64)).bfloat16()
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    again = AdamW([p], lr=1e-3, betas=(0.9, 0.95), state_dtype=torch.float32)
    again.load_state_dict(saved)
    for k in ("exp_avg", "exp_avg_sq"):
        assert again.state[p][k].dtype == torch.float32
        assert torch.equal(again.state[p][k], opt.state[p][k])


@pytest.mark.parametrize("parallel,optimizer,update", [
    ("none", "adamw", "nearest"), ("none", "muon", "nearest"), ("fsdp", "adamw", "nearest"),
    ("none", "adamw", "stochastic"), ("none", "muon", "kahan"), ("fsdp", "adamw", "stochastic"),
    ("fsdp", "adamw", "kahan"),
])
def test_bf16_true_resume_is_bit_identical(parallel, optimizer, update, tmp_path):
    """A bf16-true run interrupted after step 3 and resumed ends with the weights of the
    straight run: its fp32 optimizer state came back fp32 (fsdp: as fp32 DTensor shards),
    the stochastic-rounding generator its state, the Kahan compensation its bf16 values."""
    from astrai.train import resume

    from .dist_helpers import Interrupt, StopAfterStep

    kw = {"precision": "bf16-true", "parallel": parallel, "optimizer": optimizer,
          "bf16_update": update, "max_steps": 5, "ckpt_interval": 2, "batch_size": 2}
    data = lambda: make_data("pretrain", n=16, T=8)
    train(make_config(tmp_path / "a", **kw), data=data())
    with pytest.raises(Interrupt):
        train(make_config(tmp_path / "b", **kw), data=data(), callbacks=[StopAfterStep(3)])
    assert resume(tmp_path / "b" / "run", data=data()).resumed_from.endswith("step_3")
    # fsdp writes DCP checkpoints (each rank its shards): read both through the one loader
    a, b = (load_checkpoint(tmp_path / x / "run" / "checkpoints" / "step_5")[0].state_dict()
            for x in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
