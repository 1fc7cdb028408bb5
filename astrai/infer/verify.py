"""`astrai kernels --verify`: every accelerated path of this machine against its reference,
on tiny inputs, in one table.

    for check in verify_all(): print(check.name, check.status, check.detail)

* the CPU decode kernels' ops (fp32 and int8 products, RMSNorm, paged decode attention)
  against their torch references (astrai/kernels/reference.py);
* each decode path the engine may choose (native, static; graphs on CUDA) against the eager
  step, through the same first-step check an engine runs (astrai/infer/decode_path.py);
* the CUDA attention backends (cuda, flash) against torch_native, through the check an
  automatic chain runs (astrai/infer/backends/registry.py).

Status: "ok", "FAILED" (the path would be switched off in an engine: the detail says why),
or "n/a" (not available here, and why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from astrai.infer.backends.base import worst_row_similarity
from astrai.infer.backends.registry import BackendChain, load_backend
from astrai.infer.config import CacheConfig
from astrai.infer.params import SamplingParams
from astrai.kernels.cpu_linear import cpu_decode_kernels
from astrai.kernels.reference import gemv_q8_ref, paged_decode_ref
from astrai.model import build_model, get_preset
from astrai.model.norm import rms_norm
from astrai.model.quant import quantize_rows


class Check(NamedTuple):
    name: str
    status: str
    """ok | FAILED | n/a"""
    detail: str = ""


def _similar(name: str, got: torch.Tensor, want: torch.Tensor) -> Check:
    worst = worst_row_similarity(got.float(), want.float())
    ok = worst >= 0.999
    return Check(name, "ok" if ok else "FAILED", f"worst row cosine {worst:.6f}")


def cpu_op_checks() -> list[Check]:
    """The CPU decode kernels' ops against their references."""
    k = cpu_decode_kernels()
    if k is None:
        return [Check("CPU decode kernels", "n/a", "not available here (astrai kernels)")]
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 200, generator=g), torch.randn(70, 200, generator=g)
    q, s = quantize_rows(w)
    nw = torch.rand(200, generator=g) + 0.5
    S, H, K, D = 40, 4, 2, 16
    kb, vb = torch.randn(S, K, D, generator=g), torch.randn(S, K, D, generator=g)
    table = torch.randperm(S, generator=g)[:32].view(2, 16).to(torch.int32)
    args = (torch.randn(2, H, D, generator=g), kb, vb, table, torch.tensor([1, 0]),
            torch.tensor([9, 16], dtype=torch.int32), D ** -0.5)
    checks = [("fp32 product", lambda: k.float_gemv(x, w, None), lambda: x @ w.T),
              ("rms_norm", lambda: k.rms_norm(x, nw, 1e-5), lambda: rms_norm(x, nw, 1e-5)),
              ("paged decode attention", lambda: k.paged_decode(*args),
               lambda: paged_decode_ref(*args))]
    if k.int8_quantized:
        checks.append(("int8 product (q8 x q8)", lambda: k.int8_gemv(x, q, s, None),
                       lambda: gemv_q8_ref(x, q, s)))
    return [_run(f"CPU {name} ({k.name})", got, want) for name, got, want in checks]


def _run(name: str, got: Callable, want: Callable) -> Check:
    try:
        return _similar(name, got(), want())
    except Exception as e:  # noqa: BLE001 - reported in the table
        return Check(name, "FAILED", f"{type(e).__name__}: {e}")


def _tiny_model(device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    cfg = get_preset("tiny", vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     head_dim=16, ffn_dim=128, max_seq_len=256, init_std=0.2)
    return build_model(cfg, seed=0).to(device, dtype).eval()


def path_checks(device: torch.device) -> list[Check]:
    """Each decode path the engine may choose on `device`, checked against the eager step."""
    from astrai.infer.engine import Engine

    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = _tiny_model(device, dtype)
    modes = ("native", "static") if device.type == "cpu" else ("graphs",)
    out = []
    for mode in modes:
        eng = Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4),
                     decode=mode)
        name = f"decode path {mode} ({device.type})"
        if eng.decode_path.name != mode:
            out.append(Check(name, "n/a", f"the engine runs {eng.decode_path.name} here"))
            continue
        eng.generate([[1, 2, 3, 4, 5], [9, 8, 7]], SamplingParams.greedy(4, ignore_eos=True))
        failure = eng.decode_path.failure
        out.append(Check(name, "FAILED" if failure else "ok",
                         failure or "first step equals the eager step's"))
    return out


def backend_checks(device: torch.device) -> list[Check]:
    """The accelerated attention backends against torch_native, on `device`."""
    from astrai.infer.backends.torch_native import TorchNativeBackend
    from astrai.infer.engine import Engine

    out = []
    model = None
    for name in ("cuda", "flash"):
        backend, why = load_backend(name)
        if backend is None or device.type != "cuda":
            out.append(Check(f"attention backend {name}", "n/a", why or "no CUDA device"))
            continue
        model = model or _tiny_model(device, torch.float16)
        chain = BackendChain([backend, TorchNativeBackend()])
        eng = Engine(model, None, CacheConfig(page_size=4, max_kv_tokens=512, max_requests=4),
                     chain)
        eng.generate([[1, 2, 3, 4, 5], [9, 8, 7]], SamplingParams.greedy(4, ignore_eos=True))
        why = chain.dropped.get(name)
        out.append(Check(f"attention backend {name}", "FAILED" if why else "ok",
                         why or f"{len(chain.checked)} calls equal torch_native's"))
    return out


def verify_all() -> list[Check]:
    """Every check this machine can run (the module docstring)."""
    checks = cpu_op_checks() + path_checks(torch.device("cpu"))
    cuda = torch.device("cuda") if torch.cuda.is_available() else None
    if cuda is None:
        checks.append(Check("decode path graphs (cuda)", "n/a", "no CUDA device"))
    else:
        checks += path_checks(cuda)
    return checks + backend_checks(cuda or torch.device("cpu"))
