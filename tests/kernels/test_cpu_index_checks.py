"""The CPU decode kernels check the indices they are given (request rows, KV lengths, slots,
req_to_token entries) before reading or writing through them: an upstream bug raises a
RuntimeError naming the index instead of touching memory outside the K/V pool. And the
native step packs each block's weights by the slot names the library reports."""

from __future__ import annotations

import pytest
import torch

from astrai.infer import CacheConfig, Engine
from astrai.infer.native_step import block_weights
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.model import build_model, get_preset

KERNELS = cpu_decode_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="no CPU decode kernels here")
S, K, D, H = 32, 2, 16, 4


def attention_args(rows=(0, 1), lens=(3, 2), table=None):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(len(rows), H, D, generator=g)
    kb, vb = torch.randn(S, K, D, generator=g), torch.randn(S, K, D, generator=g)
    if table is None:
        table = torch.arange(2 * 8, dtype=torch.int32).view(2, 8)
    return (q, kb, vb, table, torch.tensor(rows), torch.tensor(lens, dtype=torch.int32),
            D ** -0.5)


def test_valid_indices_attend():
    out = KERNELS.paged_decode(*attention_args())
    assert out.shape == (2, H, D) and torch.isfinite(out).all()


@pytest.mark.parametrize("kw, message", [
    ({"rows": (0, 2)}, "request row 2 outside req_to_token's 2 rows"),
    ({"rows": (-1, 0)}, "request row -1"),
    ({"lens": (0, 2)}, "KV length 0 outside 1..8"),
    ({"lens": (3, 9)}, "KV length 9 outside 1..8"),
    ({"table": torch.tensor([[0, 1, 40, 3, 4, 5, 6, 7], [8] * 8], dtype=torch.int32)},
     r"req_to_token\[0, 2\] = 40 outside the pool's 32 slots"),
    ({"table": torch.tensor([[0, -5, 2, 3, 4, 5, 6, 7], [8] * 8], dtype=torch.int32)},
     r"req_to_token\[0, 1\] = -5"),
])
def test_paged_decode_refuses_indices_outside_the_pool(kw, message):
    with pytest.raises(RuntimeError, match=message):
        KERNELS.paged_decode(*attention_args(**kw))


@pytest.fixture(scope="module")
def native():
    cfg = get_preset("tiny", vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     head_dim=16, ffn_dim=96, max_seq_len=64)
    eng = Engine(build_model(cfg, seed=0).eval(), None,
                 CacheConfig(page_size=4, max_kv_tokens=64, max_requests=2))
    assert eng.decode_path.name == "native"
    return eng


def decode_layers(eng, rows5):
    step, m, st = eng.decode_path.fast, eng.model, eng.pool.storage
    return step.kernels.decode_layers(
        rows5, m.embed_tokens.weight, step.weights, step.shape, step.eps, m.rope_cos,
        m.rope_sin, st.k, st.v, eng.pool.req_to_token.table, m.norm.weight,
        step.head(step.kernels))


@pytest.mark.parametrize("column, value, message", [
    (4, 10 ** 6, "K/V slot 1000000 outside the pool's"),   # the slot its K/V is written to
    (4, -1, "K/V slot -1"),
    (2, 99, "request row 99 outside"),
    (3, 10 ** 6, "KV length 1000000 outside"),
])
def test_decode_layers_refuses_a_bad_index_before_writing(native, column, value, message):
    rows5 = torch.tensor([[5], [0], [0], [1], [0]], dtype=torch.int64)  # id, pos, row, len, slot
    decode_layers(native, rows5)  # valid: runs
    before = native.pool.storage.k.clone()
    rows5[column, 0] = value
    with pytest.raises(RuntimeError, match=message):
        decode_layers(native, rows5)
    assert torch.equal(native.pool.storage.k, before)


def test_blocks_are_packed_by_the_librarys_slot_names(native):
    assert set(block_weights(native.model.layers[0])) == set(KERNELS.layer_slots)
    assert len(KERNELS.layer_slots) == len(set(KERNELS.layer_slots)) == 21
