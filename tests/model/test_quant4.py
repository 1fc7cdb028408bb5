"""Int4 weights (astrai/model/quant4.py): the q4_0 rule and layout against llama.cpp's gguf-py,
the error bound, and the CPU kernel against the torch path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from astrai.errors import UnsupportedModelError
from astrai.model import build_model, get_preset
from astrai.model.quant import quantize_model, weight_count
from astrai.model.quant4 import (
    GROUP,
    TILE,
    Int4Linear,
    dequantize_groups,
    int4_linear,
    quantize_groups,
    tile_layers,
    tile_rows,
    untile_rows,
)


def weights(n: int = 24, k: int = 128, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w[0, :GROUP] = 0.0  # an all-zero group: scale 0, values 8
    w[1, 5] = 40.0      # an outlier owns its group's scale
    return w


def test_values_and_scales_are_llama_cpps_q4_0():
    """The same bytes as gguf-py's Q4_0 quantizer (llama.cpp's reference rule): a q4_0 GGUF
    tensor and astrai's int4 layer hold the same numbers."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    w = weights()
    packed, d = quantize_groups(w)
    raw = quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)  # (N, K/32 · 18) bytes
    blocks = raw.reshape(w.shape[0], -1, 2 + GROUP // 2)
    want_d = blocks[..., :2].copy().view(np.float16).astype(np.float32)[..., 0]
    assert torch.equal(d, torch.from_numpy(want_d))
    assert torch.equal(packed, torch.from_numpy(blocks[..., 2:].reshape(w.shape[0], -1).copy()))
    want_w = dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    assert torch.equal(dequantize_groups(packed, d), torch.from_numpy(want_w).float())


def test_each_value_is_within_one_step_of_its_group():
    """|w - ŵ| <= |d| (half a step from rounding, a full one where the top value clamps at
    15), the largest magnitude exact up to the fp16 scale, zeros stay zero."""
    w = weights()
    packed, d = quantize_groups(w)
    wh = dequantize_groups(packed, d).view(w.shape[0], -1, GROUP)
    err = (wh - w.view_as(wh)).abs()
    assert (err <= d.abs()[..., None] * (1 + 1e-3) + 1e-7).all()
    assert torch.equal(wh[0, 0], torch.zeros(GROUP))
    assert abs(wh[1, 0, 5].item() - 40.0) < 40.0 * 1e-3  # -8 · d = m, d rounded to fp16
    assert packed.dtype == torch.uint8 and packed.shape == (w.shape[0], w.shape[1] // 2)


def test_rows_not_a_multiple_of_the_group_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_groups(torch.randn(4, 48))
    cfg = get_preset("tiny", vocab_size=64, dim=48, n_heads=4, n_kv_heads=2, head_dim=12,
                     ffn_dim=96, n_layers=1, max_seq_len=32)
    with pytest.raises(UnsupportedModelError, match="multiple of 32 wide.*48: use int8"):
        quantize_model(build_model(cfg, seed=0), "int4")


def test_quantize_model_replaces_the_blocks_and_the_head():
    cfg = get_preset("tiny", vocab_size=96, dim=64, n_heads=4, n_kv_heads=2, head_dim=16,
                     ffn_dim=128, n_layers=2, max_seq_len=32, tie_embeddings=True)
    model = build_model(cfg, seed=0)
    n = weight_count(model)
    quantize_model(model, "int4")
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 2 * 7 + 1 and model.quantize == "int4"
    assert weight_count(model) == n  # the tied head's copy is counted once, as its table
    model.to(torch.bfloat16)  # the values and scales keep their formats
    assert model.lm_head.qweight.dtype == torch.uint8 and model.lm_head.scale.dtype == torch.float32


@pytest.mark.parametrize("k", [128, 96, 1024])  # one block, a partial block, eight blocks
def test_the_cpu_kernel_computes_the_torch_paths_function(k):
    from astrai.kernels.cpu_linear import cpu_decode_kernels

    kernels = cpu_decode_kernels()
    if kernels is None or kernels.int4_many is None:
        pytest.skip("no CPU decode kernels here (no compiler)")
    w, g = weights(40, k, seed=k), torch.Generator().manual_seed(1)
    packed, d = quantize_groups(w)
    bias = torch.randn(40, generator=g)
    exact_w = dequantize_groups(packed, d)
    with torch.no_grad():
        for rows in (1, 2, 3, 4, 5, 9, 16):
            x = torch.randn(rows, k, generator=g)
            ref = int4_linear(x, packed, d, bias)  # torch: quantized activations, fp32 sums
            got = kernels.int4_many(x, [packed], [d], [bias])[0]
            assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4), rows
            # and both are the product with the dequantized weights, up to the activations'
            # int8 rounding (a relative 1/254 per value at most)
            assert torch.allclose(ref, x @ exact_w.T + bias, rtol=0.05, atol=0.05 * k ** 0.5)
        xb = torch.randn(3, k, generator=g).bfloat16()
        got = kernels.int4_many(xb, [packed], [d], [None])[0]
        assert got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), int4_linear(xb, packed, d).float(), rtol=1e-2, atol=0.3)


