"""GRPO and DPO against TRL's definitions.

GRPO's loss aggregation runs TRL's own `GRPOTrainer._compute_loss` (on a stand-in `self`
that hands it our token log-probs) beside ours, for every loss_type, over an accumulation
window whose micro-batches hold different numbers of tokens; the advantages use TRL's
`nanstd` in the few lines of TRL's `_generate_and_score_completions` that form them. TRL's
DPO loss lives inside a trainer method that needs a full model forward, so the IPO and
label-smoothed sigmoid checks use its formulas as written in TRL's `dpo_trainer.py`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import trl.trainer.grpo_trainer as trl_grpo
from trl.trainer.utils import nanstd

from astrai.config.train import TrainConfig
from astrai.errors import ConfigError
from astrai.train.strategies.dpo import DPOStrategy, dpo_losses
from astrai.train.strategies.grpo import (
    GRPOStrategy,
    aggregate_token_loss,
    group_advantages,
    grpo_token_loss,
)

from .align_util import collate_pairs, group_batch, perturbed, preference_samples, tiny_model


def trl_advantages(rewards: torch.Tensor, scale: str) -> torch.Tensor:
    """TRL's `sum_then_normalize` advantages (grpo_trainer.py), for [B, G] rewards."""
    G = rewards.shape[1]
    r = rewards.reshape(-1)
    mean = torch.nanmean(r.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale in ("group", "none"):
        std = nanstd(r.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std = nanstd(r).expand_as(r)
    adv = r - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return adv.view_as(rewards)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trl(scale):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 4, generator=g, dtype=torch.float64)
    rewards[1] = 2.0  # a tied group
    torch.testing.assert_close(group_advantages(rewards, scale).double(),
                               trl_advantages(rewards, scale).float().double())


def test_bessel_corrected_example():
    # rewards [1, 0, 0, 0]: sample std 0.5 -> [1.5, -0.5, -0.5, -0.5] (population: 1.732)
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(a, torch.tensor([[1.5, -0.5, -0.5, -0.5]]), atol=1e-3, rtol=0)


class _Accelerator:
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(loss_type, micro_batches, *, accum, max_len, beta, eps):
    """Sum over the window of TRL's per-micro-batch loss (each already divided for
    gradient accumulation), with TRL's own _compute_loss."""
    total_tokens = sum(float(mb["mask"].sum()) for mb in micro_batches)
    out = 0.0
    for mb in micro_batches:
        logp = mb["logp"]
        stub = SimpleNamespace(
            top_entropy_quantile=1.0, off_policy_mask_threshold=None,
            importance_sampling_level="token", beta=beta, loss_type=loss_type,
            epsilon_low=eps, epsilon_high=eps, use_vllm=False,
            args=SimpleNamespace(delta=None, use_bias_correction_kl=False,
                                 steps_per_generation=accum),
            model=SimpleNamespace(training=True), current_gradient_accumulation_steps=accum,
            max_completion_length=max_len, accelerator=_Accelerator(),
            _entropy_bonus_enabled=False, aux_loss_enabled=False,
            _metrics=defaultdict(lambda: defaultdict(list)),
            _get_per_token_logps_and_entropies=lambda *a, lp=logp, **k: (
                lp, torch.zeros_like(lp), None),
        )
        N, T = logp.shape
        inputs = {"prompt_ids": torch.zeros(N, 1, dtype=torch.long),
                  "prompt_mask": torch.ones(N, 1, dtype=torch.long),
                  "completion_ids": torch.zeros(N, T, dtype=torch.long),
                  "completion_mask": mb["mask"].long(), "advantages": mb["adv"],
                  "old_per_token_logps": mb["old"], "ref_per_token_logps": mb["ref"],
                  "num_items_in_batch": torch.tensor(total_tokens)}
        out = out + trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)
    return out


