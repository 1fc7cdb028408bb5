"""Muon + AdamW (astrai.train.muon): each side against torch's own optimizer, the grouping,
state round trips, fp32 momentum with bf16 weights, the schedule, and the refusals."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from astrai.config.train import TrainConfig
from astrai.errors import ConfigError
from astrai.model import build_model, get_preset
from astrai.train.muon import MuonAdamW, adjusted_lr, newton_schulz
from astrai.train.param_groups import is_hidden_matrix
from astrai.train.optim import build_optimizer, describe_groups
from astrai.train.schedule import SCHEDULERS

from .conftest import TINY, VOCAB, make_config

SHAPES = [(12, 8), (8, 12), (10, 10)]  # tall, wide, square


def _grads(params, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=g) for p in params] for _ in range(steps)]


def _run(opt, params, grads):
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.to(p.dtype)
        opt.step()


@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
def test_muon_side_equals_torch_muon(adjust):
    torch.manual_seed(0)
    init = [torch.randn(s) for s in SHAPES]
    grads = _grads(init, 4)
    ours, theirs = [p.clone() for p in init], [p.clone() for p in init]
    lr = 3e-3 if adjust == "match_rms_adamw" else 2e-2
    ref = torch.optim.Muon(theirs, lr=lr, weight_decay=0.1, momentum=0.9,
                           adjust_lr_fn=adjust)
    opt = MuonAdamW([{"params": ours, "muon": True}], lr=lr, weight_decay=0.1, momentum=0.9,
                    adjust_lr=adjust)
    _run(ref, theirs, grads)
    _run(opt, ours, grads)
    for a, b, p0 in zip(ours, theirs, init):
        assert (a - p0).abs().max() > 1e-3  # the steps moved the weights
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(opt.state[a]["momentum_buffer"],
                                   ref.state[b]["momentum_buffer"])


def test_adamw_side_equals_torch_adamw():
    torch.manual_seed(1)
    init = [torch.randn(16, 6), torch.randn(6)]  # an embedding-like matrix and a gain
    grads = _grads(init, 5, seed=1)
    ours, theirs = [p.clone() for p in init], [p.clone() for p in init]

    def groups(ps):
        return [{"params": ps[:1], "weight_decay": 0.1}, {"params": ps[1:], "weight_decay": 0.0}]

    ref = torch.optim.AdamW(groups(theirs), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    opt = MuonAdamW(groups(ours), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    _run(ref, theirs, grads)
    _run(opt, ours, grads)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[a][k], ref.state[b][k])


def test_newton_schulz_orthogonalises_and_lr_scales():
    g = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    o = newton_schulz(g).float()
    s = torch.linalg.svdvals(o)
    assert o.shape == (32, 8) and s.min() > 0.5 and s.max() < 1.5  # Jordan 2024: ~[0.7, 1.2]
    assert adjusted_lr(1.0, (32, 8), "original") == 2.0
    assert adjusted_lr(1.0, (8, 32), "original") == 1.0
    assert adjusted_lr(1.0, (8, 32), "match_rms_adamw") == pytest.approx(0.2 * math.sqrt(32))
    with pytest.raises(ValueError, match="muon_adjust_lr"):
        adjusted_lr(1.0, (2, 2), "spectral")
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([{"params": [torch.zeros(3, requires_grad=True)], "muon": True}])


def _names(model, opt):
    names = {id(p): n for n, p in model.named_parameters()}
    return {g.get("name"): {names[id(p)] for p in g["params"]} for g in opt.param_groups}


@pytest.mark.parametrize("tied", [False, True])
def test_hidden_matrices_to_muon_the_rest_to_adamw(tied):
    cfg = get_preset("tiny", vocab_size=VOCAB, **{**TINY, "qkv_bias": True, "qk_norm": True,
                                                   "tie_embeddings": tied, "n_experts": 2,
                                                   "moe_layers": [1], "n_shared_experts": 1})
    model = build_model(cfg, seed=0)
    opt = build_optimizer(model, TrainConfig(optimizer="muon"))
    groups = _names(model, opt)
    muon = groups["muon"]
    adamw = groups.get("adamw", set()) | groups["adamw-no-decay"]
    assert "layers.0.attn.q_proj.weight" in muon and "layers.0.attn.o_proj.weight" in muon
    assert "layers.0.mlp.down_proj.weight" in muon
    assert "layers.1.mlp.experts.1.up_proj.weight" in muon
    assert "layers.1.mlp.shared.0.gate_proj.weight" in muon
    assert {"embed_tokens.weight", "norm.weight", "layers.0.attn_norm.weight",
            "layers.0.attn.q_proj.bias", "layers.1.mlp.router.weight",
            "layers.1.attn.q_norm.weight", "layers.1.attn.k_norm.weight"} <= adamw
    assert ("lm_head.weight" in adamw) == (not tied)
    assert not muon & adamw
    assert len(muon) + len(adamw) == len(list(model.parameters()))
    assert all(is_hidden_matrix(n, p) == (n in muon) for n, p in model.named_parameters())
    rows = {r["name"]: r for r in describe_groups(opt)}
    assert rows["muon"]["optimizer"] == "muon" and rows["muon"]["tensors"] == len(muon)
    assert rows["muon"]["adjust_lr"] == "match_rms_adamw"


def test_reward_head_goes_to_adamw():
    from astrai.train.strategies.reward import RewardStrategy

    model = RewardStrategy.prepare_model(
        build_model(get_preset("tiny", vocab_size=VOCAB, **TINY), seed=0), None)
    groups = _names(model, build_optimizer(model, TrainConfig(optimizer="muon")))
    assert "score_head.weight" in groups["adamw"] and "score_head.bias" in groups["adamw-no-decay"]
    assert not any("score_head" in n for n in groups["muon"])


def test_schedule_scales_both_lrs_and_muon_lr_defaults():
    model = build_model(get_preset("tiny", vocab_size=VOCAB, **TINY), seed=0)
    cfg = TrainConfig(optimizer="muon", max_lr=1e-3, muon_lr=0.05)
    opt = build_optimizer(model, cfg)
    sched = SCHEDULERS.get("cosine")(opt, total_steps=10, warmup_steps=4, min_rate=0.1)
    for _ in range(2):
        sched.step()
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["muon"] == pytest.approx(0.05 * 3 / 4) and lrs["adamw"] == pytest.approx(7.5e-4)
    assert sched.get_last_lr()[0] == lrs["adamw"]  # the logged lr stays AdamW's
    assert TrainConfig(optimizer="muon", max_lr=1e-3).optimizer.muon_lr_value == 1e-3
    assert TrainConfig(optimizer="muon", muon_adjust_lr="original").optimizer.muon_lr_value == 0.02


def test_state_dict_round_trip_continues_exactly():
    model = build_model(get_preset("tiny", vocab_size=VOCAB, **TINY), seed=0)
    params = list(model.parameters())
    grads = _grads(params, 5, seed=2)
    cfg = TrainConfig(optimizer="muon")
    straight = copy.deepcopy(model)
    opt = build_optimizer(straight, cfg)
    _run(opt, list(straight.parameters()), grads)
    opt = build_optimizer(model, cfg)
    _run(opt, params, grads[:3])
    saved = copy.deepcopy(opt.state_dict())
    assert {g["name"]: g["muon"] for g in saved["param_groups"]}["muon"] is True
    resumed = build_optimizer(model, cfg)
    resumed.load_state_dict(saved)
    _run(resumed, params, grads[3:])
    for a, b in zip(params, straight.parameters()):
        assert torch.equal(a, b)


def test_bf16_weights_keep_an_fp32_momentum_through_resume():
    """With bf16 weights the momentum buffer stays fp32 (torch.optim.Muon keeps it bf16) and
    follows the exact recurrence of the gradients it saw; a state_dict round trip (resume)
    keeps it fp32 instead of torch's cast to the parameter dtype."""
    torch.manual_seed(0)
    w = torch.randn(8, 6).bfloat16()
    grads = [[1.0 + 0.01 * torch.randn(8, 6)] for _ in range(40)]
    ours, theirs = [w.clone()], [w.clone()]
    opt = MuonAdamW([{"params": ours, "muon": True}], lr=1e-6, momentum=0.9,
                    state_dtype=torch.float32)
    ref = torch.optim.Muon(theirs, lr=1e-6, momentum=0.9)
    _run(opt, ours, grads)
    _run(ref, theirs, grads)
    exact = torch.zeros(8, 6, dtype=torch.float64)
    for (g,) in grads:
        exact.lerp_(g.bfloat16().double(), 0.1)
    buf = opt.state[ours[0]]["momentum_buffer"]
    assert buf.dtype == torch.float32 and ours[0].dtype == torch.bfloat16
    err = float(((buf.double() - exact).abs() / exact).max())
    err_torch = float(((ref.state[theirs[0]]["momentum_buffer"].double() - exact).abs()
                       / exact).max())
    assert err < 1e-6 and err_torch > 1e-4, (err, err_torch)
    again = MuonAdamW([{"params": ours, "muon": True}], lr=1e-6, momentum=0.9)
    again.load_state_dict(opt.state_dict())
    assert torch.equal(again.state[ours[0]]["momentum_buffer"], buf)


