"""The CPU decode kernels check the indices they are given (request rows, KV lengths, slots,
req_to_token entries) before reading or writing through them: an upstream bug raises a
RuntimeError naming the index instead of touching memory outside the K/V pool. And the
native step packs each block's weights by the slot names the library reports, into a plan
that checks each weight's shape, dtype and layout once."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from astrai.infer import CacheConfig, Engine
from astrai.infer.native_step import block_weights, pack_weights
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
    return eng.decode_path.fast.forward(rows5)


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


def plan(eng, edit=None):
    m, cfg = eng.model, eng.model.config
    weights = pack_weights(m, KERNELS.layer_slots)
    if edit is not None:
        edit(weights)
    shape = [cfg.n_heads, cfg.kv_heads, cfg.hdim, *KERNELS.fp32_rows, *KERNELS.bf16_rows,
             int(KERNELS.int8_quantized)]
    return KERNELS.decode_plan(weights, shape, cfg.norm_eps, m.embed_tokens.weight,
                               m.norm.weight)


def slot(name, layer=0):
    return layer * len(KERNELS.layer_slots) + KERNELS.layer_slots.index(name)


@pytest.mark.parametrize("name, make, message", [
    ("o", lambda w: w[:-1], "o weights of 63 rows, expected 64"),
    ("k", lambda w: w[:, :-1], r"weight 1 must be a CPU matrix \[N, 64\]"),
    ("down", lambda w: w.double(), "down weights Double with activations Float"),
    ("up", lambda w: w.bfloat16(), "weights of one dtype"),
    ("gate", lambda w: w.bfloat16(), "gate / up weights BFloat16 with activations Float"),
    ("attn_norm", lambda w: w[:-1], "attn_norm must be a CPU vector of 64"),
    ("q_norm", lambda w: torch.ones(16), "q_norm and k_norm together"),
    ("up", lambda w: None, "a block without its gate / up weights"),
])
def test_the_plan_refuses_a_weight_it_cannot_run(native, name, make, message):
    def edit(weights):
        weights[slot(name, 1)] = make(weights[slot(name, 1)])

    assert plan(native) is not None  # the model's own weights: accepted
    with pytest.raises(RuntimeError, match=message):
        plan(native, edit)


def test_a_refused_plan_leaves_the_engine_on_the_eager_path(caplog):
    def refuse(*args):
        raise RuntimeError("decode_plan: o weights of 63 rows, expected 64")

    cfg = get_preset("tiny", vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     head_dim=16, ffn_dim=96, max_seq_len=64)
    broken = dataclasses.replace(KERNELS, decode_plan=refuse)
    with caplog.at_level("WARNING", logger="astrai.infer"):
        eng = Engine(build_model(cfg, seed=0).eval(), None,
                     CacheConfig(page_size=4, max_kv_tokens=64, max_requests=2), kernels=broken)
    assert eng.decode_path.name == "eager"
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] == [
        "decode path native refused, running eager: decode_plan: o weights of 63 rows, "
        "expected 64"]
