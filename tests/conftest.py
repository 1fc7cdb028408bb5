"""Fixtures shared by every test package."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test, restored afterwards. The test shapes are tiny:
    on a shared 2-core machine two OpenMP threads spin against other processes (25-1000x
    slower measured), and one thread reduces in the same order as a subprocess run with
    OMP_NUM_THREADS=1, which bit-equality checks against such a run need."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def real_tokenizer_dirs(tmp_path_factory):
    """family -> tokenizer directory of the real families (tests/real_tokenizers.py)."""
    from tests.real_tokenizers import FAMILIES, family_dir

    root = tmp_path_factory.mktemp("real-tokenizers")
    return {name: family_dir(name, root) for name in FAMILIES}
