"""GRPO against naive per-token loops: advantages, ratio, clipping, the KL estimator,
masking, the policy-gradient limit, and old_model syncing."""

import math

import pytest
import torch

from astrai.train.strategies import STRATEGIES
from astrai.train.strategies.grpo import GRPOStrategy, group_advantages, grpo_token_loss
from astrai.train.strategies.logprobs import join_prompt_response

from .align_util import PAD, group_batch, perturbed, tiny_model


def test_advantages_are_normalised_within_each_group():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 5.0, -3.0]])
    a = group_advantages(r)
    torch.testing.assert_close(a.mean(1), torch.zeros(3), atol=1e-6, rtol=0)
    assert torch.all(a[1] == 0)  # equal rewards: nothing to prefer
    for g in (0, 2):
        mu = sum(r[g].tolist()) / 4
        sd = math.sqrt(sum((x - mu) ** 2 for x in r[g].tolist()) / 3)  # sample std, as TRL
        want = torch.tensor([(x - mu) / (sd + 1e-4) for x in r[g].tolist()])
        torch.testing.assert_close(a[g], want)
    assert a[0].std().item() == pytest.approx(1.0, abs=1e-3)


def naive_token_loss(logp, old, ref, adv, mask, eps, coef):
    """The seeds' formula, one token at a time, as a mean over valid tokens."""
    total, n, clipped, kls, ratios = 0.0, 0, 0, 0.0, 0.0
    for i in range(len(logp)):
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            rho = math.exp(logp[i][t] - old[i][t])
            A = adv[i]
            obj = min(rho * A, min(max(rho, 1 - eps), 1 + eps) * A)
            q = math.exp(ref[i][t] - logp[i][t])  # pi_ref / pi
            kl = q - math.log(q) - 1
            total += -obj + coef * kl
            clipped += (rho > 1 + eps and A > 0) or (rho < 1 - eps and A < 0)
            kls += kl
            ratios += rho
            n += 1
    return total / n, clipped / n, kls / n, ratios / n


def test_token_loss_matches_naive_loop():
    g = torch.Generator().manual_seed(0)
    N, T = 6, 7
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3  # some clip
    ref = logp + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    mask = torch.rand(N, T, generator=g) < 0.7
    loss, stats = grpo_token_loss(logp, old, ref, adv, 0.2, 0.01)
    m = mask.double()
    n = m.sum()
    want, clip_frac, kl, ratio = naive_token_loss(logp.tolist(), old.tolist(), ref.tolist(),
                                                  adv.tolist(), mask.tolist(), 0.2, 0.01)
    assert float((loss * m).sum() / n) == pytest.approx(want, rel=1e-10)
    assert float((stats["clipped"] * m).sum() / n) == pytest.approx(clip_frac)
    assert 0 < clip_frac < 1
    assert float((stats["kl"] * m).sum() / n) == pytest.approx(kl, rel=1e-10)
    assert float((stats["ratio"] * m).sum() / n) == pytest.approx(ratio, rel=1e-10)


@pytest.mark.parametrize("A", [1.0, -1.0])
def test_clipping_engages_exactly_beyond_one_plus_minus_eps(A):
    eps, d = 0.2, 1e-3
    # ratios just inside and just outside the trust region, on the side where clipping acts
    edge = 1 + eps if A > 0 else 1 - eps
    inside = edge - d if A > 0 else edge + d
    outside = edge + d if A > 0 else edge - d
    for rho, clips in ((inside, False), (outside, True)):
        logp = torch.tensor([[math.log(rho)]], dtype=torch.float64, requires_grad=True)
        old = torch.zeros(1, 1, dtype=torch.float64)
        loss, stats = grpo_token_loss(logp, old, None, torch.tensor([A]), eps, 0.0)
        loss.sum().backward()
        assert bool(stats["clipped"].item()) is clips
        # d(-rho A)/d logp = -rho A inside; the clipped objective has no gradient
        want = 0.0 if clips else -rho * A
        assert logp.grad.item() == pytest.approx(want, abs=1e-12)
    # on the other side the ratio is never clipped: the gradient keeps pushing back
    far = 1 - 2 * eps if A > 0 else 1 + 2 * eps
    logp = torch.tensor([[math.log(far)]], dtype=torch.float64, requires_grad=True)
    loss, stats = grpo_token_loss(logp, torch.zeros(1, 1, dtype=torch.float64), None,
                                  torch.tensor([A]), eps, 0.0)
    loss.sum().backward()
    assert stats["clipped"].item() == 0 and logp.grad.item() == pytest.approx(-far * A)