def test_a_prefill_takes_the_kernel_or_its_dequantized_weights_bit_for_bit():
    """Where the kernel takes a prefill's rows (every build takes any number), a row's product
    never depends on the other rows of its batch, and a decode's few rows each get the bits
    they get alone; beyond the kernel's rows, the layer multiplies torch's GEMM by the weights
    the kernels dequantize: the bits of dequantize_groups, so the product is torch's alone,
    bit for bit. Both ways on any CPU."""
    import dataclasses

    from astrai.kernels.cpu_linear import ALL_ROWS, cpu_decode_kernels

    kernels = cpu_decode_kernels()
    if kernels is None or kernels.int4_dequant is None:
        pytest.skip("no CPU decode kernels here (no compiler)")
    for n, k in ((40, 96), (7, 32), (300, 768)):
        packed, d = quantize_groups(weights(n, k, seed=n))
        assert torch.equal(kernels.int4_dequant(packed, d), dequantize_groups(packed, d))
    g = torch.Generator().manual_seed(2)
    x, other = torch.randn(70, 768, generator=g), torch.randn(30, 768, generator=g)
    every_row = dataclasses.replace(kernels, int4_rows=(1, ALL_ROWS))
    few_rows = dataclasses.replace(kernels, int4_rows=(1, 16))
    with torch.no_grad():
        batch = int4_linear(x, packed, d, None, every_row)
        beside = int4_linear(torch.cat([x[:40], other]), packed, d, None, every_row)
        assert torch.equal(beside[:40], batch[:40])
        decode = int4_linear(x[:9], packed, d, None, every_row)
        alone = torch.cat([int4_linear(x[i:i + 1], packed, d, None, every_row)
                           for i in range(9)])
        assert torch.equal(decode, alone)
        torch_path = int4_linear(x, packed, d)
        assert torch.allclose(batch, torch_path, rtol=1e-5, atol=1e-4)
        assert torch.allclose(decode, torch_path[:9], rtol=1e-5, atol=1e-4)
        assert torch.equal(int4_linear(x, packed, d, None, few_rows), torch_path)


