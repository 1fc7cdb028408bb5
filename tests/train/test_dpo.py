"""DPO against hand computations: per-token loops, the ipo / hinge formulas, log 2 at
policy == reference, precomputed == live reference, learning direction."""

import math

import pytest
import torch
import torch.nn.functional as F

from astrai.errors import ConfigError, DataError
from astrai.train.strategies import STRATEGIES
from astrai.train.strategies.dpo import DPOStrategy, dpo_losses

from .align_util import collate_pairs, perturbed, preference_samples, tiny_model


def seq_logprob_loop(model, ids, mask):
    """sum_t mask[t] * log p(ids[t] | ids[:t]), one unpadded sequence at a time."""
    n = int(mask.nonzero().max()) + 1 if mask.any() else 1
    ids, mask = ids[:n], mask[:n]
    logits = model(ids[None]).logits[0].double()
    total = 0.0
    for t in range(1, n):
        if mask[t]:
            total += torch.log_softmax(logits[t - 1], -1)[ids[t]]
    return total


def hand_dpo(policy, ref, batch, beta):
    losses, cr, rr = [], [], []
    for b in range(batch["chosen"].shape[0]):
        pc = seq_logprob_loop(policy, batch["chosen"][b], batch["chosen_mask"][b])
        pr = seq_logprob_loop(policy, batch["rejected"][b], batch["rejected_mask"][b])
        qc = seq_logprob_loop(ref, batch["chosen"][b], batch["chosen_mask"][b])
        qr = seq_logprob_loop(ref, batch["rejected"][b], batch["rejected_mask"][b])
        h = (pc - qc) - (pr - qr)
        losses.append(-math.log(1 / (1 + math.exp(-beta * float(h)))))
        cr.append(beta * float(pc - qc))
        rr.append(beta * float(pr - qr))
    return losses, cr, rr


def test_dpo_loss_and_metrics_match_hand_loop():
    policy, beta = tiny_model(), 0.1
    ref = perturbed(policy)
    batch = collate_pairs(preference_samples(5))
    strat = STRATEGIES.get("dpo")(policy, beta=beta, reference=ref)
    out = strat(batch)
    with torch.no_grad():
        losses, cr, rr = hand_dpo(policy, ref, batch, beta)
    assert strat.loss_units(batch) == 5
    assert out["loss"].item() == pytest.approx(sum(losses) / 5, rel=1e-5, abs=1e-6)
    m = out["metrics"]
    assert m["rewards/chosen"] == pytest.approx(sum(cr) / 5, abs=1e-6)
    assert m["rewards/rejected"] == pytest.approx(sum(rr) / 5, abs=1e-6)
    assert m["rewards/margins"] == pytest.approx((sum(cr) - sum(rr)) / 5, abs=1e-6)
    assert m["rewards/accuracies"] == pytest.approx(sum(c > r for c, r in zip(cr, rr)) / 5)
    # the normaliser of a larger accumulation window scales the loss, not the metrics
    half = strat(batch, normalizer=10)
    assert half["loss"].item() == pytest.approx(out["loss"].item() / 2, rel=1e-5)


