"""The CUDA kernels' own code, compiled for the CPU under csrc/emu/cuda_emu.h, against the
references: indexing, GQA mapping, split-KV merging, tiling, causal masks and rounding are
checked here without a GPU (speed and GPU-only races are not; see test_kernels_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from astrai.kernels import build
from astrai.kernels.library import (
    launch_paged_decode,
    launch_paged_prefill,
    launch_rotary_,
    load_library,
)
from astrai.kernels.reference import paged_decode_ref, paged_prefill_ref, rotary_ref_
from astrai.model.rope import rope_table

from .kernel_cases import decode_case, naive_rotary, prefill_case, rel_err

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(build.find_host_compiler() is None or build.cuda_include_dir() is None,
                       reason="needs a C++20 compiler and the CUDA headers"),
]
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOL = {F32: 1e-5, F16: 2e-3, BF16: 1.5e-2}


@pytest.fixture(scope="module")
def lib():
    return load_library(str(build.build_host_emulation()))


@pytest.mark.parametrize(("dtype", "H", "K", "D"), [
    (F32, 4, 4, 32), (F16, 4, 4, 32), (BF16, 4, 4, 32),   # MHA
    (F32, 8, 2, 64), (F16, 8, 2, 64), (BF16, 8, 2, 64),   # GQA 4
    (F16, 12, 1, 128), (BF16, 6, 2, 128), (F32, 4, 2, 128),  # MQA over two head chunks, GQA 3
])
def test_decode_kernel(lib, dtype, H, K, D):
    case = decode_case([1, 21, 40], H, K, D, dtype=dtype, seed=H + D)
    ref = paged_decode_ref(*case, scale=D ** -0.5)
    for splits in (1, 3):
        out = launch_paged_decode(lib, *case, scale=D ** -0.5, num_splits=splits)
        assert rel_err(out, ref) < TOL[dtype], (splits, rel_err(out, ref))


def test_decode_kernel_more_splits_than_keys_and_strided_q(lib):
    q, *rest = decode_case([2, 5], 8, 2, 32, dtype=torch.float16, seed=9)
    wide = torch.randn(2, 8, 96, dtype=torch.float16)
    wide[:, :, 32:64] = q  # q as a strided view of a wider tensor
    qv = wide[:, :, 32:64]
    out = launch_paged_decode(lib, qv, *rest, scale=0.2, num_splits=4)  # empty splits
    assert rel_err(out, paged_decode_ref(q, *rest, scale=0.2)) < TOL[torch.float16]


@pytest.mark.parametrize(("dtype", "H", "K", "D"), [
    (F16, 4, 2, 32), (BF16, 4, 2, 32), (F16, 2, 1, 64), (BF16, 2, 2, 128), (F16, 2, 2, 128),
])
@pytest.mark.parametrize("variant", ["wmma", "mma"])
def test_prefill_kernel(lib, dtype, H, K, D, variant):
    # fresh prompt over two query tiles and two key tiles; cached prefix; decode-like row;
    # an empty request
    case = prefill_case([70, 9, 1, 0], [70, 80, 30, 5], H, K, D, dtype=dtype, seed=D)
    for causal in (True, False):
        out = launch_paged_prefill(lib, *case, scale=D ** -0.5, causal=causal, variant=variant)
        ref = paged_prefill_ref(*case, scale=D ** -0.5, causal=causal)
        assert rel_err(out, ref) < TOL[dtype], (causal, rel_err(out, ref))


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_rotary_kernel(lib, dtype):
    cos, sin = rope_table(64, 50, 10000.0)
    g = torch.Generator().manual_seed(1)
    base = torch.randn(7, 5, 64, generator=g).to(dtype)
    before = base.clone()
    pos = torch.randint(0, 50, (7,), generator=g)
    x = base[:, 1:4]  # a strided view: heads 1..3 of 5
    want = x.clone()
    rotary_ref_(want, pos, cos, sin)
    launch_rotary_(lib, x, pos, cos, sin)
    assert rel_err(x, want) < TOL[dtype]
    assert rel_err(x, naive_rotary(before[:, 1:4], pos, cos, sin)) < TOL[dtype]
    assert torch.equal(base[:, 0], before[:, 0]) and torch.equal(base[:, 4], before[:, 4])
