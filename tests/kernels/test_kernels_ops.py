"""The custom ops on the CPU: schema, fake (meta) impls, torch.compile tracing, dispatch."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from astrai.kernels import paged_decode, paged_prefill, rotary_
from astrai.kernels.reference import paged_decode_ref, paged_prefill_ref, rotary_ref_
from astrai.model.rope import rope_table

from .kernel_cases import decode_case, prefill_case


def test_opcheck_paged_decode():
    case = decode_case([3, 8], 4, 2, 16)
    opcheck(torch.ops.astrai.paged_decode.default, (*case, 0.25))
    opcheck(torch.ops.astrai.paged_decode.default, (*case, 0.25, 3))


@pytest.mark.parametrize("causal", [True, False])
def test_opcheck_paged_prefill(causal):
    case = prefill_case([2, 3], [2, 7], 4, 2, 16)
    opcheck(torch.ops.astrai.paged_prefill.default, (*case, 0.25, causal))


def test_opcheck_rotary():
    cos, sin = rope_table(16, 32, 10000.0)
    x = torch.randn(5, 3, 16)
    opcheck(torch.ops.astrai.rotary_.default, (x, torch.tensor([0, 3, 7, 31, 2]), cos, sin))


def test_ops_run_references_on_cpu():
    case = decode_case([5, 2], 4, 2, 16, seed=2)
    torch.testing.assert_close(paged_decode(*case, 0.25), paged_decode_ref(*case, 0.25))
    pcase = prefill_case([3, 1], [4, 6], 4, 2, 16, seed=2)
    torch.testing.assert_close(paged_prefill(*pcase, 0.25), paged_prefill_ref(*pcase, 0.25))
    cos, sin = rope_table(16, 8, 10000.0)
    x = torch.randn(3, 2, 16)
    a, b = x.clone(), x.clone()
    rotary_(a, torch.tensor([1, 4, 7]), cos, sin)
    rotary_ref_(b, torch.tensor([1, 4, 7]), cos, sin)
    assert torch.equal(a, b) and not torch.equal(a, x)


def test_decode_op_traces_under_torch_compile():
    case = decode_case([4, 9], 4, 2, 16, seed=4)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(q, k, v, r2t, rows, lens):
        return torch.ops.astrai.paged_decode(q * 2, k, v, r2t, rows, lens, 0.125) + 1

    q, *rest = case
    torch.testing.assert_close(step(q, *rest), paged_decode_ref(q * 2, *rest, 0.125) + 1)


def test_supported_names_each_reason():
    from astrai.kernels.library import decode_supported, prefill_supported

    q, k = torch.zeros(2, 8, 64, dtype=torch.bfloat16), torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    assert decode_supported(q, k) is None and prefill_supported(q, k) is None
    assert "fp16, bf16)" in prefill_supported(q.float(), k.float())
    assert decode_supported(q.float(), k.float()) is None
    assert "cache dtype" in decode_supported(q, k.half())
    assert "head dim 80" in decode_supported(q[..., :80].new_zeros(2, 8, 80),
                                             k.new_zeros(10, 2, 80))
    assert "not a multiple" in decode_supported(q.new_zeros(2, 6, 64), k.new_zeros(10, 4, 64))
    assert "16-byte" in decode_supported(q, k.new_zeros(10, 2, 68)[..., :64])


def test_decode_splits_fill_the_gpu_only_when_needed():
    from astrai.kernels.library import decode_splits

    assert decode_splits(B=256, H=32, K=8, max_context=4096, sm_count=132) == 1
    assert decode_splits(B=1, H=32, K=8, max_context=32768, sm_count=132) == 64
    assert decode_splits(B=4, H=32, K=8, max_context=32768, sm_count=132) == 17
    assert decode_splits(B=1, H=32, K=8, max_context=128, sm_count=132) == 2  # short context