def test_policy_equal_to_reference_gives_log2_per_pair():
    policy = tiny_model()
    batch = collate_pairs(preference_samples(4, seed=3))
    out = DPOStrategy(policy)(batch)  # no reference: a frozen copy of the initial policy
    assert out["loss"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert out["metrics"]["rewards/margins"] == 0.0


def test_ipo_and_hinge_formulas():
    pc, pr = torch.tensor([-3.0, -1.0, -2.0]), torch.tensor([-4.0, -0.5, -2.0])
    qc, qr = torch.tensor([-3.5, -1.2, -1.0]), torch.tensor([-3.0, -0.7, -2.5])
    h = (pc - qc) - (pr - qr)
    for beta in (0.1, 0.5):
        ipo, c, r = dpo_losses(pc, pr, qc, qr, beta, "ipo")
        torch.testing.assert_close(ipo, (h - 1 / (2 * beta)) ** 2)
        hinge, _, _ = dpo_losses(pc, pr, qc, qr, beta, "hinge")
        torch.testing.assert_close(hinge, torch.clamp(1 - beta * h, min=0))
        sig, _, _ = dpo_losses(pc, pr, qc, qr, beta, "sigmoid")
        torch.testing.assert_close(sig, -F.logsigmoid(beta * h))
        torch.testing.assert_close(c - r, beta * h)
    # hinge is flat once the margin exceeds 1/beta
    assert dpo_losses(torch.tensor([0.0]), torch.tensor([-30.0]), torch.tensor([0.0]),
                      torch.tensor([0.0]), 0.1, "hinge")[0].item() == 0.0
    with pytest.raises(ConfigError, match="dpo_loss"):
        DPOStrategy(tiny_model(), loss_type="kto")


def test_mean_reduction_divides_by_response_length():
    policy = tiny_model()
    ref = perturbed(policy)
    batch = collate_pairs(preference_samples(3, seed=5))
    s_sum = DPOStrategy(policy, reference=ref, loss_type="ipo", reduction="sum")
    s_mean = DPOStrategy(policy, reference=ref, loss_type="ipo", reduction="mean")
    s_default = DPOStrategy(policy, reference=ref, loss_type="ipo")  # mean, as TRL
    with torch.no_grad():
        pc = [seq_logprob_loop(policy, batch["chosen"][b], batch["chosen_mask"][b])
              for b in range(3)]
        qc = [seq_logprob_loop(ref, batch["chosen"][b], batch["chosen_mask"][b]) for b in range(3)]
        pr = [seq_logprob_loop(policy, batch["rejected"][b], batch["rejected_mask"][b])
              for b in range(3)]
        qr = [seq_logprob_loop(ref, batch["rejected"][b], batch["rejected_mask"][b])
              for b in range(3)]
    Lc = batch["chosen_mask"].sum(1)
    Lr = batch["rejected_mask"].sum(1)
    h = torch.tensor([float((pc[b] - qc[b]) / Lc[b] - (pr[b] - qr[b]) / Lr[b]) for b in range(3)])
    want = ((h - 5.0) ** 2).mean()
    assert s_mean(batch)["loss"].item() == pytest.approx(float(want), rel=1e-5)
    assert s_default(batch)["loss"].item() == s_mean(batch)["loss"].item()
    assert s_sum(batch)["loss"].item() != pytest.approx(float(want), rel=1e-3)


def floats(metrics):
    """Metrics as plain floats (the strategy keeps them as 0-d tensors until logging)."""
    return {k: float(v) for k, v in metrics.items()}


def test_precomputed_reference_equals_live_reference():
    policy = tiny_model()
    ref = perturbed(policy, seed=7)
    samples = preference_samples(10, seed=1)
    data = ([samples[:7], samples[7:]], collate_pairs, 4)
    live = DPOStrategy(policy, reference=ref, loss_type="sigmoid")
    pre = DPOStrategy(policy, reference_fn=lambda: perturbed(policy, seed=7),
                      precompute_ref=True, precompute_data=data)
    for chunk in (samples[:4], samples[4:7], samples[7:]):
        batch = collate_pairs(chunk)
        a, b = live(batch), pre(batch)
        torch.testing.assert_close(a["loss"], b["loss"], rtol=1e-6, atol=1e-6)
        assert floats(a["metrics"]) == pytest.approx(floats(b["metrics"]), rel=1e-5, abs=1e-7)
    assert pre._reference is None and len(pre.table) == 10  # the reference was freed
    # resume: the table comes back from the strategy state, no reference needed
    state = pre.state_dict()
    again = DPOStrategy(policy, reference_fn=lambda: pytest.fail("rebuilt the reference"),
                        precompute_ref=True, precompute_data=data)
    again.load_state_dict(state)
    torch.testing.assert_close(again(collate_pairs(samples[:4]))["loss"],
                               live(collate_pairs(samples[:4]))["loss"], rtol=1e-6, atol=1e-6)
    # padding to a longer length does not change a pair's key
    padded = collate_pairs(samples[:2])
    padded = {k: F.pad(v, (0, 3)) for k, v in padded.items()}
    torch.testing.assert_close(pre(padded)["loss"], live(padded)["loss"], rtol=1e-6, atol=1e-6)
    with pytest.raises(DataError, match="precompute_ref"):
        pre(collate_pairs(preference_samples(1, seed=99)))


def test_dpo_steps_raise_the_margin():
    policy = tiny_model()
    batch = collate_pairs(preference_samples(6, seed=2))
    strat = DPOStrategy(policy, beta=0.5)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    first = strat(batch)["metrics"]
    for _ in range(8):
        out = strat(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    last = strat(batch)["metrics"]
    assert last["rewards/margins"] > first["rewards/margins"] + 0.2
    assert last["rewards/accuracies"] == 1.0 and last["dpo_loss"] < first["dpo_loss"]
    # the reference stayed frozen: rejected rewards fell below zero, chosen rose above
    assert last["rewards/chosen"] > 0 > last["rewards/rejected"]
