"""The decode kernels' work-sharing loop (csrc/cpu/work_share.h): every item runs once for any
item count, piece size and thread count, and a thread stalled inside a piece leaves the
rest of the loop, its own home range included, to the calling thread."""

from __future__ import annotations

import pytest
import torch

from astrai.kernels import cpu_build, cpu_linear

BEST = cpu_build.best_isa()
pytestmark = pytest.mark.skipif(
    BEST is None or cpu_build.find_cxx() is None,
    reason="needs an x86 CPU with AVX2+FMA and a C++ compiler")


@pytest.fixture(scope="module")
def ops():
    return cpu_linear.load_ops(BEST)[0]


@pytest.fixture
def threads():
    """Sets torch's thread count (the pool's size) for a test and gives the old one back."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


@pytest.mark.parametrize("count", [2, 3, 4])
def test_every_item_runs_once(ops, threads, count):
    threads(count)
    for n in (1, 2, 3, 7, 16, 33, 50, 129, 1000):
        for grain in (1, 2, 3, 7, 64):
            for _ in range(3):  # loops back to back: a worker late for one meets the next
                runs = ops.share_probe(n, grain, 0)
                assert torch.equal(runs[0], torch.ones(n, dtype=torch.long)), (n, grain)


@pytest.mark.parametrize("count", [2, 3])
def test_a_stalled_thread_leaves_the_loop_to_the_caller(ops, threads, count):
    """The first piece each worker takes sleeps 200 ms (a thread the OS deschedules): the
    calling thread takes every other piece, those of the workers' home ranges included, so
    each worker runs at most one piece (home ranges without taking from the others' would
    leave a stalled worker its whole range: 1/count of the items)."""
    threads(count)
    n, grain = 64, 1  # 8 pieces a thread at most: pieces of 64 / (8 · count) items
    runs = ops.share_probe(n, grain, 200_000)
    assert torch.equal(runs[0], torch.ones(n, dtype=torch.long))
    by_workers = int(n - runs[1].sum())
    piece = -(-n // (8 * count))
    assert by_workers <= (count - 1) * piece, (by_workers, piece)
