"""astrai's CUDA kernels against their peers, measured in one run on one GPU.

    python benchmarks/cuda_kernels.py [--quick] [--json OUT.json]

* decode attention: achieved GB/s (K/V bytes read) against the card's measured copy
  bandwidth, and time ratios against the torch reference, torch SDPA on K/V gathered through
  the page table (gather included: what a torch-native engine pays) and SDPA alone on
  pre-gathered K/V (a dense lower bound), and flash-attn's paged kernel when importable;
* prefill attention: TFLOP/s (causal FLOPs actually needed) against SDPA per request on
  gathered K/V, and flash-attn varlen when importable;
* rotary: GB/s against the model's torch `apply_rope` (out of place, then copied back).

A ratio > 1 means astrai is faster. Times are medians of CUDA-event timings after warm-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F


def timeit(fn, warmup: int = 5, reps: int = 30) -> float:
    """Median milliseconds of fn() over reps, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy GB/s (bytes read + written) on 2 GiB."""
    x = torch.empty(1 << 30, dtype=torch.float16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = timeit(lambda: y.copy_(x), 3, 10)
    return 2 * x.numel() * 2 / ms / 1e6


def _decode_problem(B, L, H, K, D, dtype):
    S = B * L + 64
    k_buf = torch.randn(S, K, D, device="cuda", dtype=dtype)
    v_buf = torch.randn(S, K, D, device="cuda", dtype=dtype)
    r2t = torch.randperm(S, device="cuda")[: B * L].view(B, L).to(torch.int32)
    rows = torch.arange(B, device="cuda")
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    q = torch.randn(B, H, D, device="cuda", dtype=dtype)
    return q, k_buf, v_buf, r2t, rows, lens


DECODE_HEAD = (f"{'B':>4} {'L':>6} {'H/K':>6} {'D':>4} | {'astrai ms':>9} {'GB/s':>6} "
               f"{'%copy':>6} | {'x ref':>6} {'x gather+sdpa':>13} {'x sdpa only':>11} "
               f"{'x flash':>8}")


def decode_one(B, L, H, K, D, dtype, copy_gbs, flash) -> dict:
    from astrai.kernels import paged_decode
    from astrai.kernels.reference import paged_decode_ref

    q, kb, vb, r2t, rows, lens = _decode_problem(B, L, H, K, D, dtype)
    scale = D ** -0.5
    ours = timeit(lambda: paged_decode(q, kb, vb, r2t, rows, lens, scale))
    ref = timeit(lambda: paged_decode_ref(q, kb, vb, r2t, rows, lens, scale), 2, 5)
    slots = r2t.long()

    def gather_sdpa():
        k = kb[slots].transpose(1, 2)  # (B, K, L, D)
        v = vb[slots].transpose(1, 2)
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=H != K)

    gs = timeit(gather_sdpa)
    kg = kb[slots].transpose(1, 2).contiguous()  # (B, K, L, D)
    vg = vb[slots].transpose(1, 2).contiguous()
    so = timeit(lambda: F.scaled_dot_product_attention(q.unsqueeze(2), kg, vg, enable_gqa=H != K))
    fl = math.nan
    if flash is not None:
        kc, vc = kb[slots], vb[slots]  # (B, L, K, D): flash-attn's own contiguous cache layout
        fl = timeit(lambda: flash.flash_attn_with_kvcache(q.unsqueeze(1), kc, vc,
                                                           cache_seqlens=lens))
    gbs = 2 * B * L * K * D * q.element_size() / 1e9 / (ours / 1e3)
    return {"B": B, "L": L, "H": H, "K": K, "D": D, "dtype": str(dtype), "ms": ours,
            "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs, "x_ref": ref / ours,
            "x_gather_sdpa": gs / ours, "x_sdpa_only": so / ours, "x_flash": fl / ours}


def bench_decode(configs, dtype, copy_gbs, results):
    flash = _flash()
    print(f"\ndecode attention ({dtype}); copy bandwidth {copy_gbs:.0f} GB/s")
    print(DECODE_HEAD)
    for B, L, H, K, D in configs:
        r = decode_one(B, L, H, K, D, dtype, copy_gbs, flash)
        results["decode"].append(r)
        print(f"{B:>4} {L:>6} {H:>3}/{K:<2} {D:>4} | {r['ms']:>9.3f} {r['gbs']:>6.0f} "
              f"{r['pct_copy']:>5.0f}% | {r['x_ref']:>6.1f} {r['x_gather_sdpa']:>13.2f} "
              f"{r['x_sdpa_only']:>11.2f} {r['x_flash']:>8.2f}")


def prefill_one(B, ql, kvl, H, K, D, dtype, flash) -> dict:
    from astrai.kernels import paged_prefill
    from astrai.kernels.reference import paged_prefill_ref

    nnz = B * kvl
    kb = torch.randn(nnz + 64, K, D, device="cuda", dtype=dtype)
    vb = torch.randn(nnz + 64, K, D, device="cuda", dtype=dtype)
    kvi = torch.randperm(nnz + 64, device="cuda")[:nnz].to(torch.int32)
    qo = torch.arange(B + 1, device="cuda", dtype=torch.int32) * ql
    kvp = torch.arange(B + 1, device="cuda", dtype=torch.int32) * kvl
    q = torch.randn(B * ql, H, D, device="cuda", dtype=dtype)
    scale = D ** -0.5
    ours = timeit(lambda: paged_prefill(q, kb, vb, qo, kvp, kvi, scale, True))
    from astrai.kernels.library import get_library, launch_paged_prefill

    lib = get_library()
    variants = {v: timeit(lambda v=v: launch_paged_prefill(lib, q, kb, vb, qo, kvp, kvi, scale,
                                                           True, v))
                for v in ("wmma", "mma")}
    ref = timeit(lambda: paged_prefill_ref(q, kb, vb, qo, kvp, kvi, scale, True), 1, 3)
    prefix = kvl - ql
    mask = (torch.arange(kvl, device="cuda")[None, :]
            <= torch.arange(ql, device="cuda")[:, None] + prefix)

    def sdpa():
        outs = []
        for b in range(B):  # per request, as the torch-native backend does
            s = kvi[b * kvl:(b + 1) * kvl].long()
            qb = q[b * ql:(b + 1) * ql].transpose(0, 1)
            kk, vv = kb[s].transpose(0, 1), vb[s].transpose(0, 1)
            outs.append(F.scaled_dot_product_attention(
                qb, kk, vv, attn_mask=None if prefix == 0 else mask, is_causal=prefix == 0,
                enable_gqa=H != K))
        return outs

    sd = timeit(sdpa)
    fl = math.nan
    if flash is not None:
        kk, vv = kb[kvi.long()], vb[kvi.long()]
        fl = timeit(lambda: flash.flash_attn_varlen_func(
            q, kk, vv, cu_seqlens_q=qo, cu_seqlens_k=kvp, max_seqlen_q=ql, max_seqlen_k=kvl,
            causal=True))
    visible = B * sum(prefix + i + 1 for i in range(ql))  # (query, key) pairs computed
    flops = 4 * visible * H * D
    return {"B": B, "q": ql, "kv": kvl, "H": H, "K": K, "D": D, "dtype": str(dtype), "ms": ours,
            "tflops": flops / (ours / 1e3) / 1e12, "sdpa_tflops": flops / (sd / 1e3) / 1e12,
            "x_sdpa": sd / ours, "x_ref": ref / ours, "x_flash": fl / ours,
            "variant_tflops": {v: flops / (ms / 1e3) / 1e12 for v, ms in variants.items()}}


def bench_prefill(configs, dtype, results):
    flash = _flash()
    from astrai.kernels.library import prefill_variant

    print(f"\nprefill attention ({dtype}), causal; default kernel {prefill_variant()!r}")
    print(f"{'B':>3} {'q':>5} {'kv':>6} {'H/K':>6} {'D':>4} | {'astrai ms':>9} {'TFLOP/s':>8} | "
          f"{'sdpa TF/s':>9} {'x sdpa':>7} {'x ref':>6} {'x flash':>8} | {'wmma TF/s':>9} "
          f"{'mma TF/s':>8}")
    for B, ql, kvl, H, K, D in configs:
        r = prefill_one(B, ql, kvl, H, K, D, dtype, flash)
        results["prefill"].append(r)
        print(f"{B:>3} {ql:>5} {kvl:>6} {H:>3}/{K:<2} {D:>4} | {r['ms']:>9.3f} "
              f"{r['tflops']:>8.1f} | {r['sdpa_tflops']:>9.1f} {r['x_sdpa']:>7.2f} "
              f"{r['x_ref']:>6.1f} {r['x_flash']:>8.2f} | {r['variant_tflops']['wmma']:>9.1f} "
              f"{r['variant_tflops']['mma']:>8.1f}")


def rotary_one(N, heads, D, dtype) -> dict:
    from astrai.kernels import rotary_
    from astrai.model.rope import apply_rope, rope_table

    cos, sin = (t.cuda() for t in rope_table(D, 8192, 10000.0))
    x = torch.randn(N, heads, D, device="cuda", dtype=dtype)
    pos = torch.randint(0, 8192, (N,), device="cuda")
    ours = timeit(lambda: rotary_(x, pos, cos, sin))

    def torch_rope():
        x.copy_(apply_rope(x.unsqueeze(0), cos[pos][None], sin[pos][None])[0])

    tr = timeit(torch_rope)
    gbs = 2 * x.numel() * x.element_size() / (ours / 1e3) / 1e9
    return {"N": N, "heads": heads, "D": D, "dtype": str(dtype), "ms": ours, "gbs": gbs,
            "torch_ms": tr, "x_torch": tr / ours}


def bench_rotary(configs, dtype, results):
    print(f"\nrotary in place ({dtype})")
    print(f"{'N':>6} {'heads':>5} {'D':>4} | {'astrai ms':>9} {'GB/s':>6} | {'torch ms':>8} "
          f"{'x torch':>7}")
    for N, heads, D in configs:
        r = rotary_one(N, heads, D, dtype)
        results["rotary"].append(r)
        print(f"{N:>6} {heads:>5} {D:>4} | {r['ms']:>9.4f} {r['gbs']:>6.0f} | "
              f"{r['torch_ms']:>8.4f} {r['x_torch']:>7.2f}")


def _flash():
    if importlib.util.find_spec("flash_attn") is None:
        return None
    import flash_attn

    return flash_attn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/cuda_kernels.py needs a CUDA GPU; nothing measured.")
        return 0
    from astrai.kernels.library import get_library

    get_library()  # build (or load) before timing
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "flash_attn": _flash() is not None, "decode": [], "prefill": [], "rotary": []}
    copy_gbs = copy_bandwidth()
    results["copy_gbs"] = copy_gbs
    decode = [(1, 32768, 32, 8, 128), (8, 4096, 32, 8, 128), (64, 2048, 32, 8, 128),
              (256, 512, 32, 8, 128), (32, 1024, 16, 16, 64)]
    prefill = [(1, 4096, 4096, 32, 8, 128), (4, 1024, 1024, 32, 8, 128),
               (8, 512, 2048, 32, 8, 128), (16, 256, 256, 16, 16, 64)]
    rotary = [(16384, 32, 128), (4096, 8, 64)]
    if args.quick:
        decode, prefill, rotary = decode[:3], prefill[:3], rotary[:1]
    bench_decode(decode, torch.bfloat16, copy_gbs, results)
    bench_prefill(prefill, torch.bfloat16, results)
    bench_rotary(rotary, torch.bfloat16, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