def micro_batch(g, N, T, keep):
    logp = (-torch.rand(N, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    mask = torch.zeros(N, T, dtype=torch.float64)
    for i, n in enumerate(keep):
        mask[i, :n] = 1
    return {"logp": logp, "old": (logp + torch.randn(N, T, generator=g,
                                                     dtype=torch.float64) * 0.3).detach(),
            "ref": (logp + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.2).detach(),
            "adv": torch.randn(N, generator=g, dtype=torch.float64), "mask": mask}


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_loss_aggregation_equals_trl_compute_loss(loss_type):
    g = torch.Generator().manual_seed(1)
    # two micro-batches of 4 responses with very different token counts
    mbs = [micro_batch(g, 4, 6, [6, 1, 3, 0]), micro_batch(g, 4, 6, [6, 6, 5, 6])]
    beta, eps, max_len = 0.04, 0.2, 6
    want = trl_loss(loss_type, mbs, accum=2, max_len=max_len, beta=beta, eps=eps)
    sums, units = [], 0
    for mb in mbs:
        loss, _ = grpo_token_loss(mb["logp"], mb["old"], mb["ref"], mb["adv"], eps, beta)
        s, u = aggregate_token_loss(loss, mb["mask"], loss_type, max_len)
        sums.append(s)
        units += u
    ours = sum(sums) / units  # the trainer's window normalisation
    torch.testing.assert_close(ours, want)
    g_ours = torch.autograd.grad(ours, [mb["logp"] for mb in mbs], retain_graph=True)
    g_trl = torch.autograd.grad(want, [mb["logp"] for mb in mbs])
    for a, b in zip(g_ours, g_trl):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_strategy_units_agree_with_its_loss(loss_type):
    batch = group_batch(B=2, G=3)
    s = GRPOStrategy(tiny_model(), kl_coef=0.0, loss_type=loss_type, max_completion_length=9)
    total, units, _, _ = s.loss_sum(batch)
    assert units == s.loss_units(batch)
    out = s(batch, normalizer=units)
    torch.testing.assert_close(out["loss"], total / units)


def trl_ipo(chosen_logratio_sum, rejected_logratio_sum, chosen_len, rejected_len, beta):
    """TRL dpo_trainer.py, loss_type "ipo": scores averaged over completion tokens."""
    delta = chosen_logratio_sum / chosen_len - rejected_logratio_sum / rejected_len
    return (delta - 1 / (2 * beta)) ** 2


def test_ipo_defaults_to_mean_log_probs_as_trl():
    policy = tiny_model()
    ref = perturbed(policy)
    batch = collate_pairs(preference_samples(3, seed=5))
    s = DPOStrategy(policy, reference=ref, loss_type="ipo", beta=0.1)
    ids, mask = s._pairs(batch)
    from astrai.train.strategies.logprobs import sequence_logprob, token_logprobs

    with torch.no_grad():
        lp = token_logprobs(policy(ids).logits, ids)
        lq = token_logprobs(ref(ids).logits, ids)
        ratio = sequence_logprob(lp, mask, "sum") - sequence_logprob(lq, mask, "sum")
        lens = mask[:, 1:].sum(1).double()
        B = 3
        want = trl_ipo(ratio[:B].double(), ratio[B:].double(), lens[:B], lens[B:], 0.1)
        got = s.pair_losses(batch)[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    cfg = TrainConfig(strategy="dpo", dpo_loss="ipo")
    assert cfg.alignment.dpo_reduction_value == "mean"
    assert TrainConfig(strategy="dpo").alignment.dpo_reduction_value == "sum"


def test_ipo_example_of_four_against_two_tokens():
    # per-token log-ratios +0.5 on a 4-token chosen response, -0.25 on a 2-token rejected one
    c, r = torch.tensor([2.0]), torch.tensor([-0.5])
    summed = dpo_losses(c, r, torch.zeros(1), torch.zeros(1), 0.1, "ipo")[0]
    mean = dpo_losses(c / 4, r / 2, torch.zeros(1), torch.zeros(1), 0.1, "ipo")[0]
    assert float(summed) == pytest.approx((2.5 - 5) ** 2)
    assert float(mean) == pytest.approx(float(trl_ipo(c, r, 4, 2, 0.1)))


def trl_smoothed_sigmoid(delta, beta, eps):
    """TRL dpo_trainer.py's label-smoothed sigmoid (conservative DPO)."""
    return -F.logsigmoid(beta * delta) * (1 - eps) - F.logsigmoid(-beta * delta) * eps


def test_label_smoothing_is_conservative_dpo():
    g = torch.Generator().manual_seed(2)
    pc, pr, qc, qr = (torch.randn(6, generator=g, dtype=torch.float64) * 3 for _ in range(4))
    for eps in (0.0, 0.1, 0.3):
        got = dpo_losses(pc, pr, qc, qr, 0.5, "sigmoid", eps)[0]
        torch.testing.assert_close(got, trl_smoothed_sigmoid((pc - qc) - (pr - qr), 0.5, eps))
    # the gradient vanishes where P(flip) makes the margin as likely wrong as right
    h = torch.tensor([math.log(0.9 / 0.1) / 0.5], requires_grad=True)
    loss = dpo_losses(h, torch.zeros(1), torch.zeros(1), torch.zeros(1), 0.5, "sigmoid", 0.1)[0]
    (grad,) = torch.autograd.grad(loss.sum(), h)
    assert abs(float(grad)) < 1e-6


@pytest.mark.parametrize("fields,match", [
    ({"strategy": "grpo"}, "strategy 'grpo' has no label smoothing"),
    ({"strategy": "online-grpo"}, "strategy 'online-grpo' has no label smoothing"),
    ({"strategy": "reward"}, "strategy 'reward' has no label smoothing"),
    ({"strategy": "dpo", "dpo_loss": "ipo"}, "the ipo loss has no label smoothing"),
    ({"strategy": "dpo", "label_smoothing": 0.6}, "below 0.5"),
])
def test_label_smoothing_refused_where_it_would_be_ignored(fields, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_dict({"label_smoothing": 0.1, **fields})
    TrainConfig.from_dict({"strategy": "dpo", "label_smoothing": 0.1})
    TrainConfig.from_dict({"strategy": "sft", "label_smoothing": 0.1})


def test_grpo_metrics_are_trls_under_trls_names():
    """reward / reward_std as TRL's _generate_and_score_completions logs them (nanmean and
    its Bessel-corrected nanstd), kl and clip_ratio/region_mean as TRL's own _compute_loss
    logs them on the same token log-probs."""
    g = torch.Generator().manual_seed(3)
    mb = micro_batch(g, 4, 6, [6, 1, 3, 5])
    mb["old"] = (mb["logp"] + torch.randn(4, 6, generator=g, dtype=torch.float64)).detach()
    beta, eps = 0.04, 0.2
    stub_metrics = defaultdict(lambda: defaultdict(list))
    trl_loss_with_metrics("dapo", mb, beta=beta, eps=eps, metrics=stub_metrics)
    trl_m = stub_metrics["train"]
    _, stats = grpo_token_loss(mb["logp"].detach(), mb["old"], mb["ref"], mb["adv"], eps, beta)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.5, 0.5]])
    s = GRPOStrategy(tiny_model(), kl_coef=beta, clip_eps=eps)
    ours = s.metrics({"rewards": rewards}, stats, mb["mask"])
    assert ours["reward"] == pytest.approx(torch.nanmean(rewards.reshape(-1)).item())
    assert ours["reward_std"] == pytest.approx(nanstd(rewards.reshape(-1)).item())
    assert ours["reward_std"] != pytest.approx(rewards.std(unbiased=False).item())
    assert 0 < trl_m["clip_ratio/region_mean"][0] < 1  # the old policy differs: some clip
    assert ours["clip_ratio/region_mean"] == pytest.approx(trl_m["clip_ratio/region_mean"][0])
    assert ours["kl"] == pytest.approx(trl_m["kl"][0])
    assert not {"grpo_reward_mean", "grpo_reward_std", "grpo_kl"} & set(ours)


def trl_loss_with_metrics(loss_type, mb, *, beta, eps, metrics):
    """TRL's _compute_loss on one micro-batch, its logged metrics left in `metrics`."""
    logp = mb["logp"]
    stub = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type=loss_type,
        epsilon_low=eps, epsilon_high=eps, use_vllm=False,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=logp.shape[1], accelerator=_Accelerator(),
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics=metrics,
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )
    N, T = logp.shape
    inputs = {"prompt_ids": torch.zeros(N, 1, dtype=torch.long),
              "prompt_mask": torch.ones(N, 1, dtype=torch.long),
              "completion_ids": torch.zeros(N, T, dtype=torch.long),
              "completion_mask": mb["mask"].long(), "advantages": mb["adv"],
              "old_per_token_logps": mb["old"], "ref_per_token_logps": mb["ref"],
              "num_items_in_batch": mb["mask"].sum()}
    return trl_grpo.GRPOTrainer._compute_loss(stub, None, inputs)


