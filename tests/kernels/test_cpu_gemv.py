"""The CPU decode kernels (csrc/cpu/decode_gemv.cpp) against their torch references, on every
code path this CPU runs (AVX-512 and AVX2 on an AVX-512 machine), and the dispatch that
sends a decode step's work to them: GEMVs of odd sizes, tails that are no multiple of a
vector or a block, 1..16 activation rows, fp32 / bf16 / int8 weights, biases, several
matrices per call; the RMSNorm; paged decode attention (GQA, fp32 and bf16); the fallback
to torch where the kernels cannot be had. One build per code path and
session (cached across sessions); skipped without a C++ compiler or on a CPU without AVX2."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch import nn

from astrai.kernels import cpu_build, cpu_linear
from astrai.kernels.reference import gemv_q8_ref, paged_decode_ref
from astrai.model import fast_path
from astrai.model.context import ForwardContext
from astrai.model.norm import rms_norm
from astrai.model.quant import Int8Linear, dequantize_rows, quantize_rows
from astrai.model.quant4 import quantize_groups

from .kernel_cases import decode_case

# ASTRAI_TEST_CPU_FLAGS_OFF=avx512_vnni,avx512_bf16: the kernels built as for a CPU without
# those flags (test_the_avx512_paths_without_vnni_and_bf16 runs this module so, in its own
# process: both builds name the same op namespace).
FLAGS_OFF = frozenset(f for f in os.environ.get("ASTRAI_TEST_CPU_FLAGS_OFF", "").split(",") if f)
BEST = cpu_build.best_isa()
HERE = [] if BEST is None else list(cpu_build.ISAS[cpu_build.ISAS.index(BEST):])
pytestmark = pytest.mark.skipif(
    BEST is None or cpu_build.find_cxx() is None,
    reason="needs an x86 CPU with AVX2+FMA and a C++ compiler")

SHAPES = [(1, 1, 1), (1, 5, 3), (2, 16, 5), (3, 77, 13), (1, 64, 128), (8, 131, 67),
          (5, 1000, 9), (4, 129, 31), (7, 300, 33), (6, 2304, 20), (9, 96, 7), (13, 40, 6),
          (16, 33, 5)]
"""(M, K, N): K and N around and off the multiples of 8/16 (vectors), 64/128 (int8 blocks),
and 4 (the kernel's row tile); M past one group of activation rows (4 or 8: 9 rows are two
groups, 5 + 4)."""


@pytest.fixture(scope="module", params=HERE)
def ops(request):
    """The built variant; a build error fails here (the engine would fall back silently)."""
    return cpu_linear.load_ops(request.param,
                               cpu_build.cpu_flags() - FLAGS_OFF if FLAGS_OFF else None)


def bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An fp32 rounding bound of x wᵀ, elementwise: 1e-5 · Σ|x||w| (a K-term fp32 sum errs
    by far less than K·2⁻²⁴ of it; 1e-5 leaves room, and no last bit is relied on)."""
    return 1e-5 * (x.double().abs() @ w.double().abs().T) + 1e-30