def test_tiles_hold_the_rows_values_in_the_kernels_order():
    """tile_rows reorders, nothing else: group g of tile t holds, for dword i and row r, bytes
    4i..4i+3 of row 16t + r's group, then the 16 rows' scales as fp16; untile_rows inverts it."""
    packed, d = quantize_groups(weights(48, 96))
    tiles, scales = tile_rows(packed, d)
    assert tiles.shape == (3, 3, TILE * 16) and tiles.dtype == torch.uint8
    assert scales.shape == (3, 3, TILE) and scales.dtype == torch.float16
    for t, g, i, r in ((0, 0, 0, 0), (1, 2, 3, 5), (2, 1, 2, 15)):
        row, at = 16 * t + r, 16 * g + 4 * i
        assert torch.equal(tiles[t, g, 64 * i + 4 * r:64 * i + 4 * r + 4], packed[row, at:at + 4])
        assert scales[t, g, r].item() == d[row, g].item()
    back = untile_rows(tiles, scales)
    assert torch.equal(back[0], packed) and torch.equal(back[1], d)
    with pytest.raises(ValueError, match="multiple of 16"):
        tile_rows(*quantize_groups(weights(24, 96)))


def test_a_tiled_layer_is_the_rows_layer():
    """A layer in tiles computes what it computed in rows (the kernel's tiles within float
    summation order of its rows, torch's path exactly), keeps its state dict and weights in
    the row layout, loads a row state dict back, and a layer whose rows do not fill tiles
    stays in rows."""
    from astrai.kernels.cpu_linear import cpu_decode_kernels

    w, g = weights(64, 160), torch.Generator().manual_seed(3)
    layer = Int4Linear.from_linear(torch.nn.Linear(160, 64, bias=True))
    layer.qweight, layer.scale = quantize_groups(w)
    rows = Int4Linear(layer.qweight.clone(), layer.scale.clone(), layer.bias)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    assert layer.tile_() and layer.tiled and "tiles of 16 rows" in repr(layer)
    assert not Int4Linear(*quantize_groups(weights(24, 96))).tile_()
    for key, value in layer.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert torch.equal(layer.dequantized(), rows.dequantized())
    x = torch.randn(5, 160, generator=g)
    with torch.no_grad():
        assert torch.equal(layer(x), rows(x))  # torch's path: the row layout's weights
        kernels = cpu_decode_kernels()
        if kernels is not None and kernels.int4_tile:
            for m in (1, 3, 5):
                assert torch.allclose(layer(x[:m], kernels), rows(x[:m], kernels),
                                      rtol=1e-5, atol=1e-4)
    layer.load_state_dict(state)
    assert not layer.tiled and torch.equal(layer.qweight, state["qweight"])
    model = quantize_model(build_model(get_preset("tiny")), "int4")
    assert tile_layers(model) == sum(isinstance(m, Int4Linear) and m.out_features % 16 == 0
                                     for m in model.modules())


@pytest.mark.parametrize("k", [128, 160, 2304])  # one block, a partial block, eighteen
def test_the_tiled_kernel_computes_the_rows_kernels_function(k):
    """The tiles: a decode's rows within float summation order of the row
    layout's kernel (the same exact int32 group dots), each row's bits those it gets alone; a
    prefill's rows within the same order (on AVX-512 bit for bit: one lane kernel, the tile
    unpacked)."""
    from astrai.kernels.cpu_linear import cpu_decode_kernels

    kernels = cpu_decode_kernels()
    if kernels is None or not kernels.int4_tile:
        pytest.skip("no CPU decode kernels here (no compiler)")
    packed, d = quantize_groups(weights(48, k, seed=k))
    tiles, scales = tile_rows(packed, d)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4))
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for m in (1, 2, 3, 4, 5, 9, 16):
            got = kernels.int4_many(x[:m], [tiles], [scales], [bias])[0]
            ref = kernels.int4_many(x[:m], [packed], [d], [bias])[0]
            assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4), m
            alone = torch.cat([kernels.int4_many(x[i:i + 1], [tiles], [scales], [bias])[0]
                               for i in range(m)])
            assert torch.equal(got, alone), m
        got = kernels.int4_many(x, [tiles, packed], [scales, d], [bias, bias])
        if kernels.name.startswith("avx512"):  # both through the lane kernel
            assert torch.equal(got[0], got[1])
        assert torch.allclose(got[0], got[1], rtol=1e-5, atol=1e-4)
