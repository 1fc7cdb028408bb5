"""Random paged-attention problems shared by the kernel tests (CPU, emulation, GPU).

Slots are scattered (a random permutation of the pool), request rows are permuted and
req_to_token holds junk past each length, so a kernel that reads the wrong slot, row or
position cannot pass by luck.
"""

from __future__ import annotations

import math

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere fails (returns inf)."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def decode_case(lens: list[int], H: int, K: int, D: int, dtype=torch.float32, device="cpu",
                seed: int = 0, extra_rows: int = 2, context: int | None = None):
    """(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens) for decode."""
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    M = context or max(lens) + 3
    R = B + extra_rows
    S = R * M + 7
    k_buf = torch.randn(S, K, D, generator=g).to(dtype)
    v_buf = torch.randn(S, K, D, generator=g).to(dtype)
    req_to_token = torch.randperm(S, generator=g)[: R * M].view(R, M).to(torch.int32)
    rows = torch.randperm(R, generator=g)[:B]
    q = torch.randn(B, H, D, generator=g).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    t = (q, k_buf, v_buf, req_to_token, rows, seq_lens)
    return tuple(x.to(device) for x in t)


def prefill_case(q_lens: list[int], kv_lens: list[int], H: int, K: int, D: int,
                 dtype=torch.float32, device="cpu", seed: int = 0):
    """(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices) for ragged prefill; request b has
    kv_lens[b] - q_lens[b] cached tokens before its q_lens[b] new ones."""
    g = torch.Generator().manual_seed(seed)
    nnz = sum(kv_lens)
    S = nnz + 11
    k_buf = torch.randn(S, K, D, generator=g).to(dtype)
    v_buf = torch.randn(S, K, D, generator=g).to(dtype)
    kv_indices = torch.randperm(S, generator=g)[:nnz].to(torch.int32)
    qo_indptr = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), H, D, generator=g).to(dtype)
    t = (q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices)
    return tuple(x.to(device) for x in t)


def naive_decode(q, k_buf, v_buf, req_to_token, rows, seq_lens, scale):
    """Loops over requests and heads, float64."""
    B, H, D = q.shape
    K = k_buf.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float64)
    for b in range(B):
        slots = [int(req_to_token[int(rows[b]), t]) for t in range(int(seq_lens[b]))]
        for h in range(H):
            kh = h // (H // K)
            keys = torch.stack([k_buf[s, kh].double() for s in slots])  # (T, D)
            vals = torch.stack([v_buf[s, kh].double() for s in slots])
            w = torch.softmax(keys @ q[b, h].double() * scale, dim=0)
            out[b, h] = w @ vals
    return out


def naive_prefill(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, scale, causal=True):
    """Loops over requests, query rows and heads, float64."""
    N, H, D = q.shape
    K = k_buf.shape[1]
    out = torch.empty(N, H, D, dtype=torch.float64)
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        slots = kv_indices[k0:k1].long()
        for i in range(q1 - q0):
            pos = (k1 - k0) - (q1 - q0) + i
            n_vis = pos + 1 if causal else k1 - k0
            for h in range(H):
                kh = h // (H // K)
                keys = k_buf[slots[:n_vis], kh].double()  # (n_vis, D)
                vals = v_buf[slots[:n_vis], kh].double()
                w = torch.softmax(keys @ q[q0 + i, h].double() * scale, dim=0)
                out[q0 + i, h] = w @ vals
    return out


def naive_rotary(x, positions, cos_table, sin_table):
    """Rotate-half as complex multiplication: (x_i + j x_{i+D/2}) * (cos + j sin), float64."""
    N, heads, D = x.shape
    half = D // 2
    out = torch.empty(N, heads, D, dtype=torch.float64)
    for n in range(N):
        c = cos_table[int(positions[n])].double()
        s = sin_table[int(positions[n])].double()
        z = torch.complex(x[n, :, :half].double(), x[n, :, half:].double()) * torch.complex(c, s)
        out[n, :, :half], out[n, :, half:] = z.real, z.imag
    return out
