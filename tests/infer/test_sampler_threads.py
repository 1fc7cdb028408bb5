"""A step's draws run torch's ops on one thread where the engine decodes on the CPU decode
kernels' own pool (astrai.infer.sampler `drawing`): an OpenMP region opened by a draw leaves
torch's threads spinning on the cores the next step needs."""

from __future__ import annotations

import pytest
import torch

from astrai.infer import SamplingParams
from astrai.infer.sampler import Sampler
from astrai.kernels.cpu_linear import cpu_decode_kernels

from .conftest import paged_engine, random_prompts


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_drawing_holds_torch_to_one_thread_and_gives_the_count_back(two_threads):
    s = Sampler("cpu", one_thread=True)
    with s.drawing():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError), s.drawing():
        raise ValueError("a draw that fails")
    assert torch.get_num_threads() == 2
    with Sampler("cpu").drawing():  # not asked: torch's threads as they are
        assert torch.get_num_threads() == 2


@pytest.mark.skipif(cpu_decode_kernels() is None,
                    reason="astrai's CPU decode kernels are not available here")
def test_an_engine_on_the_kernels_draws_on_one_thread(model, two_threads):
    eng = paged_engine(model)
    assert eng.sampler.one_thread
    sample, seen = eng.sampler.sample, []

    def counting(*args, **kw):
        seen.append(torch.get_num_threads())
        return sample(*args, **kw)

    eng.sampler.sample = counting
    params = SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, top_k=20, seed=3)
    out = eng.generate(random_prompts((5, 9), seed=2), params)
    assert all(len(o.token_ids) == 4 for o in out)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
