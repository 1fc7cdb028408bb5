"""The pure-torch references (the kernels' spec) against naive loops and the model's RoPE."""

from __future__ import annotations

import pytest
import torch

from astrai.kernels.reference import paged_decode_ref, paged_prefill_ref, rotary_ref_
from astrai.model.rope import apply_rope, rope_table

from .kernel_cases import (
    decode_case,
    naive_decode,
    naive_prefill,
    naive_rotary,
    prefill_case,
    rel_err,
)


@pytest.mark.parametrize(("H", "K", "D"), [(4, 4, 8), (6, 2, 16), (8, 1, 32)])
def test_decode_ref_matches_naive_loops_gqa(H, K, D):
    case = decode_case([1, 9, 4], H, K, D, seed=H + K)
    out = paged_decode_ref(*case, scale=D ** -0.5)
    assert out.shape == (3, H, D) and out.dtype == torch.float32
    assert rel_err(out, naive_decode(*case, scale=D ** -0.5)) < 1e-6


def test_decode_ref_ignores_junk_past_length():
    q, k, v, r2t, rows, lens = decode_case([3, 5], 4, 2, 16, seed=1)
    out = paged_decode_ref(q, k, v, r2t, rows, lens, 0.25)
    r2t2 = r2t.clone()
    r2t2[rows[0], 3:] = 0  # overwrite slots past request 0's length
    k2 = k.clone()
    k2[r2t[rows[1], 5:].long()] = 1e4  # and keys past request 1's length
    torch.testing.assert_close(paged_decode_ref(q, k2, v, r2t2, rows, lens, 0.25), out)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("H", "K"), [(4, 4), (6, 2), (4, 1)])
def test_prefill_ref_matches_naive_loops_ragged_with_prefix(causal, H, K):
    # fresh prompt, prompt with cached prefix, single-token (decode-like), long prefix
    case = prefill_case([5, 3, 1, 4], [5, 10, 7, 20], H, K, 16, seed=H * K)
    out = paged_prefill_ref(*case, scale=0.3, causal=causal)
    assert rel_err(out, naive_prefill(*case, scale=0.3, causal=causal)) < 1e-6


def test_prefill_ref_of_single_tokens_is_decode_ref():
    lens = [4, 11, 1]
    q, k, v, r2t, rows, seq = decode_case(lens, 8, 2, 16, seed=3)
    kv_indices = torch.cat([r2t[int(r), :n] for r, n in zip(rows, lens)])
    qo = torch.arange(len(lens) + 1, dtype=torch.int32)
    kvp = torch.tensor([0, 4, 15, 16], dtype=torch.int32)
    pre = paged_prefill_ref(q, k, v, qo, kvp, kv_indices, 0.25)
    torch.testing.assert_close(pre, paged_decode_ref(q, k, v, r2t, rows, seq, 0.25))


def test_prefill_ref_bf16_rounds_once_from_fp32_math():
    case = prefill_case([3, 2], [3, 6], 4, 2, 16, dtype=torch.bfloat16, seed=5)
    out = paged_prefill_ref(*case, scale=0.25)
    assert out.dtype == torch.bfloat16
    exact = naive_prefill(*case, scale=0.25)
    torch.testing.assert_close(out.double(), exact, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("D", [8, 64])
def test_rotary_ref_matches_complex_rotation(D):
    g = torch.Generator().manual_seed(D)
    cos, sin = rope_table(D, 40, 10000.0)
    x = torch.randn(6, 3, D, generator=g)
    pos = torch.randint(0, 40, (6,), generator=g)
    y = x.clone()
    assert rotary_ref_(y, pos, cos, sin) is None
    assert rel_err(y, naive_rotary(x, pos, cos, sin)) < 1e-6


def test_rotary_ref_equals_model_rope_on_flattened_tokens():
    # The model rotates q [B, T, H, D] by positions [B, T]; the kernel sees [B*T, H, D].
    g = torch.Generator().manual_seed(0)
    cos, sin = rope_table(32, 64, 500000.0)
    x = torch.randn(2, 5, 4, 32, generator=g)
    positions = torch.randint(0, 64, (2, 5), generator=g)
    want = apply_rope(x, cos[positions], sin[positions])
    y = x.reshape(10, 4, 32).clone()
    rotary_ref_(y, positions.reshape(-1), cos, sin)
    torch.testing.assert_close(y.view(2, 5, 4, 32), want)