@pytest.mark.parametrize("kw,needle", [
    ({"optimizer": "muon", "lora_rank": 4}, "use --optimizer adamw with LoRA"),
    ({"optimizer": "muon", "parallel": "fsdp"}, "use --parallel ddp"),
    ({"muon_lr": 0.02}, "muon_lr: Muon options need --optimizer muon"),
    ({"muon_adjust_lr": "original"}, "muon_adjust_lr: Muon options need --optimizer muon"),
])
def test_refusals_name_the_field_and_the_fix(kw, needle, tmp_path):
    from astrai.config.train import load_train_config

    base = make_config(tmp_path).model_dump()
    with pytest.raises(ConfigError, match=needle):
        load_train_config(None, {**base, **kw})


def test_bf16_true_run_with_muon_keeps_fp32_state(tmp_path):
    """A few bf16-true steps on tiny shapes: finite, bf16 weights, fp32 Muon momentum and
    fp32 AdamW moments in the checkpoint."""
    from safetensors.torch import load_file

    from astrai.train import train

    from .conftest import make_data

    cfg = make_config(tmp_path, precision="bf16-true", optimizer="muon", max_steps=3,
                      batch_size=2)
    s = train(cfg, data=make_data("pretrain", n=8, T=8))
    assert s.steps == 3 and math.isfinite(s.final_loss)
    ckpt = tmp_path / "run" / "checkpoints" / "step_3"
    assert {v.dtype for v in load_file(ckpt / "model.safetensors").values()} == {torch.bfloat16}
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)["state"].values()
    dtypes = {k: v.dtype for s in state for k, v in s.items() if k != "step"}
    assert dtypes == {"momentum_buffer": torch.float32, "exp_avg": torch.float32,
                      "exp_avg_sq": torch.float32}