def check(out: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == torch.float32
    err = (out.double() - ref.double()).abs()
    assert bool((err <= tol).all()), f"max err {err.max():.3g}, bound {tol.max():.3g}"


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_float_weights_match_torch(ops, M, K, N):
    o, _ = ops
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    x, w, b = (torch.randn(M, K, generator=g), torch.randn(N, K, generator=g),
               torch.randn(N, generator=g))
    check(o.gemv(x, w, b), x.double() @ w.double().T + b.double(), bound(x, w) + 1e-6)
    wb = w.bfloat16()  # the bf16 values exactly, against fp32 activations
    check(o.gemv(x, wb, None), x.double() @ wb.double().T, bound(x, wb.float()))


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_int8_weights_match_their_references(ops, M, K, N):
    o, info = ops
    g = torch.Generator().manual_seed(M * 7 + K * 3 + N)
    x, w, b = (torch.randn(M, K, generator=g), torch.randn(N, K, generator=g),
               torch.randn(N, generator=g))
    q, s = quantize_rows(w)
    deq = dequantize_rows(q, s)
    # fp32 activations: the dequantized model's product, to fp32 rounding
    check(o.gemv_int8(x, q, s, b), x.double() @ deq.double().T + b.double(),
          bound(x, deq) + 1e-6)
    # int8 activations per block: the reference's integer dots, to fp32 rounding
    ref = gemv_q8_ref(x, q, s, b, block=info["block"])
    check(o.gemv_q8(x, q, s, b), ref, bound(x, deq) + 1e-5 * ref.abs())
    # ... and within the quantization error of the dequantized product: per block the
    # activations move by at most half a step, s_b / 2, so |err| <= Σ_k |w_k| s_b(k) / 2
    _, xs = quantize_rows(x)  # not the kernel's blocks: max|x| per row bounds every s_b
    step = (deq.double().abs().sum(1)[None, :] * xs.double()[:, None]) / 2
    err = (o.gemv_q8(x, q, s, None).double() - x.double() @ deq.double().T).abs()
    assert bool((err <= step * 1.001 + 1e-5).all())


def test_several_matrices_in_one_call_equal_one_by_one(ops):
    o, _ = ops
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 96, generator=g)
    ws = [torch.randn(n, 96, generator=g) for n in (40, 7, 7)]
    bs = [torch.randn(40, generator=g), None, torch.randn(7, generator=g)]
    for got, w, b in zip(o.gemv_many(x, ws, bs), ws, bs):
        torch.testing.assert_close(got, o.gemv(x, w, b), rtol=0, atol=0)  # same code, same order
    qs = [quantize_rows(w) for w in ws]
    for many, single in (("gemv_q8_many", "gemv_q8"), ("gemv_int8_many", "gemv_int8")):
        outs = getattr(o, many)(x, [q for q, _ in qs], [s for _, s in qs], bs)
        for got, (q, s), b in zip(outs, qs, bs):
            torch.testing.assert_close(got, getattr(o, single)(x, q, s, b), rtol=0, atol=0)


