"""The kernels as torch custom ops (`torch.ops.astrai.*`), traceable by torch.compile.

On CUDA tensors an op runs the csrc kernel when it serves the dtype/head dim (see
`library.decode_supported` / `prefill_supported`) and the pure-torch reference otherwise; on
the CPU it runs the reference (an engine's CPU steps reach astrai's CPU decode kernels
through their ForwardContext instead, astrai/model/fast_path.py). Each op has a fake (meta) implementation for tracing, and
`torch.library.opcheck` exercises all of that on the CPU in CI.
"""

from __future__ import annotations

import torch

from astrai.kernels import library as lib
from astrai.kernels.reference import paged_decode_ref, paged_prefill_ref, rotary_ref_

Tensor = torch.Tensor


@torch.library.custom_op("astrai::paged_decode", mutates_args=(), device_types="cuda")
def paged_decode(q: Tensor, k_buf: Tensor, v_buf: Tensor, req_to_token: Tensor,
                 req_pool_indices: Tensor, seq_lens: Tensor, scale: float,
                 num_splits: int = 0) -> Tensor:
    """Decode attention: q [B, H, D] against each request's cached K/V -> [B, H, D].

    num_splits: pieces per sequence for split-KV (0 = chosen from the batch and the GPU).
    """
    if lib.decode_supported(q, k_buf) is not None:
        return paged_decode_ref(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale)
    with torch.cuda.device(q.device):
        return lib.launch_paged_decode(lib.get_library(), q, k_buf, v_buf, req_to_token,
                                       req_pool_indices, seq_lens, scale, num_splits)


@paged_decode.register_kernel("cpu")
def _paged_decode_cpu(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale,
                      num_splits=0):
    return paged_decode_ref(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale)


@paged_decode.register_fake
def _paged_decode_fake(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale,
                       num_splits=0):
    return q.new_empty(q.shape)


@torch.library.custom_op("astrai::paged_prefill", mutates_args=(), device_types="cuda")
def paged_prefill(q: Tensor, k_buf: Tensor, v_buf: Tensor, qo_indptr: Tensor, kv_indptr: Tensor,
                  kv_indices: Tensor, scale: float, causal: bool = True) -> Tensor:
    """Ragged prefill attention: q [N, H, D] against the requests' cached K/V -> [N, H, D]."""
    if lib.prefill_supported(q, k_buf) is not None:
        return paged_prefill_ref(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, scale, causal)
    with torch.cuda.device(q.device):
        return lib.launch_paged_prefill(lib.get_library(), q, k_buf, v_buf, qo_indptr, kv_indptr,
                                        kv_indices, scale, causal)


@paged_prefill.register_kernel("cpu")
def _paged_prefill_cpu(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, scale, causal=True):
    return paged_prefill_ref(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, scale, causal)


@paged_prefill.register_fake
def _paged_prefill_fake(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, scale, causal=True):
    return q.new_empty(q.shape)


@torch.library.custom_op("astrai::rotary_", mutates_args={"x"}, device_types="cuda")
def rotary_(x: Tensor, positions: Tensor, cos_table: Tensor, sin_table: Tensor) -> None:
    """Rotate x [N, heads, D] in place (rotate-half; tables [max_len, D/2] fp32)."""
    if x.dtype not in lib.DTYPE_CODES or x.shape[-1] % 2 or x.stride(-1) != 1:
        rotary_ref_(x, positions, cos_table, sin_table)
        return
    with torch.cuda.device(x.device):
        lib.launch_rotary_(lib.get_library(), x, positions, cos_table, sin_table)


@rotary_.register_kernel("cpu")
def _rotary_cpu(x, positions, cos_table, sin_table):
    rotary_ref_(x, positions, cos_table, sin_table)


@rotary_.register_fake
def _rotary_fake(x, positions, cos_table, sin_table):
    return None
