"""Load the built kernels (ctypes) and launch them on torch tensors.

`get_library()` finds the library: ASTRAI_KERNELS_LIB (a prebuilt .so), else the cached build
for the requested targets, else (CUDA present, ASTRAI_BUILD_KERNELS not "0") builds it now. The
launch functions take the library as an argument so the CPU tests can hand them the host
emulation of the same sources (`build.build_host_emulation`) with CPU tensors.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
from pathlib import Path

import torch

from astrai.kernels import build as _build

log = logging.getLogger("astrai.kernels")

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
"""Element-type codes of csrc/common.cuh."""
HEAD_DIMS = (32, 64, 128)
"""Head dims the attention kernels are instantiated for."""
DECODE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PREFILL_DTYPES = (torch.float16, torch.bfloat16)  # tensor cores: no fp32 instantiation

_P, _I, _I64, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "astrai_rotary": [_P, _I, _P, _P, _P, _I64, _I, _I, _I64, _I64, _I64, _P],
    "astrai_paged_decode": [_P, _P, _P, _I, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I,
                            _I64, _I64, _I64, _I64, _I64, _F, _P],
    "astrai_paged_prefill": [_P, _P, _P, _I, _P, _P, _P, _P, _I, _I, _I, _I, _I,
                             _I64, _I64, _I64, _I64, _F, _I, _P],
}
_SIGNATURES["astrai_paged_prefill_mma"] = _SIGNATURES["astrai_paged_prefill"]
PREFILL_VARIANTS = ("wmma", "mma")
"""Prefill kernels: "wmma" (csrc/paged_prefill.cu, S/P through shared memory) and "mma"
(csrc/paged_prefill_mma.cu, PTX mma.sync with S/P/O in registers). ASTRAI_PREFILL_KERNEL
picks one; the default is "wmma"."""


class KernelUnavailable(RuntimeError):
    """The CUDA kernels cannot be used here; the message says why."""


@functools.cache
def load_library(path: str) -> ctypes.CDLL:
    """Open a built (or emulated) library and declare its launchers' signatures."""
    lib = ctypes.CDLL(path)
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.astrai_error_string.argtypes, lib.astrai_error_string.restype = [_I], ctypes.c_char_p
    return lib


@functools.lru_cache(maxsize=1)
def _resolve_library() -> tuple[str | None, str]:
    # Memoized, failures too: a broken build is reported once, not retried on every call.
    env = os.environ.get("ASTRAI_KERNELS_LIB")
    if env:
        return (env, "") if Path(env).is_file() else (None, f"ASTRAI_KERNELS_LIB={env} not found")
    nvcc = _build.find_nvcc()
    if nvcc is None:
        return None, "nvcc not found (install the CUDA toolkit or set ASTRAI_KERNELS_LIB)"
    try:
        path = _build.library_path(nvcc=nvcc)
    except ValueError as e:
        return None, str(e)
    if path is not None and path.is_file():
        return str(path), ""
    if os.environ.get("ASTRAI_BUILD_KERNELS", "1") == "0":
        return None, "not built and ASTRAI_BUILD_KERNELS=0 (run `astrai kernels --build`)"
    if not torch.cuda.is_available():
        return None, "not built, and no CUDA device to build for just in time"
    log.info("building CUDA kernels (first use; cached afterwards)")
    try:
        return str(_build.build(nvcc=nvcc).path), ""
    except _build.KernelBuildError as e:
        return None, f"build failed: {e}"


def get_library() -> ctypes.CDLL:
    """The kernels for this process; raises KernelUnavailable with the reason."""
    path, why = _resolve_library()
    if path is None:
        raise KernelUnavailable(why)
    try:
        return load_library(path)
    except OSError as e:
        raise KernelUnavailable(f"cannot load {path}: {e}") from e


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"astrai {what} kernel: {lib.astrai_error_string(code).decode()}")


def _stream(t: torch.Tensor) -> int | None:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _aligned(t: torch.Tensor) -> bool:
    """Last dim contiguous, 16-byte aligned base and strides (for 16-byte vector loads)."""
    vec = 16 // t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(t.stride(i) % vec == 0 for i in range(t.dim() - 1)))


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def decode_supported(q: torch.Tensor, k_buf: torch.Tensor) -> str | None:
    """None when paged_decode's kernel serves these shapes/dtypes, else why not."""
    if q.is_cuda and _capability(q.device.index or 0) < (8, 0):
        major, minor = _capability(q.device.index or 0)
        return f"GPU sm_{major}{minor} (the kernels need sm_80 or newer)"
    if q.dtype not in DECODE_DTYPES:
        return f"dtype {q.dtype} (kernel: fp16, bf16, fp32)"
    if k_buf.dtype != q.dtype:
        return f"cache dtype {k_buf.dtype} != query dtype {q.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} (kernel: 32, 64, 128)"
    if q.shape[1] % k_buf.shape[1]:
        return f"{q.shape[1]} query heads not a multiple of {k_buf.shape[1]} kv heads"
    if not _aligned(k_buf):
        return "KV pool rows are not contiguous and 16-byte aligned"
    return None


