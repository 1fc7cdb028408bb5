"""int8 weights (astrai/model/quant.py): the per-row quantizer against its closed form, the
int8 product against the kernel's reference (activations per row and block) and the
dequantized fp32 product, each row independent of its batch, and which layers a model swaps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from astrai.kernels.reference import gemv_q8_ref
from astrai.model import build_model, fast_path, get_preset
from astrai.model.lora import LoraSpec, apply_lora
from astrai.model.quant import (
    ACT_BLOCK,
    Int8Linear,
    dequantize_rows,
    int8_linear,
    quantize_model,
    quantize_rows,
    weight_count,
)


def small(**kw):
    return get_preset("tiny", **{"vocab_size": 128, "dim": 32, "n_layers": 2, "n_heads": 2,
                                 "n_kv_heads": 1, "head_dim": 16, "ffn_dim": 64,
                                 "max_seq_len": 32, **kw})


def test_rows_are_symmetric_absmax_with_half_a_step_of_error():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 40, generator=g) * torch.logspace(-3, 1, 8)[:, None]
    w[3] = 0.0
    q, s = quantize_rows(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (8,)
    nonzero = [i for i in range(8) if i != 3]
    assert torch.equal(q[nonzero].abs().amax(1), torch.full((7,), 127, dtype=torch.int8))
    torch.testing.assert_close(s[nonzero], w[nonzero].abs().amax(1) / 127)
    assert torch.all(q[3] == 0) and s[3] == 1  # an all-zero row: no division by zero
    err = (dequantize_rows(q, s) - w).abs()
    assert torch.all(err <= s[:, None] / 2 * (1 + 1e-5))
    assert dequantize_rows(q, s, torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_product_quantizes_activations_per_row_and_block(rows, bias):
    """torch's int8 product (no kernel active) is the kernel's q8 arithmetic: the reference's
    exact integer dots of the block-quantized activations, to fp32 rounding; and within the
    quantization error of the dequantized fp32 product, not equal to it."""
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(48, 300, generator=g), torch.randn(2, rows, 300, generator=g)
    b = torch.randn(48, generator=g) if bias else None
    q, s = quantize_rows(w)
    got = int8_linear(x, q, s, b)
    assert got.shape == (2, rows, 48) and got.dtype == torch.float32
    ref = gemv_q8_ref(x.reshape(-1, 300), q, s, b, block=ACT_BLOCK).view(2, rows, 48)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    deq = F.linear(x, dequantize_rows(q, s), b)
    _, xs = quantize_rows(x.reshape(-1, 300))  # max|x| / 127 per row bounds every block's
    step = (dequantize_rows(q, s).abs().sum(1)[None, :] * xs[:, None] / 2).view(2, rows, 48)
    err = (got - deq).abs()
    assert bool((err <= step * 1.001 + 1e-5).all()) and err.max() > 1e-4


def test_a_row_is_bit_identical_alone_and_in_any_batch():
    """A row's output through Int8Linear does not depend on the rows beside it, however
    different their magnitudes: every batch gives each row the bits it gets alone."""
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(300, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 300, generator=g))
    layer = Int8Linear.from_linear(lin)
    x = torch.randn(40, 300, generator=g) * torch.logspace(-3, 3, 40)[:, None]  # (40, 300)
    with torch.no_grad():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])  # (40, 48)
        for rows in (slice(0, 2), slice(0, 16), slice(3, 20), slice(None)):
            assert torch.equal(layer(x[rows]), alone[rows])
        flip = torch.arange(39, -1, -1)  # the big rows first
        assert torch.equal(layer(x[flip]), alone[flip])
        assert torch.equal(layer(x.view(4, 10, 300)), alone.view(4, 10, 48))


def test_kernels_keeping_fp32_activations_make_torch_keep_them():
    """Given kernels whose int8 products keep fp32 activations, torch's products for
    the rows they leave are the dequantized fp32 product too (one function per model)."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(48, 64, generator=g), torch.randn(40, 64, generator=g)
    q, s = quantize_rows(w)
    fp32_act = fast_path.DecodeKernels("test", *(lambda *a: None,) * 4, int8_quantized=False,
                                       int8_rows=(0, 0))
    got = int8_linear(x, q, s, None, fp32_act)
    torch.testing.assert_close(got, F.linear(x, dequantize_rows(q, s)), rtol=1e-5, atol=1e-5)


def test_a_model_swaps_every_block_linear_and_the_head_not_the_embeddings():
    model = build_model(small(), seed=0).eval()
    q = quantize_model(copy.deepcopy(model))
    swapped = sorted(n for n, m in q.named_modules() if isinstance(m, Int8Linear))
    plain = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    assert swapped == sorted(plain) and "lm_head" in swapped and len(swapped) == 2 * 7 + 1
    assert not any(type(m) is nn.Linear for m in q.modules()) and q.quantize == "int8"
    assert torch.equal(q.embed_tokens.weight, model.embed_tokens.weight)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids).logits, q(ids).logits
    assert ((a - b).norm() / a.norm()).item() < 0.05
    assert weight_count(q) == sum(p.numel() for p in model.parameters())
    tied = build_model(small(tie_embeddings=True), seed=0)
    n = sum(p.numel() for p in tied.parameters())
    assert weight_count(quantize_model(tied)) == n  # the head's int8 copy counted once


def test_tied_embeddings_get_an_int8_head_copy_and_moe_keeps_its_router():
    tied = quantize_model(build_model(small(tie_embeddings=True), seed=0))
    assert isinstance(tied.lm_head, Int8Linear)
    torch.testing.assert_close(tied.lm_head.dequantized(), tied.embed_tokens.weight,
                               atol=float(tied.lm_head.scale.max()) / 2 + 1e-6, rtol=0)
    moe = quantize_model(build_model(small(n_experts=4, moe_top_k=2, n_shared_experts=1), seed=0))
    names = {n for n, m in moe.named_modules() if isinstance(m, Int8Linear)}
    assert "layers.0.mlp.experts.3.down_proj" in names and "layers.0.mlp.shared.0.up_proj" in names
    assert type(moe.layers[0].mlp.router) is nn.Linear
    with torch.no_grad():
        moe(torch.tensor([[1, 2, 3]]))  # the experts run through their int8 layers


def test_dtype_moves_keep_int8_values_and_fp32_scales():
    q = quantize_model(build_model(small(), seed=0)).to(torch.bfloat16)
    layer = q.layers[0].attn.q_proj
    assert layer.qweight.dtype == torch.int8 and layer.scale.dtype == torch.float32
    with torch.no_grad():
        out = q(torch.tensor([[1, 2, 3]])).logits
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_adapters_must_be_merged_first_and_formats_are_named():
    model = apply_lora(build_model(small(), seed=0), LoraSpec.build(rank=2))
    with pytest.raises(ValueError, match="merge the LoRA adapters"):
        quantize_model(model)
    with pytest.raises(ValueError, match="int8"):
        quantize_model(build_model(small(), seed=0), "int3")
