"""astrai.infer.hugepages: large CPU weights moved into 2 MiB-aligned, MADV_HUGEPAGE memory
keep their values, their Parameter objects and their sharing; what cannot move stays."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from astrai.infer import CacheConfig, Engine, SamplingParams
from astrai.infer.hugepages import HUGE_PAGE, huge_copy, movable, place_weights, thp_mode
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.model import build_model

from .conftest import naive_greedy, paged_engine, random_prompts, small_config

needs_thp = pytest.mark.skipif(thp_mode() not in ("always", "madvise"),
                               reason="transparent huge pages are off here")
ROWS = HUGE_PAGE // (64 * 4)  # a [ROWS, 64] fp32 matrix is one huge page


def test_a_copy_is_aligned_and_equal():
    t = torch.randn(ROWS + 3, 64)
    c = huge_copy(t)
    assert c.data_ptr() % HUGE_PAGE == 0 and c.dtype == t.dtype
    assert torch.equal(c, t)
    c.add_(1.0)  # writable, and not the original
    assert torch.equal(c, t + 1.0)


def test_what_may_move():
    big = torch.zeros(ROWS, 64)
    assert movable(big)
    assert not movable(torch.zeros(ROWS // 2, 64))  # under one huge page
    assert not movable(torch.zeros(2 * ROWS, 64)[:ROWS])  # a view into a larger storage
    assert not movable(big.t())  # not contiguous


@needs_thp
def test_weights_move_and_keep_their_parameters():
    lin = nn.Linear(64, ROWS, bias=False)
    model = nn.Sequential(lin, nn.Linear(ROWS, 8))
    model.register_buffer("shared", torch.randn(ROWS, 64))
    model[1].register_buffer("shared", model.shared)  # one buffer, two modules
    param, values = lin.weight, lin.weight.detach().clone()
    assert place_weights(model) == 2 * ROWS * 64 * 4  # the weight and the buffer, once
    assert lin.weight is param and torch.equal(param, values)
    assert param.data_ptr() % HUGE_PAGE == 0 and param.requires_grad
    assert model[1].shared is model.shared and model.shared.data_ptr() % HUGE_PAGE == 0
    assert place_weights(model) == 0  # a moved tensor is a view of its mapping: stays


@needs_thp
@pytest.mark.skipif(cpu_decode_kernels() is None, reason="astrai's CPU decode kernels are not here")
def test_an_engine_decodes_from_moved_weights():
    """A tied embedding of one huge page: an engine asked to (`huge_pages=True`, as the CLI
    and from_checkpoint do) moves it (the table and the head stay one tensor), one over a
    caller's module by default does not, and the tokens equal full recomputation's."""
    model = build_model(small_config(vocab_size=ROWS, tie_embeddings=True), seed=2).eval()
    prompts = random_prompts((5, 12), seed=3, vocab=ROWS)
    want = [naive_greedy(model, p, 6) for p in prompts]
    before = model.embed_tokens.weight.data_ptr()
    paged_engine(model)  # a caller's module: left where it is
    assert model.embed_tokens.weight.data_ptr() == before
    eng = Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=1024, max_requests=8),
                 huge_pages=True)
    assert model.embed_tokens.weight.data_ptr() % HUGE_PAGE == 0
    outs = eng.generate(prompts, SamplingParams.greedy(6))
    assert [o.token_ids for o in outs] == want
