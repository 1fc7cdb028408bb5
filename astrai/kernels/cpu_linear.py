"""astrai's CPU decode GEMVs (csrc/cpu/decode_gemv.cpp) as the model's few-row products.

    kernels = cpu_decode_kernels()      # built (or reused) for this CPU; None: torch only
    logits = model(ids, ForwardContext(..., kernels=kernels))   # what an engine's step does

`cpu_decode_kernels()` builds the variant this CPU runs (astrai/kernels/cpu_build.py) and
wraps its ops for astrai/model/fast_path.py, through which every linear layer of the
blocks, the int8 layers and the engine's LM head go: in a pass that carries them, a product of at
most 16 rows on a CPU (a decode step) runs the kernel, and everything else torch; with fp32
weights one row goes to the kernel unless a calibration the user ran (`astrai kernels
--calibrate`) or ASTRAI_FP32_ONE_ROW says torch's GEMV (astrai/kernels/cpu_choice.py:
nothing is timed at start-up).
On a CPU without AVX2+FMA or with ASTRAI_CPU_KERNELS=0 it returns None (one debug line);
a build that fails is retried one tier down (AVX-512 without its extensions, then AVX2), and
when a tier fails, or none builds (no compiler), one warning on the `astrai.kernels` logger
says why; with None torch serves every product.

int8 weights: `int8_act="int8"` (the default) quantizes the activations to int8 per row and
block of 128 (absmax) and takes int32 dots, as llama.cpp's q8_0 × q8_0 does and as torch's
path of astrai/model/quant.py does for the products the kernel does not take (more rows), so
an int8 model computes one function on every CPU and for every batch (VNNI `vpdpbusd`, else
AVX2's `maddubs`); `"fp32"` keeps them fp32 (the int8 weights converted in registers, exact
to the dequantized model), and torch's path then keeps them fp32 too. Each op has a fake implementation, so torch.compile traces a
model that calls them.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from astrai.kernels import cpu_build
from astrai.kernels.cpu_choice import calibrate, one_row_fp32
from astrai.model import fast_path

log = logging.getLogger("astrai.kernels")

MAX_ROWS = {"fp32": 16, "bf16": 8, "int8": 16}
"""Most rows the kernel takes per weight format; above, torch's GEMM is as fast (bf16: from
16 rows oneDNN's AMX GEMM is faster where the CPU has AMX; figures in docs/engine.md)."""
ALL_ROWS = 1 << 62
"""The int8 × int8 and int4 products take any number of rows (a prefill too). The AVX2
build's register tiles and row blocks beat torch's exact block dots 1.5-2x at 512 rows, and
its int4 group pairs torch's GEMM on the dequantized weights at 64 and 512 rows; the AVX-512
builds put a prefill's activation rows in the vector lanes (figures in docs/kernels.md)."""


@functools.cache  # once per namespace: two tiers of one path share it
def _register_fakes(ns: str) -> None:
    def out_rows(w):  # int4 in tiles: [N/16, K/32, 256]
        return w.shape[0] * w.shape[2] // 16 if w.dim() == 3 else w.shape[0]

    def fake(x, w, *rest):
        return x.new_empty(*x.shape[:-1], out_rows(w))

    def fake_many(x, ws, *rest):
        return [x.new_empty(*x.shape[:-1], out_rows(w)) for w in ws]

    for op in ("gemv", "gemv_int8", "gemv_q8", "gemv_q4"):
        torch.library.register_fake(f"{ns}::{op}", fake)
        torch.library.register_fake(f"{ns}::{op}_many", fake_many)
    torch.library.register_fake(f"{ns}::rms_norm", lambda x, w, eps: torch.empty_like(x))
    torch.library.register_fake(f"{ns}::paged_decode", lambda q, *rest: torch.empty_like(q))
    torch.library.register_fake(f"{ns}::first_argmax",
                                lambda x: x.new_empty(x.shape[0], dtype=torch.long))
    torch.library.register_fake(f"{ns}::dequant_q4",
                                lambda q, d: d.new_empty(q.shape[0], q.shape[1] * 2))


@functools.cache
def load_ops(isa: str, flags: frozenset[str] | None = None) -> tuple[object, dict[str, int]]:
    """(op namespace, {"vector": floats per vector, "vnni": 0/1, "block": QK, "bf16_dot":
    0/1, "int4_tile": rows of an int4 tile, 0: none}) of the built `isa` variant (its -m
    flags following `flags`, default this CPU's), fakes registered. Raises
    cpu_build.CpuKernelUnavailable."""
    ops = cpu_build.load(isa, flags)
    _register_fakes(f"astrai_cpu_{isa}")
    vector, vnni, block, bf16, tile = ops.info()
    return ops, {"vector": vector, "vnni": vnni, "block": block, "bf16_dot": bf16,
                 "int4_tile": tile}


