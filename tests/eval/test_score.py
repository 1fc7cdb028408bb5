"""The prefix-tree scorer against one plain forward per request (a naive loop)."""

import random

import pytest
import torch

from astrai.eval.score import Scorer, model_inputs, pack_tree
from astrai.model import build_model

from .conftest import tiny_config


def rand(n, seed, vocab=512):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@torch.no_grad()
def naive(model, context, continuation, max_len):
    """HFLM's rule, one request at a time: one full forward of the truncated input."""
    inp, n = model_inputs(context, continuation, max_len)
    logp = model(torch.tensor([inp])).logits[0].double().log_softmax(-1)
    rows = logp[len(inp) - n:]
    tgt = torch.tensor(continuation[len(continuation) - n:])
    return float(rows.gather(1, tgt[:, None]).sum()), bool((rows.argmax(-1) == tgt).all())


def test_pack_tree_mask_is_the_ancestor_relation():
    seqs = [[1, 2, 3], [1, 2, 4, 5], [1, 6], [7], [1, 2, 3, 9]]
    t = pack_tree(seqs)
    assert len(t.tokens) == 8  # 1 2 3 9 4 5 6 7: shared prefixes stored once
    for s, path in zip(seqs, t.paths):
        assert [t.tokens[i] for i in path] == s
        assert [t.depth[i] for i in path] == list(range(len(s)))
    mask = t.mask()[0, 0]
    anc = torch.zeros_like(mask)
    for path in t.paths:
        for a, i in enumerate(path):
            for j in path[:a + 1]:
                anc[i, j] = True
    assert torch.equal(mask, anc)


@pytest.mark.parametrize("batch_tokens", [16, 4096])
@pytest.mark.parametrize("sliding_window", [None, 8])
def test_loglikelihood_equals_one_forward_per_request(batch_tokens, sliding_window):
    model = build_model(tiny_config(sliding_window=sliding_window), seed=3).eval()
    max_len = model.config.max_seq_len
    rng = random.Random(0)
    pairs = []
    for q in range(4):  # multiple-choice: one context, several continuations
        ctx = rand(rng.randint(1, 20), q)
        pairs += [(ctx, rand(rng.randint(1, 5), 100 + 10 * q + c)) for c in range(4)]
    pairs.append((rand(90, 7), rand(6, 8)))  # longer than the context: left-truncated
    pairs.append((rand(3, 9), rand(70, 10)))  # continuation alone overflows
    greedy_ctx = rand(5, 11)
    with torch.no_grad():
        g = [int(model(torch.tensor([greedy_ctx])).logits[0, -1].argmax())]
    pairs.append((greedy_ctx, g))  # the greedy token: is_greedy must be True
    got = Scorer(model, batch_tokens=batch_tokens).loglikelihood(pairs)
    for (c, x), (lp, greedy) in zip(pairs, got, strict=True):
        ref, ref_greedy = naive(model, c, x, max_len)
        assert lp == pytest.approx(ref, abs=1e-4)
        assert greedy == ref_greedy
    assert got[-1][1]


def test_rolling_equals_a_naive_per_token_loop(model):
    docs = [rand(5, 1), rand(40, 2), rand(150, 3)]  # the last spans three windows of 64
    got = Scorer(model).rolling(docs, prefix_token=0)
    for doc, total in zip(docs, got):
        ref = 0.0
        with torch.no_grad():
            for i, t in enumerate(doc):
                # token i is predicted in the window of tokens [L*(i//L), end): the first
                # window reads the prefix token and what precedes i; a later one reads the
                # up to L tokens before i that end where its window ends
                L = model.config.max_seq_len
                end = min(L * (i // L) + L, len(doc))
                ctx = [0] + doc[:i] if i < L else doc[end - L - 1:i]
                logp = model(torch.tensor([ctx])).logits[0, -1].double().log_softmax(-1)
                ref += float(logp[t])
        assert total == pytest.approx(ref, abs=1e-3)


def test_empty_inputs_are_refused(model):
    s = Scorer(model)
    with pytest.raises(ValueError):
        s.loglikelihood([([1], [])])
    with pytest.raises(ValueError):
        s.loglikelihood([([], [1])])
