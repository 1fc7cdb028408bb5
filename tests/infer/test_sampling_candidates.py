"""The draw over each row's largest logits (sampling_math.candidates, Sampler._draw_candidates)
against the masks over the whole row: the same kept tokens, the same distribution, seeded
draws independent of the batch, and the whole row's draw wherever the candidates could miss
a kept token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from astrai.infer import sampling_math as S
from astrai.infer.params import SamplingParams
from astrai.infer.sampler import Sampler

NEG = float("-inf")


def masked(x, k, p, m):
    """The whole-row masks, in the sampler's order."""
    return S.min_p_mask(S.top_p_mask(S.top_k_mask(x, k), p), m)


def spread(ids, w, V):
    """Candidates (ids, w) [B, C] back to rows [B, V], -inf elsewhere."""
    return torch.full((ids.shape[0], V), NEG).scatter(1, ids, w)


def logits(B, V, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g) * scale


@pytest.mark.parametrize("seed", range(4))
def test_candidates_keep_what_the_masks_keep(seed):
    V = 3000
    x = logits(6, V, seed)
    k = torch.tensor([1, 50, 0, 200, 0, 7])
    p = torch.tensor([1.0, 0.9, 0.5, 0.95, 0.99, 1.0])
    m = torch.tensor([0.0, 0.0, 0.05, 0.1, 0.0, 0.3])
    ids, w = S.candidates(x, k, p, m, cap=1024)
    assert torch.equal(spread(ids, w, V), masked(x, k, p, m))


def test_top_k_rows_alone_read_only_their_k():
    x = logits(3, 5000, 7)
    k = torch.tensor([5, 40, 12])
    ids, w = S.candidates(x, k, torch.tensor([1.0, 0.8, 1.0]), torch.zeros(3), cap=1024)
    assert ids.shape == (3, 40)
    assert torch.equal(spread(ids, w, 5000),
                       masked(x, k, torch.tensor([1.0, 0.8, 1.0]), torch.zeros(3)))


def test_rows_the_candidates_cannot_hold_take_the_whole_row():
    V = 3000
    x = logits(2, V, 1)
    one = torch.ones(2)
    # neither top-k nor top-p: every token may be drawn
    assert S.candidates(x, torch.tensor([50, 0]), torch.tensor([1.0, 1.0]), 0 * one, 1024) is None
    # a top-k wider than the cap
    assert S.candidates(x, torch.tensor([50, 2000]), one, 0 * one, 1024) is None
    # ties with the k-th largest past the candidates: 30 equal logits, k = 20
    t = x.clone()
    t[0, :30] = 50.0
    assert S.candidates(t, torch.tensor([20, 5]), one, 0 * one, 1024) is None
    # a nucleus the cap largest do not hold: a flat row, top-p 0.9
    flat = torch.zeros(2, V)
    flat[1] = x[1]  # (a flat row's top-k would tie past the candidates too)
    assert S.candidates(flat, torch.tensor([0, 5]), torch.tensor([0.9, 1.0]), 0 * one,
                        1024) is None
    # within reach they hold it
    assert S.candidates(flat, torch.tensor([0, 5]), torch.tensor([0.1, 1.0]), 0 * one,
                        1024) is not None


def reqs_of(params):
    return [SimpleNamespace(params=p, constraint=None, num_output=3, id=str(i), tokens=[1],
                            prompt_len=1) for i, p in enumerate(params)]


@pytest.mark.parametrize("params, by_candidates", [
    (SamplingParams(temperature=0.8, top_k=20), True),
    (SamplingParams(temperature=1.3, top_p=0.7), True),
    (SamplingParams(temperature=1.0, top_k=40, top_p=0.9, min_p=0.05), True),
    (SamplingParams(temperature=0.5), False),  # no top-k, no top-p: the whole row
    (SamplingParams(temperature=2.0, min_p=0.05), False),
])
def test_the_draw_is_the_masked_softmax(params, by_candidates):
    """40,000 rows of one distribution drawn at once, over the candidates or (rows they
    cannot serve) the whole row: each token's frequency within 0.01 of its probability
    under the tempered whole-row masks."""
    V, n = 400, 40_000
    x = logits(1, V, 3, scale=2.0)
    sampler = Sampler("cpu", seed=0)
    rows = x.expand(n, V).contiguous()
    reqs = reqs_of([params] * n)
    tempered = sampler.tempered(rows, [params] * n)
    assert (sampler._draw_candidates(tempered, reqs, [False] * n) is not None) == by_candidates
    tokens = sampler._draw(rows, reqs, [False] * n)
    freq = torch.bincount(tokens, minlength=V).float() / n
    t = torch.tensor([params.temperature])
    want = masked(S.apply_temperature(x, t), torch.tensor([params.top_k]),
                  torch.tensor([params.top_p]), torch.tensor([params.min_p])).softmax(-1)[0]
    assert freq[want == 0].sum() == 0
    torch.testing.assert_close(freq, want, atol=0.01, rtol=0)


def test_a_seeded_row_draws_the_same_whatever_its_batch():
    """A seeded row beside rows whose top-k (so the candidates' width) and seeds differ, and
    alone: the same token each time, for 50 seeds; other seeds give other tokens."""
    V = 2000
    x = logits(4, V, 5, scale=1.0)
    mine = SamplingParams(temperature=1.0, top_k=30, top_p=0.95)
    others = [SamplingParams(temperature=0.7, top_k=300), SamplingParams(temperature=1.0),
              SamplingParams(temperature=1.2, top_p=0.5, seed=7)]
    sampler = Sampler("cpu", seed=0)
    got = set()
    for seed in range(50):
        p = SamplingParams(**{**mine.__dict__, "seed": seed})
        alone = sampler._draw(x[1:2], reqs_of([p]), [False])
        batch = sampler._draw(x, reqs_of([others[0], p, others[2], others[1]]),
                              [False, False, False, True])
        assert int(alone[0]) == int(batch[1]), seed
        got.add(int(alone[0]))
    assert len(got) > 5