def naive_strategy_loss(policy, ref, batch, eps, coef, old=None):
    """Each (prompt, response) unpadded and run alone; per-token loop over its response."""
    B, G, _R = batch["responses"].shape
    adv = group_advantages(batch["rewards"])
    logps, olds, refs, advs, masks = [], [], [], [], []
    for b in range(B):
        prompt = batch["prompts"][b][batch["prompt_mask"][b].bool()]
        for g in range(G):
            resp = batch["responses"][b, g][batch["masks"][b, g].bool()]
            ids = torch.cat([prompt, resp])[None]
            lp = torch.log_softmax(policy(ids).logits[0].double(), -1)
            rp = torch.log_softmax(ref(ids).logits[0].double(), -1)
            op = torch.log_softmax((old or policy)(ids).logits[0].double(), -1)
            P = len(prompt)
            for t in range(P, ids.shape[1]):
                tok = ids[0, t]
                logps.append(float(lp[t - 1, tok]))
                refs.append(float(rp[t - 1, tok]))
                olds.append(float(op[t - 1, tok]))
                advs.append(float(adv[b, g]))
                masks.append(True)
    # one "sequence" per token: the naive loop is then the plain formula
    want, _, kl, _ = naive_token_loss([[x] for x in logps], [[x] for x in olds],
                                      [[x] for x in refs], advs, [[m] for m in masks], eps, coef)
    return want, kl, len(logps)


def test_strategy_loss_matches_naive_per_sequence_loop():
    policy = tiny_model()
    ref = perturbed(policy)
    batch = group_batch()
    strat = STRATEGIES.get("grpo")(policy, reference=ref, clip_eps=0.2, kl_coef=0.05,
                                   pad_id=PAD)
    out = strat(batch)
    with torch.no_grad():
        want, kl, n = naive_strategy_loss(policy, ref, batch, 0.2, 0.05)
    assert strat.loss_units(batch) == n == int(batch["masks"].sum())
    assert out["loss"].item() == pytest.approx(want, rel=1e-4, abs=1e-6)
    m = out["metrics"]
    assert m["kl"] == pytest.approx(kl, rel=1e-4)
    assert m["grpo_ratio_mean"] == 1.0 and m["clip_ratio/region_mean"] == 0.0
    assert m["reward"] == pytest.approx(batch["rewards"].mean().item())
    assert m["reward_std"] == pytest.approx(batch["rewards"].std().item())  # Bessel, as TRL


def test_ratio_one_without_kl_is_advantage_weighted_likelihood():
    policy = tiny_model()
    batch = group_batch(seed=4)
    strat = GRPOStrategy(policy, kl_coef=0.0, pad_id=PAD)
    assert strat._reference is None  # no KL: no reference model is built
    strat(batch)["loss"].backward()
    got = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad()
    # -(1/n) sum_i A_i sum_t log pi(y_it) over valid response tokens
    B, G, _R = batch["responses"].shape
    adv = group_advantages(batch["rewards"])
    total, n = 0.0, 0
    for b in range(B):
        prompt = batch["prompts"][b][batch["prompt_mask"][b].bool()]
        for g in range(G):
            resp = batch["responses"][b, g][batch["masks"][b, g].bool()]
            ids = torch.cat([prompt, resp])[None]
            lp = torch.log_softmax(policy(ids).logits[0], -1)
            for t in range(len(prompt), ids.shape[1]):
                total = total + adv[b, g] * lp[t - 1, ids[0, t]]
                n += 1
    (-total / n).backward()
    for name, p in policy.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)


def test_join_prompt_response_layout():
    prompts = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 4]])
    pmask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    resp = torch.tensor([[11, 12, 0], [13, 0, 0]])
    rmask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ids, mask = join_prompt_response(prompts, pmask, resp, rmask, pad_id=0)
    assert ids.tolist() == [[5, 6, 11, 12, 0, 0, 0], [7, 8, 9, 4, 13, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0]]


def test_old_model_is_the_behaviour_policy_until_synced():
    policy = tiny_model()
    batch = group_batch(seed=2)
    strat = GRPOStrategy(policy, kl_coef=0.0, sync_interval=2, pad_id=PAD)
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)

    def step():
        out = strat(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        strat.on_optimizer_step()
        return out["metrics"]

    assert step()["grpo_ratio_mean"] == 1.0  # old_model == policy at the start
    m = strat(batch)["metrics"]  # one update later, old_model is the initial policy
    assert m["grpo_ratio_mean"] != pytest.approx(1.0, abs=1e-4)
    # the state carries old_model: a rebuilt strategy computes the same ratio
    state = strat.state_dict()
    again = GRPOStrategy(policy, kl_coef=0.0, sync_interval=2, pad_id=PAD)
    again.load_state_dict(state)
    assert again(batch)["metrics"]["grpo_ratio_mean"] == pytest.approx(m["grpo_ratio_mean"])
    step()  # second step: sync
    assert strat(batch)["metrics"]["grpo_ratio_mean"] == 1.0
