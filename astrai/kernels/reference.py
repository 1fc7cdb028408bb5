"""Pure-torch references of every kernel in csrc/: the spec the kernels are tested against.

They run on any device and are what the custom ops in `astrai.kernels.ops` execute on the CPU.
Shapes use the cache contract shared with `astrai/infer/cache`: a layer's KV pool is
`k_buf`, `v_buf` [S, K, D] (S token slots, K kv heads, D head dim); `req_to_token` [R, M] int32
maps a request row and a position to a slot. Attention math runs in fp32 and the result is
rounded once to q's dtype; scale is passed in (1/sqrt(D) for the model).
"""

from __future__ import annotations

import torch

from astrai.model.rope import apply_rope


def paged_decode_ref(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                     req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per request against its first seq_lens[b] cached tokens.

    q [B, H, D]; request b reads slots req_to_token[req_pool_indices[b], :seq_lens[b]];
    query head h uses kv head h // (H / K) (GQA). Returns [B, H, D] in q's dtype.
    """
    B, H, D = q.shape
    K = k_buf.shape[1]
    if B == 0:
        return q.new_empty(B, H, D)
    lens = seq_lens.long()
    T = int(lens.max())
    pos = torch.arange(T, device=q.device)
    valid = pos[None, :] < lens[:, None]  # (B, T)
    slots = req_to_token[req_pool_indices.long(), :T].long()  # (B, T)
    slots = torch.where(valid, slots, torch.zeros_like(slots))  # entries past the length are junk
    k = k_buf[slots].float()  # (B, T, K, D)
    v = v_buf[slots].float()
    qg = q.float().view(B, K, H // K, D)  # (B, K, G, D)
    scores = torch.einsum("bkgd,btkd->bkgt", qg, k) * scale  # (B, K, G, T)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1)
    out = torch.einsum("bkgt,btkd->bkgd", probs, v)  # (B, K, G, D)
    return out.reshape(B, H, D).to(q.dtype)


def paged_prefill_ref(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                      qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                      scale: float, causal: bool = True) -> torch.Tensor:
    """Ragged attention of a batch of query runs against their requests' cached K/V.

    q [N, H, D] holds request b's queries at rows qo_indptr[b]:qo_indptr[b+1]; its keys are the
    slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] in position order (prefix first, the new
    tokens last). Query i of request b sits at position kv_len - qo_len + i and, when causal,
    attends to key positions <= that. Returns [N, H, D] in q's dtype.
    """
    _, H, D = q.shape
    K = k_buf.shape[1]
    G = H // K
    out = torch.empty_like(q)
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if q_len == 0:
            continue
        slots = kv_indices[kv[b]:kv[b + 1]].long()
        qb = q[qo[b]:qo[b + 1]].float().view(q_len, K, G, D)  # (Tq, K, G, D)
        k = k_buf[slots].float()  # (Tk, K, D)
        v = v_buf[slots].float()
        scores = torch.einsum("qkgd,tkd->kgqt", qb, k) * scale  # (K, G, Tq, Tk)
        if causal:
            qpos = torch.arange(q_len, device=q.device) + (kv_len - q_len)
            kpos = torch.arange(kv_len, device=q.device)
            scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        ob = torch.einsum("kgqt,tkd->qkgd", probs, v)  # (Tq, K, G, D)
        out[qo[b]:qo[b + 1]] = ob.reshape(q_len, H, D).to(q.dtype)
    return out


def rotary_ref_(x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor,
                sin_table: torch.Tensor) -> None:
    """Rotate x [N, heads, D] in place by the rows `positions` [N] of the [max_len, D/2] tables.

    Exactly `astrai.model.rope.apply_rope` (rotate-half pairing, cos/sin rounded to x's dtype).
    """
    pos = positions.long()
    cos = cos_table[pos].unsqueeze(0)  # (1, N, D/2)
    sin = sin_table[pos].unsqueeze(0)
    x.copy_(apply_rope(x.unsqueeze(0), cos, sin).squeeze(0))


# -- CPU decode GEMVs (csrc/cpu/decode_gemv.cpp) ---------------------------------------------

def quantize_activations_ref(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 -> (xq [M, nb, block] int8-valued fp32, s [M, nb]): per block of
    `block` values (the last zero-padded), s = max|x| / 127 and xq = round(x · 127 / max|x|)
    (ties to even, computed in fp32), as gemv_q8 quantizes its activations."""
    M, K = x.shape
    nb = -(-K // block)
    xp = x.new_zeros(M, nb * block)
    xp[:, :K] = x
    xb = xp.view(M, nb, block)
    amax = xb.abs().amax(-1, keepdim=True)  # (M, nb, 1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(xb * inv), (amax / 127.0).squeeze(-1)


def gemv_q8_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None, block: int = 128) -> torch.Tensor:
    """x [M, K] · (scale · q)ᵀ (+ bias) with x quantized per block (quantize_activations_ref):
    the int dots exactly (float64), each block's times its scale, then the row scale."""
    xq, s = quantize_activations_ref(x.float(), block)  # (M, nb, B), (M, nb)
    N, K = q.shape
    qp = torch.zeros(N, xq.shape[1] * block, dtype=torch.float64)
    qp[:, :K] = q.double()
    dots = torch.einsum("mbk,nbk->mnb", xq.double(), qp.view(N, -1, block))  # (M, N, nb)
    out = (dots * s.double()[:, None, :]).sum(-1) * scale.double()
    if bias is not None:
        out = out + bias.double()
    return out.float()