def test_leading_dims_bf16_activations_and_strided_weights(ops):
    o, _ = ops
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 3, 40, generator=g)
    w = torch.randn(40, 24, generator=g).T  # [24, 40] with rows not contiguous
    out = o.gemv(x, w, None)
    assert out.shape == (1, 3, 24)
    check(out.view(3, 24), x[0].double() @ w.double().T, bound(x[0], w))
    xb, wb, bias = x.bfloat16(), w.contiguous().bfloat16(), torch.randn(24).bfloat16()
    got = o.gemv(xb, wb, bias)  # fp32 products of the bf16 values, rounded once to bf16
    assert got.dtype == torch.bfloat16 and got.shape == (1, 3, 24)
    ref = (xb.double() @ wb.double().T + bias.double()).bfloat16()
    torch.testing.assert_close(got, ref, rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_bf16_activations_match_torch_and_each_row_alone(ops, M, K, N):
    """bf16 activations against bf16 weights (vdpbf16ps where the CPU has AVX512-BF16: groups
    of up to 4 rows, two accumulators a row, steps of 64 then 32 then a scalar tail): the fp32
    sums of the bf16 values within fp32 rounding, rounded once to bf16, and each row the bits
    it gets alone."""
    o, _ = ops
    g = torch.Generator().manual_seed(M * 1000 + K + N + 7)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = torch.randn(N, K, generator=g).bfloat16()
    got = o.gemv(x, w, None)
    assert got.dtype == torch.bfloat16
    ref = x.double() @ w.double().T
    err = (got.double() - ref).abs()
    assert bool((err <= bound(x.float(), w.float()) + 2 ** -8 * ref.abs()).all()), err.max()
    alone = torch.cat([o.gemv(x[i:i + 1], w, None) for i in range(M)])
    assert torch.equal(got, alone)


@pytest.mark.parametrize("K", [64, 96, 768, 801])
def test_bf16_rows_alone_keep_their_bits_where_the_order_shows(ops, K):
    """Each row's bits alone and in groups of 2 to 4, on sums whose fp32 rounding shows in
    bf16: terms over 2⁻¹⁰..2¹⁰ that cancel to a small rest, so a different order of the same
    additions moves the result by many bf16 steps (a row alone takes its own code path)."""
    o, _ = ops
    g = torch.Generator().manual_seed(K)
    half = K // 2
    scale = 2.0 ** torch.randint(-10, 11, (half,), generator=g)
    x = torch.randn(4, half, generator=g) * scale
    w = torch.randn(24, half, generator=g) * scale
    noise = torch.randn(24, K - half, generator=g) * 1e-3
    x = torch.cat([x, x, x[:, :K - 2 * half]], dim=1).bfloat16()
    w = (torch.cat([w, -w, w[:, :K - 2 * half]], dim=1) + torch.cat(
        [torch.zeros(24, half), noise], dim=1)).bfloat16()
    alone = torch.cat([o.gemv(x[i:i + 1], w, None) for i in range(4)])
    for m in (2, 3, 4):
        assert torch.equal(o.gemv(x[:m], w, None), alone[:m])
    # the data cancels: each sum is far below its terms' magnitude (float64, exact here)
    assert bool(((x.double() @ w.double().T).abs()
                 < 1e-3 * (x.double().abs() @ w.double().abs().T)).all())


@pytest.mark.parametrize("shape", [(1, 1, 768), (3, 5), (2, 1, 4, 64), (1, 1, 1)])
def test_rms_norm_matches_the_model_norm(ops, shape):
    o, _ = ops
    g = torch.Generator().manual_seed(len(shape))
    x, w = torch.randn(*shape, generator=g) * 3, torch.rand(shape[-1], generator=g) + 0.5
    torch.testing.assert_close(o.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5),
                               rtol=1e-6, atol=1e-6)
    xb, wb = x.bfloat16(), w.bfloat16()  # bf16: within one rounding of the torch formula
    torch.testing.assert_close(o.rms_norm(xb, wb, 1e-5), rms_norm(xb, wb, 1e-5),
                               rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("lens,H,K,D", [([5, 2], 4, 2, 16), ([3, 40, 1], 8, 2, 64),
                                         ([17], 12, 12, 64), ([1, 9, 130], 6, 3, 24)])
def test_paged_decode_matches_the_reference(ops, lens, H, K, D):
    o, _ = ops
    case = decode_case(lens, H, K, D, seed=len(lens))
    torch.testing.assert_close(o.paged_decode(*case, 0.3), paged_decode_ref(*case, 0.3),
                               rtol=1e-5, atol=1e-5)
    bf = [c.bfloat16() if c.is_floating_point() else c for c in case]
    torch.testing.assert_close(o.paged_decode(*bf, 0.3), paged_decode_ref(*bf, 0.3),
                               rtol=2 ** -7, atol=1e-2)


def test_the_engine_gets_the_kernels_here(monkeypatch):
    """A compiler and AVX2 are here: a build that fails must fail a test, not fall back
    (ASTRAI_CPU_ISA / ASTRAI_CPU_KERNELS of the run set aside: this is about the build)."""
    monkeypatch.delenv("ASTRAI_CPU_ISA", raising=False)
    monkeypatch.delenv("ASTRAI_CPU_KERNELS", raising=False)
    k = cpu_linear.cpu_decode_kernels()
    assert k is not None and k.name.startswith(BEST)


@pytest.mark.parametrize("op", ["gemv", "gemv_int8", "gemv_q8", "gemv_q4"])
def test_a_rows_result_is_bit_identical_alone_and_batched(ops, op):
    """Each row's sums are taken in one order whatever its group (float tiles of 1..8 rows,
    int8 and int4 tiles of 1..4 rows against 1 or 2 weight rows, a prefill's blocks of 64
    rows) and int8 activations are quantized per row: a row batched with rows 10⁶ times
    larger or smaller, in any position, gets the bits it gets alone. The AVX-512 builds'
    int8 × int8 (VNNI) and int4 products of more than 16 rows (a prefill) put the rows in the
    vector lanes, in an order of their own: there a row gets the bits it gets in any other
    batch of more than 16 rows."""
    o, info = ops
    g = torch.Generator().manual_seed(11)
    M, K = 80, 320 if op == "gemv_q4" else 300  # past one block of 64 rows; K off the blocks
    x = torch.randn(M, K, generator=g) * torch.logspace(-3, 3, M)[:, None]  # (M, K)
    w, b = torch.randn(37, K, generator=g), torch.randn(37, generator=g)
    args = ((w, b) if op == "gemv" else (*quantize_groups(w), b) if op == "gemv_q4"
            else (*quantize_rows(w), b))
    f, many = getattr(o, op), getattr(o, op + "_many")
    alone = torch.cat([f(x[i:i + 1], *args) for i in range(M)])  # (M, 37)
    lanes = info["vector"] == 16 and (op == "gemv_q4" or op == "gemv_q8" and info["vnni"])
    many_rows = f(x, *args) if lanes else alone  # how a row comes out of a prefill
    for rows in (slice(0, 2), slice(0, 5), slice(3, 12), slice(0, 16), slice(0, 17),
                 slice(None)):
        ref = many_rows if len(range(M)[rows]) > 16 else alone
        assert torch.equal(f(x[rows], *args), ref[rows])
    flip = torch.arange(M - 1, -1, -1)
    assert torch.equal(f(x[flip], *args), many_rows[flip])
    assert torch.equal(many(x[3:70], *([a] for a in args))[0], many_rows[3:70])  # one matrix
    assert torch.allclose(many_rows, alone, rtol=1e-5, atol=1e-5 * alone.abs().max().item())


def test_first_argmax_is_torchs_first_maximum(ops):
    """The greedy pick of the kernels: each row's first maximal index, as torch's
    max(dim=-1) gives it — ties to the first (across the kernel's lanes too), a NaN counted
    as the maximum, -inf rows, -0.0 before 0.0, the maximum in the tail past the last full
    turn, and rows no multiple of a vector long."""
    o, _ = ops
    g = torch.Generator().manual_seed(5)
    for V in (1, 7, 8, 33, 64, 100, 32000):
        x = torch.randn(9, V, generator=g)
        x[6] = 0.0
        x[6, 0] = -0.0
        x[7, -1] = 10.0  # past the last turn of 32 where V is no multiple of it
        x[8] = x[8].abs().clamp(max=0.5)
        x[8, V - 1 - (V - 1) % 8] = 0.75  # one maximum late in a lane ...
        x[8, V // 2] = 0.75  # ... and the first one earlier in another
        x[1] = x[1].round()  # many ties
        x[2] = float("-inf")
        x[3, V // 2] = float("nan")
        x[4, -1] = float("nan")
        x[4, V // 3] = float("nan")
        x[5] = 0.0
        got = o.first_argmax(x)
        assert got.dtype == torch.long
        assert torch.equal(got, x.max(dim=-1).indices), V
    assert torch.equal(o.first_argmax(x[:, ::2]), x[:, ::2].max(dim=-1).indices)  # strided
    with pytest.raises(RuntimeError, match="fp32 CPU tensor"):
        o.first_argmax(x.double())


def test_ops_trace_through_their_fake_implementations(ops):
    o, _ = ops
    x, w = torch.randn(2, 32), torch.randn(16, 32)
    q, s = quantize_rows(w)
    torch.library.opcheck(o.gemv.default, (x, w, None), test_utils=("test_faketensor",))
    torch.library.opcheck(o.gemv_q8_many.default, (x, [q, q[:3]], [s, s[:3]], [None, None]),
                          test_utils=("test_faketensor",))
    torch.library.opcheck(o.rms_norm.default, (x, x[0], 1e-5), test_utils=("test_faketensor",))
    case = decode_case([3, 8], 4, 2, 16)
    torch.library.opcheck(o.paged_decode.default, (*case, 0.25), test_utils=("test_faketensor",))


def counting(k: fast_path.DecodeKernels, calls: list) -> fast_path.DecodeKernels:
    def wrap(f):
        def g(*a):
            calls.append(a[0].shape)
            return f(*a)
        return g
    return dataclasses.replace(k, float_gemv=wrap(k.float_gemv), int8_gemv=wrap(k.int8_gemv),
                               float_many=wrap(k.float_many), int8_many=wrap(k.int8_many),
                               fp32_rows=(1, 16))


def test_a_model_with_the_kernels_active_compiles_to_one_graph():
    """torch.compile (fullgraph) traces a forward whose products, norms and int8 layers go to
    the kernels (their fake implementations), and the compiled forward computes the same."""
    from astrai.model import build_model, get_preset
    from astrai.model.quant import quantize_model

    k = dataclasses.replace(cpu_linear.decode_kernels(BEST), fp32_rows=(1, 16))
    cfg = get_preset("tiny", vocab_size=128, dim=64, n_layers=1, n_heads=4, n_kv_heads=2,
                     ffn_dim=96, max_seq_len=32)
    model = build_model(cfg, seed=0).eval()
    ids = torch.randint(0, 128, (1, 3), generator=torch.Generator().manual_seed(0))
    for m in (model, quantize_model(build_model(cfg, seed=0).eval(), "int8")):
        with torch.no_grad():
            ref = m(ids, ForwardContext(kernels=k)).logits
            compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
            out = compiled(ids, ForwardContext(kernels=k)).logits
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_dispatch_takes_few_rows_without_grad_and_leaves_the_rest_to_torch():
    k = cpu_linear.decode_kernels(BEST)
    calls: list = []
    lin, other = nn.Linear(32, 8), nn.Linear(32, 8)
    q = Int8Linear.from_linear(nn.Linear(32, 8))
    x = torch.randn(1, 2, 32)
    kc = counting(k, calls)
    with torch.no_grad():
        a = fast_path.linear(x, lin.weight, lin.bias, kc)
        many = fast_path.project_many(x, (lin, other), kc)
        q8 = q(x, kc)
        assert fast_path.project_many(x, (lin, q), kc) is None  # mixed kinds: one by one
        fast_path.linear(torch.randn(17, 32), lin.weight, None, kc)  # 17 rows: prefill, torch
        fast_path.linear(x.double(), lin.weight.double(), None, kc)  # fp64: torch
        fast_path.linear(x, lin.weight, lin.bias)  # no kernels given: torch
    grad = fast_path.linear(x, lin.weight, lin.bias, kc)  # training: torch (autograd)
    assert calls == [(1, 2, 32)] * 3
    calls.clear()
    with torch.no_grad():
        kc = dataclasses.replace(counting(k, calls), fp32_rows=(2, 16))
        fast_path.linear(x[:, :1], lin.weight, None, kc)  # one row below the fp32 range: torch
        fast_path.linear(x, lin.weight, None, kc)
    assert calls == [(1, 2, 32)]
    assert grad.requires_grad
    ref = x @ lin.weight.T + lin.bias
    torch.testing.assert_close(a, ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(many[1], (x @ other.weight.T + other.bias).detach(),
                               rtol=1e-5, atol=1e-5)
    assert q8.shape == (1, 2, 8)


def test_no_kernels_where_they_cannot_be_had(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "_built", {})  # the cached set comes back after
    monkeypatch.setenv("ASTRAI_CPU_KERNELS", "0")
    assert cpu_linear.cpu_decode_kernels() is None
    monkeypatch.setenv("ASTRAI_CPU_KERNELS", "1")
    monkeypatch.setenv("ASTRAI_CPU_ISA", "none")
    with caplog.at_level("DEBUG", logger="astrai.kernels"):
        assert cpu_linear.cpu_decode_kernels() is None
    assert "torch serves decode" in caplog.text
    monkeypatch.setenv("ASTRAI_CPU_ISA", "avx2")

    def fail(isa):
        raise cpu_build.CpuKernelUnavailable("no C++ compiler (set CXX or install g++)")

    monkeypatch.setattr(cpu_build, "load_first", fail)
    assert cpu_linear.cpu_decode_kernels() is None
    monkeypatch.setenv("ASTRAI_CPU_ISA", "sse2")
    with pytest.raises(cpu_build.CpuKernelUnavailable, match="use one of avx512, avx2"):
        cpu_build.requested_isa()


def test_status_names_the_code_path_and_the_library(monkeypatch):
    monkeypatch.delenv("ASTRAI_CPU_ISA", raising=False)  # the CPU's own path, then none
    st = cpu_build.cpu_status(build=True)
    assert st["isa"] == BEST and st["built"] and st["reason"] is None
    assert st["library"].endswith(f"{cpu_build.lib_name(BEST)}.so")
    monkeypatch.setenv("ASTRAI_CPU_ISA", "none")
    assert "torch serves decode" in cpu_build.cpu_status()["reason"]


def test_a_build_uses_vnni_where_it_was_made_for_it(ops, request):
    isa = request.node.callspec.params["ops"]
    made_for = cpu_build.cpu_flags() - FLAGS_OFF
    assert ops[1]["vnni"] == int(isa == "avx512" and "avx512_vnni" in made_for)


def test_isa_and_flags_follow_the_cpu_flags():
    avx512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"})
    assert cpu_build.best_isa(avx512) == "avx512"
    assert cpu_build.best_isa(frozenset({"avx2", "fma"})) == "avx2"
    assert cpu_build.best_isa(frozenset({"sse4_2"})) is None
    assert "-mavx512vnni" in cpu_build.compile_flags("avx512", avx512 | {"avx512_vnni"})
    assert "-mavx512vnni" not in cpu_build.compile_flags("avx512", avx512)
    assert "-O3" in cpu_build.compile_flags("avx2", frozenset())


def test_int4_tiles_on_every_build(ops):
    """Every build takes int4 weights in tiles (astrai/model/quant4.py tile_rows) as it takes
    rows, within float summation order, each row's bits those it gets alone — past 16 rows
    too on AVX2, whose prefill runs a decode row's arithmetic (AVX-512 puts a prefill's rows in
    the vector lanes); a scale of the wrong dtype is refused in one line."""
    from astrai.model.quant4 import quantize_groups, tile_rows

    ops, info = ops
    assert info["int4_tile"] == 16
    g = torch.Generator().manual_seed(6)
    for n, k in ((32, 96), (48, 160), (16, 2304)):
        packed, d = quantize_groups(torch.randn(n, k, generator=g))
        tiles, scales = tile_rows(packed, d)
        bias = torch.randn(n, generator=g)
        for m in (1, 3, 5, 20):
            x = torch.randn(m, k, generator=g)
            got = ops.gemv_q4_many(x, [tiles], [scales], [bias])[0]
            ref = ops.gemv_q4_many(x, [packed], [d], [bias])[0]
            check(got, ref, 1e-5 * ref.abs().max() + 1e-4)
            alone = torch.cat([ops.gemv_q4_many(x[i:i + 1], [tiles], [scales], [bias])[0]
                               for i in range(m)])
            assert (m > 16 and info["vector"] == 16) or torch.equal(got, alone), (n, k, m)
    with pytest.raises(RuntimeError, match="must be contiguous fp16"):
        ops.gemv_q4_many(x, [tiles], [scales.float()], [None])


@pytest.mark.slow
@pytest.mark.skipif(BEST != "avx512" or bool(FLAGS_OFF) or not cpu_build.cpu_flags()
                    & {"avx512_vnni", "avx512_bf16"},
                    reason="an AVX-512 CPU with VNNI or BF16: its builds use them, so the "
                    "paths without (a Skylake server's) are run here as their own build")
def test_the_avx512_paths_without_vnni_and_bf16():
    """The AVX-512 build made as for a CPU without VNNI and BF16 (int8 / int4 dots by
    maddubs, bf16 by conversion) passes this module's kernel tests, in a process of its own
    (both builds name one op namespace)."""
    import subprocess
    import sys
    from pathlib import Path

    off = ("avx512_vnni", "avx512_bf16")
    made_for = cpu_build.cpu_flags() - set(off)
    if (os.environ.get("ASTRAI_BUILD_KERNELS", "1") == "0"
            and not cpu_build.library_path("avx512", made_for).is_file()):
        pytest.skip("ASTRAI_BUILD_KERNELS=0 and no such build cached")
    env = {**os.environ, "ASTRAI_TEST_CPU_FLAGS_OFF": ",".join(off)}
    env.pop("ASTRAI_CPU_ISA", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p",
                        "no:cacheprovider", "-k", "avx512", __file__],
                       cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.parametrize("wide", [False, True], ids=["pieces of tiles", "pieces of rows"])
@pytest.mark.parametrize("wfmt", ["fp32", "bf16", "int8 weights", "int8", "int4"])
def test_decode_products_read_as_several_streams_give_the_same_bits(ops, wfmt, wide):
    """A decode product reads each thread's piece as 1 to 8 streams of tiles (set_streams;
    Intel: 8, as many as a product's accumulators allow) — of rows where a piece holds fewer
    tiles than streams (`wide`: K ~1K, 16 pieces of 1-2 tiles; int4 tiles stay whole): each
    row's arithmetic is the one-row sequence, so every count gives the same bits, for every
    decode row count and matrices of uneven tile counts (a last tile short of 16 rows, a K
    off the vector length), float weights the bits of a 6-row batch (which reads one tile at
    a time), and the results are right."""
    from astrai.model.quant4 import quantize_groups, tile_rows

    o, info = ops
    g = torch.Generator().manual_seed(9)
    K = (1056 if wide else 96) if wfmt == "int4" else (1040 if wide else 200)
    shapes = (16 * 23, 16 * 6, 16 * 9) if wfmt == "int4" else (16 * 23 + 5, 16 * 6, 7)
    ws = [torch.randn(n, K, generator=g) for n in shapes]
    biases = [torch.randn(n, generator=g) for n in shapes]
    if wfmt == "int4":
        mats = [quantize_groups(w) for w in ws]
        tiled = [tile_rows(q, d) for q, d in mats]

        def product(x):
            return o.gemv_q4_many(x, [t for t, _ in tiled], [s for _, s in tiled], biases)

        def reference(x):  # the row layout, checked against references above
            return o.gemv_q4_many(x, [q for q, _ in mats], [d for _, d in mats], biases)
    elif wfmt == "int8":
        mats = [quantize_rows(w) for w in ws]

        def product(x):
            return o.gemv_q8_many(x, [q for q, _ in mats], [s for _, s in mats], biases)

        def reference(x):
            return [x @ dequantize_rows(q, s).T + b for (q, s), b in zip(mats, biases)]
    elif wfmt == "int8 weights":  # fp32 activations against int8 weights (gemv_int8)
        mats = [quantize_rows(w) for w in ws]

        def product(x):
            return o.gemv_int8_many(x, [q for q, _ in mats], [s for _, s in mats], biases)

        def reference(x):
            return [(x.double() @ dequantize_rows(q, s).double().T + b).float()
                    for (q, s), b in zip(mats, biases)]
    else:
        wt = [w.bfloat16() if wfmt == "bf16" else w for w in ws]

        def product(x):
            return o.gemv_many(x, wt, biases)

        def reference(x):
            return [(x.double() @ w.double().T + b).float() for w, b in zip(wt, biases)]
    x6 = torch.randn(6, K, generator=g)
    six = product(x6)
    for m in (1, 2, 3, 4):
        x = x6[:m]
        outs = []
        try:
            for n in (1, 2, 3, 4, 5, 8):
                assert o.set_streams(n) == n
                outs.append(product(x))
        finally:
            o.set_streams(0)
        for got in outs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(got, outs[0])), m
        if wfmt in ("fp32", "bf16", "int8 weights"):
            assert all(torch.equal(a, b[:m]) for a, b in zip(outs[0], six)), m
        for ref, got, w in zip(reference(x), outs[-1], ws):
            if wfmt == "int4":
                check(got, ref, 1e-5 * ref.abs().max() + 1e-4)
            elif wfmt == "int8":
                check(got, ref, 2e-2 * ref.abs().max())
            else:
                check(got, ref, bound(x, w.float()) + 1e-5)
    with pytest.raises(RuntimeError, match="0 to 8"):
        o.set_streams(9)


@pytest.mark.parametrize("wfmt", ["fp32", "int8", "int4"])
def test_tile_counts_that_leave_pieces_short_are_whole(ops, wfmt):
    """A decode product of 33 or 50 tiles with K = 2048 (a tile a piece at least): 16 pieces
    of 3 or 4 tiles would leave the last ones empty; every piece holds work, every row is
    computed (the stream reader once divided by an empty piece's run count)."""
    from astrai.model.quant4 import dequantize_groups, quantize_groups, tile_rows

    o, _ = ops
    g = torch.Generator().manual_seed(11)
    K = 2048
    for n in (16 * 33, 16 * 50):
        w = torch.randn(n, K, generator=g)
        x = torch.randn(1, K, generator=g)
        if wfmt == "fp32":
            got, wd = o.gemv_many(x, [w], [None])[0], w
        elif wfmt == "int8":
            q, s = quantize_rows(w)
            got, wd = o.gemv_q8_many(x, [q], [s], [None])[0], dequantize_rows(q, s)
        else:
            q, d = quantize_groups(w)
            t, s16 = tile_rows(q, d)
            got, wd = o.gemv_q4_many(x, [t], [s16], [None])[0], dequantize_groups(q, d)
        ref = x.double() @ wd.double().T
        tol = bound(x, wd) + 1e-5 if wfmt == "fp32" else 2e-2 * ref.abs().max()
        check(got, ref.float(), tol)
