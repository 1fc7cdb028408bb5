"""seq and sft losses against naive per-token loops; per-document attention; MoE aux loss."""

import math

import pytest
import torch

from astrai.model import ForwardContext, build_model, get_preset
from astrai.train.strategies import STRATEGIES

from .conftest import TINY, VOCAB, collate, pretrain_samples, sft_samples


def model(**kw):
    return build_model(get_preset("tiny", vocab_size=VOCAB, **{**TINY, **kw}), seed=0)


def naive_ce(logits, targets, eps):
    """Per-token loop: (1-eps) * -log p_y + eps * mean_v(-log p_v); -100 skipped."""
    total, n = 0.0, 0
    logp = torch.log_softmax(logits.double(), -1)
    B, T, _V = logits.shape
    for b in range(B):
        for t in range(T):
            y = int(targets[b, t])
            if y == -100:
                continue
            total += (1 - eps) * -logp[b, t, y] + eps * -logp[b, t].mean()
            n += 1
    return total / n, n


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_seq_matches_naive_loop(eps):
    m = model()
    batch = collate(pretrain_samples(3, 12))
    batch["target_ids"][0, -3:] = -100  # some positions without loss
    strat = STRATEGIES.get("seq")(m, label_smoothing=eps)
    out = strat(batch)
    logits = m(batch["input_ids"]).logits
    want, n = naive_ce(logits.detach(), batch["target_ids"], eps)
    assert strat.loss_units(batch) == n == 3 * 12 - 3
    torch.testing.assert_close(out["loss"].double(), want, atol=1e-5, rtol=1e-5)
    assert out["metrics"]["seq_loss"] == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_sft_masked_ce_matches_naive_loop(eps):
    m = model()
    batch = collate(sft_samples(3, 16))
    batch["target_ids"] = batch["input_ids"].roll(-1, 1)  # mask only through loss_mask
    strat = STRATEGIES.get("sft")(m, label_smoothing=eps)
    out = strat(batch)
    ctx = ForwardContext(positions=batch["position_ids"], doc_ids=batch["doc_ids"])
    logits = m(batch["input_ids"], ctx).logits.detach()
    targets = batch["target_ids"].masked_fill(batch["loss_mask"] == 0, -100)
    want, n = naive_ce(logits, targets, eps)
    assert strat.loss_units(batch) == n == int(batch["loss_mask"].sum())
    torch.testing.assert_close(out["loss"].double(), want, atol=1e-5, rtol=1e-5)


def test_sft_packed_row_equals_documents_alone():
    """Per-document attention + doc_reset positions: a packed row's per-token losses equal
    those of each conversation run on its own."""
    m = model()
    torch.manual_seed(0)
    docs = [torch.randint(0, VOCAB, (n,)) for n in (5, 7, 4)]
    row = torch.cat(docs)[None]  # (1, 16)
    doc_ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None]
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    packed = m(row, ForwardContext(positions=pos, doc_ids=doc_ids)).logits
    alone = torch.cat([m(d[None]).logits for d in docs], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    # ...while plain causal attention over the row would leak across documents
    assert not torch.allclose(m(row).logits, alone, atol=1e-3)


def test_window_normalizer_scales_loss():
    m = model()
    batch = collate(pretrain_samples(2, 8))
    strat = STRATEGIES.get("seq")(m)
    plain = strat(batch)["loss"]
    units = strat.loss_units(batch)
    scaled = strat(batch, normalizer=4 * units)["loss"]
    torch.testing.assert_close(scaled, plain / 4)


def test_moe_aux_loss_added_and_logged_weighted_and_unweighted():
    m = model(n_experts=4, moe_top_k=2)
    batch = collate(pretrain_samples(2, 8))
    coef = 0.5
    out = STRATEGIES.get("seq")(m, moe_aux_loss_coef=coef)(batch)
    ce = float(out["metrics"]["seq_loss"])
    aux = float(out["metrics"]["moe_aux_loss"])
    assert aux == pytest.approx(float(m(batch["input_ids"]).aux_loss.detach()))
    assert float(out["metrics"]["moe_aux_loss_weighted"]) == pytest.approx(coef * aux)
    assert float(out["loss"].detach()) == pytest.approx(ce + coef * aux, rel=1e-5)
    assert math.isfinite(aux) and aux > 0


def test_unknown_strategy_and_kwargs():
    from astrai.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown 'ppo'"):
        STRATEGIES.get("ppo")(model())
    with pytest.raises(ConfigError, match=r"strategy 'sft': unknown option\(s\) beta"):
        STRATEGIES.get("sft")(model(), beta=0.1)