def decode_kernels(isa: str, int8_act: str | None = None,
                   flags: frozenset[str] | None = None) -> fast_path.DecodeKernels:
    """The DecodeKernels of the `isa` build (`flags`: load_ops'); `int8_act` "int8" (None)
    | "fp32": the int8 products' activations (the module docstring)."""
    ops, info = load_ops(isa, flags)
    if int8_act is None:
        int8_act = "int8"
    if int8_act not in ("int8", "fp32"):
        raise ValueError(f"int8_act {int8_act!r}: use int8 or fp32")
    quantized = int8_act == "int8"
    vnni = " vnni" if info["vnni"] and quantized else ""
    vnni += ", bf16 dots" if info["bf16_dot"] else ""
    fp32_min = 2 if one_row_fp32(cpu_build.build_dir(isa, flags)).server == "torch" else 1
    return fast_path.DecodeKernels(
        name=f"{isa}, int8 x {int8_act}{vnni}" + (", fp32 row 1 on torch" if fp32_min > 1 else ""),
        float_gemv=ops.gemv, int8_gemv=ops.gemv_q8 if quantized else ops.gemv_int8,
        float_many=ops.gemv_many, int8_many=ops.gemv_q8_many if quantized else ops.gemv_int8_many,
        fp32_rows=(fp32_min, MAX_ROWS["fp32"]), bf16_rows=(1, MAX_ROWS["bf16"]),
        int8_rows=(1, ALL_ROWS if quantized else MAX_ROWS["int8"]),
        int4_many=ops.gemv_q4_many, int4_rows=(1, ALL_ROWS), int4_tile=info["int4_tile"],
        rms_norm=ops.rms_norm, paged_decode=ops.paged_decode,
        decode_plan=getattr(torch.classes, ops.name).DecodePlan,
        decode_layers=ops.decode_layers, layer_slots=tuple(ops.slot_names()),
        first_argmax=ops.first_argmax, int4_dequant=ops.dequant_q4,
        int8_quantized=quantized)


_built: dict[tuple, fast_path.DecodeKernels | None] = {}


def calibrate_one_row() -> dict:
    """Time one fp32 row on this machine's kernel build and on torch, and cache the winner
    beside the build (astrai/kernels/cpu_choice.py; kernels made from now on follow it).
    Raises cpu_build.CpuKernelUnavailable where there is no build to calibrate."""
    isa = cpu_build.requested_isa()
    if isa is None:
        raise cpu_build.CpuKernelUnavailable("no CPU decode kernels here (no AVX2+FMA, or "
                                             "ASTRAI_CPU_ISA=none): nothing to calibrate")
    tier, flags, _ = cpu_build.load_first(isa)
    ops, _ = load_ops(tier, flags)
    cal = calibrate(ops.gemv, cpu_build.build_dir(tier, flags))
    _built.clear()
    return cal


def cpu_decode_kernels(int8_act: str | None = None) -> fast_path.DecodeKernels | None:
    """The CPU decode kernels of this machine (built at first use, then cached), or None
    where they cannot be had (the module docstring says what is logged); a forward pass
    uses them when its ForwardContext carries them (`kernels=`)."""
    if os.environ.get("ASTRAI_CPU_KERNELS", "1") == "0":
        log.debug("CPU decode kernels off (ASTRAI_CPU_KERNELS=0); torch serves decode")
        return None
    key = (os.environ.get("ASTRAI_CPU_ISA", ""), os.environ.get("ASTRAI_FP32_ONE_ROW", ""),
           int8_act)
    if key not in _built:
        _built[key] = _try_build(int8_act)
    return _built[key]


def _try_build(int8_act: str | None) -> fast_path.DecodeKernels | None:
    """The kernels of the best tier that builds; a warning (shown by the CLI) when a tier
    failed, once per process, since decode then runs slower than it could."""
    try:
        isa = cpu_build.requested_isa()
    except cpu_build.CpuKernelUnavailable as e:
        log.warning("CPU decode kernels unavailable, torch serves decode: %s", e)
        return None
    if isa is None:
        log.debug("CPU decode kernels unavailable, torch serves decode: this CPU has no "
                  "AVX2+FMA (or ASTRAI_CPU_ISA=none)")
        return None
    try:
        tier, flags, failures = cpu_build.load_first(isa)
        kernels = decode_kernels(tier, int8_act, flags)
    except cpu_build.CpuKernelUnavailable as e:
        quiet = os.environ.get("ASTRAI_BUILD_KERNELS", "1") == "0"  # asked not to build
        (log.debug if quiet else log.warning)(
            "CPU decode kernels unavailable, torch serves decode (slower): %s", e)
        return None
    if failures:
        log.warning("CPU decode kernels: %s; using %s instead", "; ".join(failures),
                    cpu_build.lib_name(tier, flags))
    return kernels