def prefill_supported(q: torch.Tensor, k_buf: torch.Tensor) -> str | None:
    """None when paged_prefill's kernel serves these shapes/dtypes, else why not."""
    if q.dtype not in PREFILL_DTYPES:
        return f"dtype {q.dtype} (kernel: fp16, bf16)"
    return decode_supported(q, k_buf)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_splits(B: int, H: int, K: int, max_context: int, sm_count: int) -> int:
    """How many pieces to cut each sequence into so the grid fills the GPU a few times over."""
    group = H // K
    gm = 1 if group == 1 else 2 if group == 2 else 4 if group <= 4 else 8
    blocks = B * K * math.ceil(group / gm)
    if blocks >= 2 * sm_count:
        return 1
    # ~4 blocks per multiprocessor keep enough K/V loads in flight to near the copy bandwidth
    return max(1, min(math.ceil(4 * sm_count / max(blocks, 1)), max_context // 64, 64))


def launch_paged_decode(lib: ctypes.CDLL, q: torch.Tensor, k_buf: torch.Tensor,
                        v_buf: torch.Tensor, req_to_token: torch.Tensor,
                        req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                        num_splits: int = 0) -> torch.Tensor:
    """Run csrc/paged_decode.cu; shapes as in `reference.paged_decode_ref`."""
    B, H, D = q.shape
    K = k_buf.shape[1]
    if not _aligned(q):
        q = q.contiguous()
    if not (_aligned(k_buf) and _aligned(v_buf) and k_buf.stride() == v_buf.stride()):
        raise ValueError("k_buf/v_buf must share strides with a contiguous, 16-byte aligned last dim")
    r2t = req_to_token if req_to_token.stride(-1) == 1 else req_to_token.contiguous()
    rpi = req_pool_indices.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    if num_splits <= 0:
        sms = _sm_count(q.device.index or 0) if q.is_cuda else 1
        num_splits = decode_splits(B, H, K, r2t.shape[1], sms)
    out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    part_o = part_lse = None
    if num_splits > 1:
        part_o = torch.empty((B, H, num_splits, D), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
    code = lib.astrai_paged_decode(
        _ptr(q), _ptr(k_buf), _ptr(v_buf), DTYPE_CODES[q.dtype], _ptr(r2t), _ptr(rpi),
        _ptr(lens), _ptr(out), _ptr(part_o), _ptr(part_lse), B, H, K, D, num_splits,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), r2t.stride(0), scale,
        _stream(q))
    _check(lib, code, "paged_decode")
    return out


def prefill_variant() -> str:
    """The prefill kernel ASTRAI_PREFILL_KERNEL names (default "wmma")."""
    v = os.environ.get("ASTRAI_PREFILL_KERNEL", "wmma").strip() or "wmma"
    if v not in PREFILL_VARIANTS:
        raise ValueError(f"ASTRAI_PREFILL_KERNEL={v!r}: use one of {', '.join(PREFILL_VARIANTS)}")
    return v


def launch_paged_prefill(lib: ctypes.CDLL, q: torch.Tensor, k_buf: torch.Tensor,
                         v_buf: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                         kv_indices: torch.Tensor, scale: float, causal: bool = True,
                         variant: str | None = None) -> torch.Tensor:
    """Run a prefill kernel (`prefill_variant()` unless `variant` is given); shapes as in
    `reference.paged_prefill_ref`."""
    N, H, D = q.shape
    K = k_buf.shape[1]
    if not _aligned(q):
        q = q.contiguous()
    if not (_aligned(k_buf) and _aligned(v_buf) and k_buf.stride() == v_buf.stride()):
        raise ValueError("k_buf/v_buf must share strides with a contiguous, 16-byte aligned last dim")
    qo = qo_indptr.to(torch.int32).contiguous()
    kvp = kv_indptr.to(torch.int32).contiguous()
    kvi = kv_indices.to(torch.int32).contiguous()
    out = torch.empty((N, H, D), dtype=q.dtype, device=q.device)
    fn = lib.astrai_paged_prefill_mma if (variant or prefill_variant()) == "mma" else (
        lib.astrai_paged_prefill)
    code = fn(
        _ptr(q), _ptr(k_buf), _ptr(v_buf), DTYPE_CODES[q.dtype], _ptr(qo), _ptr(kvp), _ptr(kvi),
        _ptr(out), qo.numel() - 1, N, H, K, D, q.stride(0), q.stride(1), k_buf.stride(0),
        k_buf.stride(1), scale, int(causal), _stream(q))
    _check(lib, code, "paged_prefill")
    return out


def launch_rotary_(lib: ctypes.CDLL, x: torch.Tensor, positions: torch.Tensor,
                   cos_table: torch.Tensor, sin_table: torch.Tensor) -> None:
    """Run csrc/rotary.cu in place on x [N, heads, D]."""
    N, heads, D = x.shape
    if x.stride(-1) != 1:
        raise ValueError("rotary_: x's last dim must be contiguous")
    pos = positions.to(torch.int64).contiguous()
    cos = cos_table.to(torch.float32).contiguous()
    sin = sin_table.to(torch.float32).contiguous()
    code = lib.astrai_rotary(_ptr(x), DTYPE_CODES[x.dtype], _ptr(pos), _ptr(cos), _ptr(sin), N,
                             heads, D, x.stride(0), x.stride(1), cos.stride(0), _stream(x))
    _check(lib, code, "rotary")
