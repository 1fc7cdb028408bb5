"""MoE: the load-balancing loss on a hand-made routing, routing vs a naive loop, model aux."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from astrai.model.moe import MoE, load_balancing_loss


def test_aux_loss_on_hand_made_routing():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.4, 0.4, 0.2], [0.1, 0.5, 0.4]],
                         dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 2]])
    # f = slots per expert / (N k) = [3, 3, 2] / 8;  P = column means = [0.4, 0.325, 0.275]
    # L = E * sum f P = 3 * (0.375*0.4 + 0.375*0.325 + 0.25*0.275) = 1.021875
    loss = load_balancing_loss(probs, idx, 3)
    assert loss.item() == pytest.approx(1.021875, abs=1e-12)
    loss.backward()  # dL/dprobs[n, i] = E * f_i / N: only P carries gradient
    want = (3 * torch.tensor([3 / 8, 3 / 8, 2 / 8], dtype=torch.float64) / 4).expand(4, 3)
    torch.testing.assert_close(probs.grad, want)


def test_aux_loss_is_one_under_uniform_routing():
    probs = torch.full((6, 3), 1 / 3)
    idx = torch.tensor([[0], [1], [2], [0], [1], [2]])
    assert load_balancing_loss(probs, idx, 3).item() == pytest.approx(1.0)


def test_moe_forward_matches_per_token_loop(make_config):
    torch.manual_seed(0)
    moe = MoE(make_config(n_experts=4, moe_top_k=2, n_shared_experts=1)).eval()
    x = torch.randn(2, 5, 32)
    out, aux = moe(x)
    flat = x.reshape(-1, 32)
    ref = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        p = F.softmax(moe.router(flat[n]), dim=-1)
        w, e = p.topk(2)
        w = w / w.sum()
        for weight, expert in zip(w, e):
            ref[n] += weight * moe.experts[int(expert)](flat[n])
        ref[n] += moe.shared[0](flat[n])
    torch.testing.assert_close(out.reshape(-1, 32), ref, rtol=1e-5, atol=1e-6)
    probs = F.softmax(moe.router(flat), dim=-1)
    torch.testing.assert_close(aux, load_balancing_loss(probs, probs.topk(2).indices, 4))


def test_model_aux_is_the_mean_over_moe_layers_and_trains_the_router(make_config, make_model):
    model = make_model(make_config(n_layers=3, n_experts=4, moe_top_k=1, moe_layers=[0, 2]))
    model.train()
    seen = []
    for block in model.layers:
        if block.is_moe:
            block.mlp.register_forward_hook(lambda m, i, o: seen.append(o[1].detach()))
    out = model(torch.randint(0, 97, (2, 8)))
    assert len(seen) == 2 and not model.layers[1].is_moe
    torch.testing.assert_close(out.aux_loss.detach(), (seen[0] + seen[1]) / 2)
    out.aux_loss.backward()
    assert model.layers[0].mlp.router.weight.grad.abs().sum() > 0