@pytest.mark.parametrize("loss_type, reduction, precompute", [
    ("sigmoid", "sum", False), ("sigmoid", "mean", False), ("ipo", None, False),
    ("ipo", None, True), ("hinge", "mean", True)])
def test_dpo_rewards_are_trls_summed_log_ratios_for_every_loss(loss_type, reduction,
                                                                precompute):
    """TRL dpo_trainer.py: chosen_rewards = beta * (chosen_logps - ref_chosen_logps) with the
    token-summed log-probs, whatever the loss type (ipo normalises only inside its loss);
    rewards/accuracies = mean(chosen_rewards > rejected_rewards)."""
    from astrai.train.strategies.logprobs import sequence_logprob, token_logprobs

    policy, beta = tiny_model(), 0.1
    ref = perturbed(policy)
    batch = collate_pairs(preference_samples(5, seed=7))
    s = DPOStrategy(policy, reference=ref, loss_type=loss_type, reduction=reduction,
                    beta=beta, precompute_ref=precompute,
                    precompute_data=([preference_samples(5, seed=7)], collate_pairs, 5))
    ids, mask = s._pairs(batch)
    with torch.no_grad():
        lp, lq = (token_logprobs(m(ids).logits, ids) for m in (policy, ref))
        ratio = sequence_logprob(lp, mask, "sum") - sequence_logprob(lq, mask, "sum")
        out = s(batch)
    chosen, rejected = beta * ratio[:5], beta * ratio[5:]
    m = out["metrics"]
    assert m["rewards/chosen"] == pytest.approx(chosen.mean().item(), abs=1e-5)
    assert m["rewards/rejected"] == pytest.approx(rejected.mean().item(), abs=1e-5)
    assert m["rewards/margins"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-5)
    assert m["rewards/accuracies"] == pytest.approx((chosen > rejected).float().mean().item())
    assert not any(k.startswith("dpo_") and k != "dpo_loss" for k in m), m
